"""Generation actors on Ray: a pool that replaces dead actors and never waits forever.

Every actor is created with ``max_restarts=0`` and ``max_task_retries=0``: Ray never
restarts or resends anything behind our back. The pool judges liveness itself, from task
results, the controller's attempt deadline and pings with their own timeout:

- an attempt whose actor died (``RayActorError``: ``ray.kill``, a SIGKILLed process, a
  lost node), whose deadline passed (the controller cancels it), or whose actor misses a
  ping gets its actor *declared dead*: killed (``no_restart``), its writer id fenced on
  every data shard, every attempt in flight on it ended as an ``AttemptFailure``
  (``actor_died``: the controller abandons them and redispatches the siblings, under its
  round budget, with new rollout ids), and a replacement started;
- an actor takes work only while it holds the current weight version (pushed once per
  version through the object store);
- when no live actor is left and no replacement starts (``actor_start_timeout_s``, or the
  ``max_replacements`` budget is spent), every waiting and later attempt raises
  :class:`~rollout_recovery.errors.ActorPoolExhaustedError`, which stops the run.

Data shards are pinged by the same loop and restarted on their file when dead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import uuid
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from .._lifecycle import AsyncResource
from .._workers import Worker, WorkerHealth, WorkerPool
from ..capture import CaptureWriter, StagedPrefix
from ..errors import ActorPoolExhaustedError, GenerationError
from ..policy import PolicySnapshot
from ..rollout import AttemptFailure, AttemptRequest, AttemptResult, FailureReason
from ._sharded_plane import RayShardedDataPlane
from ._worker import GenerationWorker, Params, WorkerSpec, snapshot_params

if TYPE_CHECKING:  # [ray] builds this pool (importing Ray only then): its type, for the checker
    from ._config import RayConfig

__all__ = ["ActorStats", "RayGenerationBackend"]

# One remote class per process (Ray exports a class once per wrapper, not per actor). Ray
# never restarts an actor or resends a task behind the pool's back.
_REMOTE_WORKER: Any = ray.remote(max_restarts=0, max_task_retries=0)(GenerationWorker)


@dataclass(slots=True)
class ActorStats:
    attempts: int = 0
    failures: int = 0
    state: str = "starting"
    pid: int | None = None
    replaces: str | None = None


@dataclass(eq=False, slots=True, kw_only=True)
class _Actor(Worker):
    """A live actor in the pool (``healthy`` once it answered its first ping)."""

    handle: Any
    stats: ActorStats
    version: int | None = None


def _closed_error() -> GenerationError:
    return GenerationError(FailureReason.BACKEND_CLOSED, "the Ray backend is closed")


class RayGenerationBackend(AsyncResource):
    """A ``GenerationBackend[PolicySnapshot]`` on a pool of Ray actors.

    ``plane`` is the driver's :class:`RayShardedDataPlane` (workers stage into the same
    shards under their own writer ids). The ``capture`` an attempt is given is not used:
    the worker stages with its own writer on its node.
    """

    def __init__(
        self,
        config: RayConfig,
        *,
        spec: WorkerSpec,
        plane: RayShardedDataPlane,
        initial_weights: PolicySnapshot,
    ) -> None:
        """A pool placed and watched as ``[ray]`` (``config``) says, of workers built
        from ``spec``."""
        self._spec = spec
        self._config = config
        self._plane = plane
        version, params = snapshot_params(initial_weights)
        self._target: tuple[int, Params] = (version, params)
        self._target_ref: Any = None
        self._prefix = f"rr-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._names = itertools.count()
        # Live actors only: a dead one is removed (its stats retired) and replaced.
        self._actors: WorkerPool[_Actor] = WorkerPool(closed_error=_closed_error)
        self._retired: dict[str, ActorStats] = {}
        self._started = False
        self.replacements = 0
        self._events: deque[dict[str, Any]] = deque(maxlen=10_000)

    # -- telemetry -----------------------------------------------------------------------

    def _event(self, kind: str, **detail: Any) -> None:
        self._events.append({"event": kind, **detail})

    def drain_events(self) -> list[dict[str, Any]]:
        events = list(self._events)
        self._events.clear()
        return events

    def telemetry(self) -> dict[str, Any]:
        actors = {a.name: dataclasses.asdict(a.stats) for a in self._actors}
        actors.update({name: dataclasses.asdict(s) for name, s in self._retired.items()})
        return {
            "actors": actors,
            "replacements": self.replacements,
            "shard_restarts": self._plane.restarts,
        }

    def actor_load(self) -> dict[str, int]:
        """Attempts in flight on each live actor, by name."""
        return {
            name: a["in_flight"]
            for name, a in self._actors.snapshot().items()
            if a["health"] != WorkerHealth.DEAD  # being fenced: no longer counts
        }

    def live_actors(self) -> dict[str, Any]:
        """Handles of the live actors, by name (for tests and operators)."""
        return {a.name: a.handle for a in self._actors if a.health is not WorkerHealth.DEAD}

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the pool: ``actors_per_node`` actors per alive node, then the health loop.
        The controller awaits it before its first dispatch (``BackendStartup``), so actor
        starts count against no attempt's deadline; a first attempt also starts it."""
        if self._started:
            return
        self._started = True
        everything: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
        nodes = [n for n in everything if n.get("Alive")]
        count = self._config.actors_per_node * max(1, len(nodes))
        self._target_ref = ray.put(self._target)
        started = await asyncio.gather(
            *(self._start_actor(replaces=None) for _ in range(count)), return_exceptions=True
        )
        if not any(isinstance(s, _Actor) for s in started):
            exhausted = ActorPoolExhaustedError(f"no actor started: {started[0]!r}")
            self._actors.fail(exhausted)
            raise exhausted
        self._actors.spawn(self._health_loop(), "ray-health")

    async def _start_actor(self, *, replaces: str | None) -> _Actor:
        name = f"{self._prefix}-gen-{next(self._names)}"
        version = self._target[0]
        handle = _REMOTE_WORKER.options(
            name=name,
            num_cpus=self._config.cpus_per_actor,
            max_concurrency=self._config.per_actor_concurrency + 4,
            # Across nodes first: one node's loss takes as few actors as possible.
            scheduling_strategy="SPREAD",
        ).remote(self._spec, name, self._target_ref)
        actor = _Actor(
            name=name,
            capacity=self._config.per_actor_concurrency,
            handle=handle,
            stats=ActorStats(replaces=replaces),
        )
        try:
            async with asyncio.timeout(self._config.actor_start_timeout_s):
                actor.stats.pid = await handle.ping.remote()
        except (TimeoutError, RayActorError) as error:
            ray.kill(handle, no_restart=True)
            raise ActorPoolExhaustedError(f"actor {name} did not start: {error!r}") from error
        actor.version = version
        actor.stats.state = "live"
        actor.health = WorkerHealth.HEALTHY
        self._actors.add(actor)
        self._event("actor_started", actor=name, pid=actor.stats.pid, replaces=replaces)
        if actor.version != self._target[0]:  # weights moved on while it started
            self._push(actor)
        return actor

    async def aclose(self) -> None:
        await self._actors.aclose()
        for actor in self._actors:
            if actor.health is not WorkerHealth.DEAD:
                ray.kill(actor.handle, no_restart=True)
                # Marked so a second close kills nothing again (closing twice is a no-op).
                actor.health = WorkerHealth.DEAD

    # -- weights -------------------------------------------------------------------------

    def update_weights(self, version: int, weights: PolicySnapshot) -> None:
        """Push once through the object store; an actor takes work again once it holds it."""
        self._target = snapshot_params(weights)
        if not self._started:
            return
        self._target_ref = ray.put(self._target)
        for actor in self._actors:
            if actor.health is not WorkerHealth.DEAD:
                self._push(actor)

    def _push(self, actor: _Actor) -> None:
        async def push() -> None:
            try:
                # A top-level ObjectRef argument arrives resolved: one copy per node.
                loaded = await actor.handle.load_weights.remote(self._target_ref)
            except RayActorError:
                await self._declare_dead(actor, "actor_died")
                return
            actor.version = loaded
            self._actors.wake()  # it holds the current weights: it may take work now

        self._actors.spawn(push(), f"push-{actor.name}")

    # -- attempts ------------------------------------------------------------------------

    async def _acquire(self) -> _Actor:
        def timed_out() -> GenerationError:
            return GenerationError(
                FailureReason.NO_LIVE_ACTOR,
                f"no actor with the current weights for {self._config.no_actor_wait_s} s",
            )

        actor = await self._actors.acquire(
            wait_s=self._config.no_actor_wait_s,
            timed_out=timed_out,
            # Read at every wake-up, not once: a push while this attempt waits changes
            # which actors hold the current weights.
            eligible=lambda a: a.version == self._target[0],
        )
        actor.stats.attempts += 1
        return actor

    async def run_attempt(
        self,
        request: AttemptRequest,
        capture: CaptureWriter,
        prefix: StagedPrefix | None = None,
    ) -> AttemptResult | AttemptFailure:
        """One attempt on an actor; with ``prefix`` (read by the driver from the shards;
        the dead actor that staged it is fenced, its rows are not) the actor continues it."""
        await self.start()
        try:
            actor = await self._acquire()
        except GenerationError as error:  # no actor with the current weights; closed
            return AttemptFailure.from_error(request, error)
        try:
            ref = actor.handle.run_attempt.remote(request, prefix)
            settled = await _settled(ref)
            outcome = _across_the_boundary(request, actor.name, settled)
            if isinstance(outcome, AttemptFailure):
                actor.stats.failures += 1
            if isinstance(settled, RayActorError) and not isinstance(settled, RayTaskError):
                await self._declare_dead(actor, "actor_died")  # its own death, not a shard's
        except asyncio.CancelledError:
            # The controller's deadline: an actor that does not answer in time is
            # declared dead with everything it runs.
            actor.stats.failures += 1
            self._actors.spawn(self._declare_dead(actor, "deadline_missed"), f"dead-{actor.name}")
            raise
        finally:
            self._actors.release(actor)  # a slot is free: wakes an attempt waiting for one
        return outcome

    # -- deaths and replacements -----------------------------------------------------------

    async def _declare_dead(self, actor: _Actor, why: str) -> None:
        if self._actors.mark(actor, WorkerHealth.DEAD) is None:
            return  # declared dead already
        actor.stats.state = "dead"
        ray.kill(actor.handle, no_restart=True)
        try:
            # Fenced before anything of it is redispatched: a put it still had in flight
            # is refused from now on (one that landed earlier is an unreferenced orphan).
            await asyncio.to_thread(self._plane.fence, actor.name)
        finally:
            # Even if the fence failed: the actor is gone and its capacity is replaced.
            self._retired[actor.name] = actor.stats
            self._actors.remove(actor.name)
            self._event("actor_dead", actor=actor.name, why=why, pid=actor.stats.pid)
            if not self._actors.closed:
                self._actors.spawn(self._replace(actor.name), f"replace-{actor.name}")

    async def _replace(self, dead: str) -> None:
        while not self._actors.closed:
            if self.replacements >= self._config.max_replacements:
                detail = f"the replacement budget ({self._config.max_replacements}) is spent"
            else:
                self.replacements += 1
                try:
                    await self._start_actor(replaces=dead)
                    return
                except ActorPoolExhaustedError as error:
                    detail = error.detail
            if not self._actors.any_alive():
                self._actors.fail(ActorPoolExhaustedError(detail))
                self._event("actor_pool_exhausted", detail=detail)
                return
            if self.replacements >= self._config.max_replacements:
                return  # others still live: run on with fewer actors

    async def _health_loop(self) -> None:
        while not self._actors.closed:
            await asyncio.sleep(self._config.ping_interval_s)
            try:
                await self._health_round()
            except Exception as error:
                # One failed round (a fence that could not be written, a shard that would
                # not restart in time) must not end the checks for good: a later hang would
                # go unnoticed. The failure itself reaches the controller on its next call.
                self._event("health_check_failed", error=repr(error))

    async def _health_round(self) -> None:
        for actor in self._actors:
            if actor.health is WorkerHealth.DEAD:
                continue
            try:
                async with asyncio.timeout(self._config.ping_timeout_s):
                    await actor.handle.ping.remote()
            except (TimeoutError, RayActorError):
                await self._declare_dead(actor, "ping_failed")
        revived = await asyncio.to_thread(
            self._plane.revive_dead_shards, self._config.ping_timeout_s
        )
        for index in revived:
            self._event("shard_restarted", shard=index)


async def _settled(ref: Any) -> AttemptResult | AttemptFailure | RayTaskError | RayActorError:
    """What the actor's attempt came back as: its outcome, the exception it raised
    (``RayTaskError``), or the actor's death (``RayActorError``)."""
    try:
        outcome: AttemptResult | AttemptFailure = await ref
    except (RayTaskError, RayActorError) as error:
        return error
    return outcome


def _across_the_boundary(
    request: AttemptRequest,
    actor: str,
    settled: AttemptResult | AttemptFailure | RayTaskError | RayActorError,
) -> AttemptResult | AttemptFailure:
    """The one conversion of what crosses the process boundary into the driver's outcome.

    A failure is always stamped with the actor that ran it (inside an actor the simulated
    backend's one worker is ``worker-0`` in every actor; the detail keeps what it said).
    The actor's death is ``ACTOR_DIED``. An exception raised inside a live actor is an
    ``ACTOR_ERROR`` failure, not a stopped run: from the driver a bug in the actor cannot
    be told apart from a data shard that did not answer, and the sibling is retried within
    its round budget (the detail keeps the exception's type and message). A raised
    ``GenerationError`` keeps its reason.
    """
    if isinstance(settled, AttemptResult):
        return settled
    if isinstance(settled, AttemptFailure):
        return dataclasses.replace(settled, worker=actor)
    if not isinstance(settled, RayTaskError):
        reason, detail = FailureReason.ACTOR_DIED, str(settled)
    elif isinstance(settled.cause, GenerationError):
        failure = AttemptFailure.from_error(request, settled.cause)
        return dataclasses.replace(failure, worker=actor)
    else:
        # Raised in the actor, which lives. Tested before the actor's death because a
        # task that raised another actor's ``RayActorError`` (a data shard's) arrives as a
        # class deriving from both.
        cause = settled.cause
        reason, detail = FailureReason.ACTOR_ERROR, f"{type(cause).__name__}: {cause}"
    return AttemptFailure(
        rollout_id=request.rollout_id,
        generation_index=request.generation_index,
        reason=reason,
        detail=detail[:300],
        worker=actor,
    )
