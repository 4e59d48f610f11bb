"""One pool of workers for every backend: health, capacity, and who gets the next piece of work.

The HTTP backend's servers, the simulated backend's workers and the Ray backend's actors
are all workers here. A :class:`Worker` record carries what the pool judges (its health,
its capacity, the work in flight on it); each backend subclasses it with what is its own
(an HTTP server's weight version and failure streaks, a Ray actor's handle, a simulated
worker's current life) and keeps its own policy: when a worker changes health, which
ready worker is eligible (weight-version gating), which of them is preferred.

What the pool owns, once:

- the workers by name and their :class:`WorkerHealth`; only a ``healthy`` worker with a
  free slot is ever handed out (never a dead, quarantined, joining or suspect one);
- one condition every waiter waits on, woken by every change (a release, a health mark,
  a worker added or removed, :meth:`WorkerPool.wake` for a backend's own gates);
- one acquire loop with a deadline on the event loop's clock (``_clock.monotonic``, the
  one ``asyncio.timeout`` reads, so a virtual clock controls it);
- a terminal failure (:meth:`WorkerPool.fail`) every waiter and later acquire raises;
- the background tasks of the backend (probes, respawns, replacements), cancelled by
  :meth:`WorkerPool.aclose`, which also wakes every waiter with the pool's closed error;
- one telemetry shape, :meth:`WorkerPool.snapshot`.

The condition is a set of futures rather than an ``asyncio.Condition`` so that sync code
(a crash injected mid-call, a lease given back in a ``finally``) wakes waiters at once,
without a lock to take. Use a pool from one event loop.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypedDict, TypeVar

from ._clock import monotonic
from ._lifecycle import AsyncResource
from .errors import InvalidArgumentError

__all__ = ["Worker", "WorkerHealth", "WorkerPool", "WorkerSnapshot", "least_loaded"]


class WorkerHealth(enum.StrEnum):
    """Where a worker stands; the values appear in ``server_state`` events and telemetry."""

    JOINING = "joining"  # added, not yet vouched for: takes no work
    HEALTHY = "healthy"  # the only state that takes work
    SUSPECT = "suspect"  # failed lately: takes no work until it proves itself again
    DEAD = "dead"  # gone (or quarantined): takes no work until revived or replaced
    RECOVERING = "recovering"  # answers again; being refitted before it takes work


@dataclass(eq=False, slots=True, kw_only=True)
class Worker:
    """What the pool knows of one worker; backends subclass it with their own fields.

    ``capacity`` bounds the work in flight on it (None: unbounded); ``leases`` counts every
    piece of work it was ever handed.
    """

    name: str
    capacity: int | None = None
    health: WorkerHealth = WorkerHealth.JOINING
    in_flight: int = 0
    leases: int = 0

    @property
    def has_room(self) -> bool:
        return self.capacity is None or self.in_flight < self.capacity


class WorkerSnapshot(TypedDict):
    """One worker in :meth:`WorkerPool.snapshot` (JSON-ready)."""

    health: str
    in_flight: int
    capacity: int | None
    leases: int


W = TypeVar("W", bound=Worker)


def least_loaded(ready: Sequence[W]) -> W:
    """The default choice: fewest in flight, then fewest handed out so far."""
    return min(ready, key=lambda w: (w.in_flight, w.leases))


def _any(_: Worker) -> bool:
    return True


class WorkerPool(AsyncResource, Generic[W]):
    """Workers of type ``W`` by name; see the module docstring.

    ``closed_error`` makes the error an acquire raises once the pool is closed (each
    backend words its own).
    """

    def __init__(self, *, closed_error: Callable[[], BaseException]) -> None:
        self._workers: dict[str, W] = {}
        self._closed_error = closed_error
        self._waiters: set[asyncio.Future[None]] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failure: BaseException | None = None
        self._closed = False

    # -- workers ---------------------------------------------------------------------------

    def add(self, worker: W) -> W:
        """Track ``worker`` (its name must be new); waiters wake if it can take work."""
        if worker.name in self._workers:
            raise InvalidArgumentError(f"worker {worker.name!r} is already in the pool")
        if worker.capacity is not None and worker.capacity < 1:
            raise InvalidArgumentError(
                f"worker {worker.name!r} needs a capacity >= 1, got {worker.capacity}"
            )
        self._workers[worker.name] = worker
        self.wake()
        return worker

    def remove(self, name: str) -> W:
        """Stop tracking a worker (a replaced one); its leases may still be released."""
        worker = self._workers.pop(name)
        self.wake()
        return worker

    def __getitem__(self, name: str) -> W:
        return self._workers[name]

    def __iter__(self) -> Iterator[W]:
        return iter(list(self._workers.values()))

    def __len__(self) -> int:
        return len(self._workers)

    def mark(self, worker: W, health: WorkerHealth) -> WorkerHealth | None:
        """Set ``worker``'s health; the previous one if it changed (None: no change)."""
        previous = worker.health
        if previous is health:
            return None
        worker.health = health
        self.wake()
        return previous

    def any_alive(self) -> bool:
        """Whether any tracked worker is not dead (it may come back or be refitted)."""
        return any(w.health is not WorkerHealth.DEAD for w in self._workers.values())

    # -- the condition ---------------------------------------------------------------------

    def wake(self) -> None:
        """Wake every waiter to look again (a backend's own gate moved, e.g. a version)."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _changed(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await waiter
        finally:
            self._waiters.discard(waiter)

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds or the pool is closed (no deadline of its own)."""
        while not (predicate() or self._closed):
            await self._changed()

    # -- work ------------------------------------------------------------------------------

    async def acquire(
        self,
        *,
        wait_s: float | None,
        timed_out: Callable[[], BaseException] | None = None,
        eligible: Callable[[W], bool] = _any,
        choose: Callable[[Sequence[W]], W] = least_loaded,
    ) -> W:
        """A healthy worker with a free slot that is ``eligible`` (``choose`` picks among
        several), its slot taken.

        Waits on the condition for one; after ``wait_s`` seconds on the loop's clock
        (None: no limit) raises ``timed_out()``. Raises the pool's failure once
        :meth:`fail` was called, its closed error once it is closed.
        """
        deadline = None if wait_s is None else monotonic() + wait_s
        while True:
            if self._failure is not None:
                raise self._failure
            if self._closed:
                raise self._closed_error()
            ready = [
                w
                for w in self._workers.values()
                if w.health is WorkerHealth.HEALTHY and w.has_room and eligible(w)
            ]
            if ready:
                worker = choose(ready)
                worker.in_flight += 1
                worker.leases += 1
                return worker
            if deadline is None:
                await self._changed()
                continue
            remaining = deadline - monotonic()
            if remaining <= 0:
                if timed_out is None:
                    raise TimeoutError(f"no worker ready within {wait_s} s")
                raise timed_out()
            try:
                async with asyncio.timeout(remaining):
                    await self._changed()
            except TimeoutError:
                continue

    def release(self, worker: W) -> None:
        """Give back a slot taken by :meth:`acquire` (also of a worker removed since)."""
        if worker.in_flight < 1:
            raise InvalidArgumentError(f"worker {worker.name!r} has no work in flight")
        worker.in_flight -= 1
        self.wake()

    def fail(self, error: BaseException) -> None:
        """End the pool for good: every waiting and later acquire raises ``error``."""
        self._failure = error
        self.wake()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    # -- background tasks and lifecycle ----------------------------------------------------

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run a background task of the backend until it ends or the pool closes."""
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Cancel the background tasks and wake every waiter with the closed error."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.wake()

    # -- telemetry -------------------------------------------------------------------------

    def snapshot(self) -> dict[str, WorkerSnapshot]:
        """Every tracked worker's health and load, by name."""
        return {
            name: WorkerSnapshot(
                health=w.health.value,
                in_flight=w.in_flight,
                capacity=w.capacity,
                leases=w.leases,
            )
            for name, w in self._workers.items()
        }
