"""A simulated agent environment behind :class:`GenerationBackend`, with fault injection.

An attempt is one episode of the task (:class:`DigitTask`: ``thinking_calls`` thinking
calls, then the answer) on one simulated worker, run by :func:`run_episode` against the
worker's model client: each call waits a lognormal latency on the worker, samples from the
newest policy snapshot (the policy's own generation rule, the one ``rollout-recovery
serve`` answers with) and is staged through the attempt's :class:`CaptureWriter` before
the episode goes on. Every random choice of an attempt comes from a generator seeded by
``(seed, rollout_id)``, so an attempt's faults, latencies and tokens do not depend on how
attempts interleave (only worker placement and which snapshot is current do).

``on_weight_update="interrupt"`` spreads a call's latency over its tokens and samples each
token from the snapshot current when it is produced, so a weight update in flight switches
the rest of the call to the new weights; the call's extras then carry per-token
``weight_version_spans`` and its staged version is its last token's.

Faults (``[faults]``, :class:`FaultsConfig`) are injected by a decorator around the worker's client
(``_faults.py``): failed, hung and straggling attempts, uncaptured replies, tampered rows
and worker crashes, which fail every attempt in flight on that worker; the worker is then
down for ``worker_restart_s`` and new attempts go to other workers (or wait for one).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .._lifecycle import AsyncResource
from .._outcomes import FailureReason
from .._workers import Worker, WorkerHealth, WorkerPool
from ..capture import CaptureWriter, StagedPrefix
from ..dataplane import DataPlane
from ..errors import GenerationError, InvalidArgumentError
from ..policy import PolicySnapshot
from ._config import FaultsConfig, GenerationConfig
from ._episode import Completion, EpisodeTask, Sampling, run_episode
from ._faults import FAULT_NAMES, FaultInjectingClient, draw_faults
from ._protocol import AttemptFailure, AttemptRequest, AttemptResult

__all__ = ["SimulatedAgentBackend"]


class _Life:
    """One life of a worker: its crash ends every attempt admitted during it."""

    __slots__ = ("crashed",)

    def __init__(self) -> None:
        self.crashed = asyncio.Event()


@dataclass(eq=False, slots=True, kw_only=True)
class _Worker(Worker):
    """A simulated worker: up (``healthy``) or crashed (``dead``) until it restarts, with
    unbounded capacity."""

    index: int
    life: _Life = field(default_factory=_Life)


def _closed_error() -> GenerationError:
    return GenerationError(FailureReason.BACKEND_CLOSED, "the simulated backend is closed")


def _attempt_seed(seed: int, rollout_id: str) -> list[int]:
    digest = hashlib.sha256(rollout_id.encode("utf-8")).digest()
    return [seed, int.from_bytes(digest[:16], "little")]


class SimulatedAgentBackend(AsyncResource):
    """Implements ``GenerationBackend[PolicySnapshot]`` in process.

    ``data_plane`` must be the store the attempts' ``CaptureWriter`` writes to: the tamper
    fault rewrites a staged row behind the writer's back. ``stage_in_thread`` runs each
    ``stage_call`` in a worker thread, for a durable store whose fsync should not block
    the event loop. A backend's events belong to the first event loop that waits on them:
    use one backend per loop.
    """

    def __init__(
        self,
        generation: GenerationConfig,
        *,
        faults: FaultsConfig,
        episodes: EpisodeTask,
        seed: int,
        initial_weights: PolicySnapshot,
        data_plane: DataPlane,
        workers: int | None = None,
        stage_in_thread: bool = True,
    ) -> None:
        """The backend ``[generation]`` and ``[faults]`` describe, running ``episodes``
        (the digit task's, :class:`DigitTask`) from the job's ``seed``: the one builder of
        the job and of a Ray worker (which runs one worker: ``workers=1``)."""
        self._interrupt = generation.on_weight_update == "interrupt"
        self._task = episodes
        self._seed = seed
        self._latency = generation.call_latency_s
        self._jitter = generation.latency_jitter
        self._data_plane = data_plane
        self._stage_in_thread = stage_in_thread
        self._faults = faults
        self._snapshot = self._checked_snapshot(initial_weights.version, initial_weights)
        self._workers: WorkerPool[_Worker] = WorkerPool(closed_error=_closed_error)
        for index in range(generation.workers if workers is None else workers):
            self._workers.add(
                _Worker(name=f"worker-{index}", index=index, health=WorkerHealth.HEALTHY)
            )
        self._next_worker = 0
        self._crashes = 0
        self._fault_counts = dict.fromkeys(FAULT_NAMES, 0)

    # -- configuration and introspection -------------------------------------------------

    @staticmethod
    def _checked_snapshot(version: int, weights: PolicySnapshot) -> PolicySnapshot:
        if weights.version != version:
            raise InvalidArgumentError(
                f"weights are version {weights.version}, announced as {version}"
            )
        return weights

    @property
    def faults(self) -> FaultsConfig:
        return self._faults

    def set_faults(self, faults: FaultsConfig) -> None:
        """Change fault rates for attempts that start from now on (e.g. a fault schedule)."""
        self._faults = faults

    @property
    def weight_version(self) -> int:
        """The version of the snapshot new calls sample from."""
        return self._snapshot.version

    @property
    def worker_crashes(self) -> int:
        """How many worker crashes were injected so far."""
        return self._crashes

    @property
    def fault_counts(self) -> dict[str, int]:
        """Injected faults by name (``straggler``, ``worker_crash``, ``attempt_failed``,
        ``hang``, ``capture_failure``, ``tamper``); a copy."""
        return dict(self._fault_counts)

    def worker_status(self) -> dict[str, bool]:
        """Whether each worker is up, by name."""
        return {
            name: w["health"] == WorkerHealth.HEALTHY
            for name, w in self._workers.snapshot().items()
        }

    def worker_load(self) -> dict[str, int]:
        """Attempts in flight on each worker, by name (crashed ones count until they exit)."""
        return {name: w["in_flight"] for name, w in self._workers.snapshot().items()}

    def update_weights(self, version: int, weights: PolicySnapshot) -> None:
        """Weight sync: every call that starts after this samples from ``weights``.

        Calls already sampled keep their version; the second call of an attempt in flight
        may use a newer snapshot than its first, as with in-flight updates of a real
        engine. Each call's staged ``weight_version`` is the snapshot it sampled from.
        With ``on_weight_update="interrupt"`` a call in flight generates its remaining
        tokens from ``weights`` too (see :class:`_WorkerSession`).
        """
        self._snapshot = self._checked_snapshot(version, weights)

    # -- workers --------------------------------------------------------------------------

    async def _acquire_worker(self) -> _Worker:
        """The least loaded worker that is up (round robin among equals); waits if none."""
        count = len(self._workers)

        def round_robin(up: Sequence[_Worker]) -> _Worker:
            return min(up, key=lambda w: (w.in_flight, (w.index - self._next_worker) % count))

        worker = await self._workers.acquire(wait_s=None, choose=round_robin)
        self._next_worker = (worker.index + 1) % count
        return worker

    def _crash(self, worker: _Worker) -> None:
        """End the worker's current life; a restart task brings up a new one."""
        self._crashes += 1
        self._fault_counts["worker_crash"] += 1
        self._workers.mark(worker, WorkerHealth.DEAD)
        worker.life.crashed.set()
        self._workers.spawn(self._restart(worker), f"restart-{worker.name}")

    async def _restart(self, worker: _Worker) -> None:
        await asyncio.sleep(self._faults.worker_restart_s)
        worker.life = _Life()
        self._workers.mark(worker, WorkerHealth.HEALTHY)

    @staticmethod
    def _crashed_error(worker: _Worker) -> GenerationError:
        return GenerationError(
            FailureReason.WORKER_CRASHED, f"{worker.name} crashed mid-episode", worker=worker.name
        )

    async def _wait_on(self, worker: _Worker, life: _Life, seconds: float | None) -> None:
        """Sleep ``seconds`` (forever for None) unless the worker's life ends first.

        Only this wait's own timeout becomes a normal return; an outer cancellation (the
        controller's deadline) propagates as ``CancelledError``, which asyncio.timeout
        tells apart from its own expiry through the task's cancel count.
        """
        if life.crashed.is_set():
            raise self._crashed_error(worker)
        if seconds is not None and seconds <= 0:
            # A zero wait only yields once: no timer, no cancellation (which costs more
            # than the episode's own work when calls take no time); a crash during the
            # yield is still seen.
            await asyncio.sleep(0)
            if life.crashed.is_set():
                raise self._crashed_error(worker)
            return
        try:
            async with asyncio.timeout(seconds):
                await life.crashed.wait()
        except TimeoutError:
            return
        raise self._crashed_error(worker)

    # -- one attempt ----------------------------------------------------------------------

    async def run_attempt(
        self,
        request: AttemptRequest,
        capture: CaptureWriter,
        prefix: StagedPrefix | None = None,
    ) -> AttemptResult | AttemptFailure:
        """Run one episode on a worker, continuing ``prefix``'s staged calls if given; see
        ``_faults.py`` for the faults."""
        if self._workers.closed:
            return AttemptFailure.closed(request, "simulated")
        rng = np.random.default_rng(_attempt_seed(self._seed, request.rollout_id))
        faults = draw_faults(rng, self._faults)
        if "straggler" in faults:
            self._fault_counts["straggler"] += 1
        try:
            worker = await self._acquire_worker()
        except GenerationError as error:  # closed while this attempt waited for a worker
            return AttemptFailure.from_error(request, error)
        session = _WorkerSession(self, worker, rng)
        client = FaultInjectingClient(
            session,
            faults,
            straggler_factor=self._faults.straggler_factor,
            counts=self._fault_counts,
        )
        try:
            outcome = await run_episode(
                request,
                capture,
                task=self._task,
                client=client,
                prefix=prefix,
                stage_in_thread=self._stage_in_thread,
            )
            if isinstance(outcome, AttemptResult):
                # Crashed by another attempt while the last call staged: lost with it.
                await session.pause(0.0)
                client.after_episode(outcome, capture, self._data_plane)
        except GenerationError as error:
            outcome = AttemptFailure.from_error(request, error)
        finally:
            self._workers.release(worker)
        return outcome

    async def aclose(self) -> None:
        """Stop: cancel pending worker restarts and wake attempts waiting for a worker."""
        await self._workers.aclose()


class _WorkerSession:
    """The model client of one attempt on one simulated worker (a ``WorkerClient``)."""

    def __init__(
        self, backend: SimulatedAgentBackend, worker: _Worker, rng: np.random.Generator
    ) -> None:
        self._backend = backend
        self._worker = worker
        self._life = worker.life
        self._rng = rng
        self.last_latency_s = 0.0

    @property
    def worker(self) -> str:
        return self._worker.name

    async def pause(self, seconds: float | None) -> None:
        await self._backend._wait_on(self._worker, self._life, seconds)

    def crash(self) -> GenerationError:
        self._backend._crash(self._worker)
        return self._backend._crashed_error(self._worker)

    async def generate(
        self, prompt_ids: Sequence[int], *, call_id: str, sampling: Sampling
    ) -> Completion:
        backend = self._backend
        self.last_latency_s = backend._latency * math.exp(
            backend._jitter * float(self._rng.standard_normal())
        )
        if backend._interrupt:
            return await self._generate_by_token(prompt_ids, sampling)
        await self.pause(self.last_latency_s)
        snapshot = backend._snapshot  # the newest weights when the reply is sampled
        tokens, logprobs = snapshot.sample_continuation(prompt_ids, sampling.max_tokens, self._rng)
        return Completion(token_ids=tokens, logprobs=logprobs, weight_version=snapshot.version)

    async def _generate_by_token(self, prompt_ids: Sequence[int], sampling: Sampling) -> Completion:
        """The call's latency spread evenly over its tokens, each token sampled at the end
        of its share from the weights current then: an update in flight switches the rest
        of the call to the new weights (same draws, so without an update the tokens are
        those of the whole-call path). Per-token versions go into the extras."""
        backend = self._backend
        count = PolicySnapshot.continuation_length(prompt_ids, sampling.max_tokens)
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        for _ in range(count):
            await self.pause(self.last_latency_s / count)
            snapshot = backend._snapshot
            drawn = snapshot.sample_next(prompt_ids, tokens, self._rng)
            if drawn is None:  # pragma: no cover - count is the continuation's length
                break
            tokens.append(drawn[0])
            logprobs.append(drawn[1])
            versions.append(snapshot.version)
        return Completion(
            token_ids=tokens,
            logprobs=logprobs,
            # The newest weights it saw: a reuse policy then judges every token of it.
            weight_version=versions[-1],
            token_versions=versions,
        )
