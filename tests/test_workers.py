"""The generic worker pool (issue 16 item 3): capacity, health, waiters, deadlines, close.

Deadlines run on a :class:`VirtualClockLoop` (no wall-clock bound anywhere); the state
machine drives one pool through acquire / release / health marks / replacements / close and
checks after every step that no worker is over capacity, that only healthy workers were
handed out, and that no waiter sleeps while a worker could serve it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from rollout_recovery._clock import VirtualClockLoop, monotonic
from rollout_recovery._workers import Worker, WorkerHealth, WorkerPool
from rollout_recovery.errors import InvalidArgumentError

T = TypeVar("T")


class Closed(Exception):
    pass


class NoWorker(Exception):
    pass


def _pool() -> WorkerPool[Worker]:
    return WorkerPool(closed_error=lambda: Closed("the test pool is closed"))


def _healthy(name: str, capacity: int | None = 1) -> Worker:
    return Worker(name=name, capacity=capacity, health=WorkerHealth.HEALTHY)


def _run(main: Callable[[], Awaitable[T]], *, autojump: bool = True) -> T:
    loop = VirtualClockLoop(autojump=autojump)
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


async def _turns(count: int = 20) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def _bounded(pool: WorkerPool[Worker]) -> asyncio.Task[Worker]:
    """A waiter that fails (on the virtual clock) instead of hanging if never woken."""
    return asyncio.create_task(
        pool.acquire(wait_s=3600.0, timed_out=lambda: NoWorker("never woken"))
    )


def test_health_values_stay_those_of_the_server_events() -> None:
    # ``server_state`` events and the HTTP summary carry these strings.
    assert [h.value for h in WorkerHealth] == [
        "joining",
        "healthy",
        "suspect",
        "dead",
        "recovering",
    ]
    assert WorkerHealth.DEAD == "dead"


def test_only_healthy_workers_with_room_are_handed_out_least_loaded_first() -> None:
    async def main() -> list[str]:
        pool = _pool()
        for name, health in [
            ("joining", WorkerHealth.JOINING),
            ("suspect", WorkerHealth.SUSPECT),
            ("dead", WorkerHealth.DEAD),
            ("recovering", WorkerHealth.RECOVERING),
        ]:
            pool.add(Worker(name=name, capacity=5, health=health))
        pool.add(_healthy("a", 2))
        pool.add(_healthy("b", 1))
        got = [(await pool.acquire(wait_s=1.0)).name for _ in range(3)]
        with pytest.raises(TimeoutError, match=r"no worker ready within 1\.0 s"):
            await pool.acquire(wait_s=1.0)
        assert pool.snapshot()["a"] == {
            "health": "healthy",
            "in_flight": 2,
            "capacity": 2,
            "leases": 2,
        }
        await pool.aclose()
        return got

    assert _run(main) == ["a", "b", "a"]


def test_eligible_and_choose_are_the_backends_own_policy() -> None:
    async def main() -> list[str]:
        pool = _pool()
        for name in "abc":
            pool.add(_healthy(name, None))
        first = await pool.acquire(wait_s=None, eligible=lambda w: w.name != "a")
        second = await pool.acquire(
            wait_s=None, choose=lambda ready: max(ready, key=lambda w: w.name)
        )
        return [first.name, second.name]

    assert _run(main) == ["b", "c"]


def test_a_waiter_wakes_when_capacity_returns() -> None:
    async def main() -> str:
        pool = _pool()
        worker = pool.add(_healthy("a"))
        await pool.acquire(wait_s=None)
        waiter = _bounded(pool)
        await _turns()
        assert not waiter.done()
        pool.release(worker)
        got = await waiter
        assert got.in_flight == 1
        assert monotonic() == 0.0  # woken at once, not by its deadline's re-check
        return got.name

    assert _run(main) == "a"


def test_a_waiter_wakes_when_a_worker_turns_healthy_or_is_added() -> None:
    async def main() -> list[str]:
        pool = _pool()
        sick = pool.add(Worker(name="sick", capacity=1, health=WorkerHealth.SUSPECT))
        first, second = _bounded(pool), _bounded(pool)
        await _turns()
        assert not first.done() and not second.done()
        assert pool.mark(sick, WorkerHealth.HEALTHY) is WorkerHealth.SUSPECT
        assert pool.mark(sick, WorkerHealth.HEALTHY) is None  # no change
        pool.add(_healthy("new"))
        got = sorted([(await first).name, (await second).name])
        assert monotonic() == 0.0  # woken at once, not by their deadlines' re-check
        return got

    assert _run(main) == ["new", "sick"]


def test_the_deadline_is_on_the_loops_clock() -> None:
    async def main() -> float:
        pool = _pool()
        pool.add(Worker(name="dead", capacity=1, health=WorkerHealth.DEAD))
        started = monotonic()
        with pytest.raises(NoWorker):
            await pool.acquire(wait_s=30.0, timed_out=lambda: NoWorker("none in 30 s"))
        return monotonic() - started

    # Autojump: 30 virtual seconds, no wall time; the deadline is exact on this clock.
    assert _run(main) == 30.0


def test_a_worker_back_before_the_deadline_is_handed_out() -> None:
    async def main() -> tuple[str, float]:
        pool = _pool()
        worker = pool.add(Worker(name="w", capacity=1, health=WorkerHealth.DEAD))
        loop = asyncio.get_running_loop()
        loop.call_later(10.0, pool.mark, worker, WorkerHealth.HEALTHY)
        got = await pool.acquire(wait_s=30.0, timed_out=lambda: NoWorker("late"))
        return got.name, monotonic()

    assert _run(main) == ("w", 10.0)


def test_aclose_wakes_every_waiter_with_the_closed_error_and_cancels_tasks() -> None:
    async def main() -> None:
        pool = _pool()
        pool.add(Worker(name="dead", capacity=1, health=WorkerHealth.DEAD))
        waiters = [_bounded(pool) for _ in range(3)]
        background = pool.spawn(asyncio.sleep(3600.0), "forever")
        await _turns()
        await pool.aclose()
        for waiter in waiters:
            with pytest.raises(Closed, match="the test pool is closed"):
                await waiter
        assert background.cancelled()
        with pytest.raises(Closed):
            await pool.acquire(wait_s=None)
        await pool.aclose()  # twice: a no-op
        assert pool.closed

    _run(main)


def test_async_with_closes_the_pool() -> None:
    async def main() -> bool:
        async with _pool() as pool:
            pool.add(_healthy("a"))
        return pool.closed

    assert _run(main)


def test_a_failure_ends_every_waiter_and_later_acquire() -> None:
    async def main() -> None:
        pool = _pool()
        waiter = _bounded(pool)
        await _turns()
        pool.fail(NoWorker("exhausted"))
        with pytest.raises(NoWorker, match="exhausted"):
            await waiter
        pool.add(_healthy("late"))
        with pytest.raises(NoWorker):
            await pool.acquire(wait_s=None)
        assert isinstance(pool.failure, NoWorker)

    _run(main)


def test_wait_until_returns_when_the_predicate_holds_or_the_pool_closes() -> None:
    async def main() -> None:
        pool = _pool()
        worker = pool.add(_healthy("a"))
        await pool.acquire(wait_s=None)
        drained = asyncio.create_task(pool.wait_until(lambda: worker.in_flight == 0))
        await _turns()
        assert not drained.done()
        pool.release(worker)
        async with asyncio.timeout(3600.0):  # virtual: fails instead of hanging
            await drained
        forever = asyncio.create_task(pool.wait_until(lambda: False))
        await _turns()
        await pool.aclose()
        async with asyncio.timeout(3600.0):
            await forever

    _run(main)


def test_refused_calls_change_nothing() -> None:
    pool = _pool()
    worker = pool.add(_healthy("a"))
    with pytest.raises(InvalidArgumentError, match="'a' is already in the pool"):
        pool.add(_healthy("a", 3))
    with pytest.raises(InvalidArgumentError, match="'b' needs a capacity >= 1, got 0"):
        pool.add(_healthy("b", 0))
    with pytest.raises(InvalidArgumentError, match="'a' has no work in flight"):
        pool.release(worker)
    assert pool.snapshot() == {
        "a": {"health": "healthy", "in_flight": 0, "capacity": 1, "leases": 0}
    }


def test_a_removed_worker_is_never_handed_out_but_its_lease_returns() -> None:
    async def main() -> str:
        pool = _pool()
        old = pool.add(_healthy("old"))
        await pool.acquire(wait_s=None)
        pool.mark(old, WorkerHealth.DEAD)
        pool.remove("old")
        pool.release(old)  # the attempt on it ends after its replacement
        pool.add(_healthy("new"))
        return (await pool.acquire(wait_s=None)).name

    assert _run(main) == "new"


# -- the state machine ----------------------------------------------------------------------


@dataclass
class _Waiter:
    task: asyncio.Task[Worker]
    seen: bool = False


class WorkerPoolMachine(RuleBasedStateMachine):
    """One pool on a manual virtual clock; the loop runs only in :meth:`_settle`, so a
    worker's health at the moment it is handed out is the health the last rule left."""

    workers = Bundle("workers")

    def __init__(self) -> None:
        super().__init__()
        self.loop = VirtualClockLoop()
        self.pool: WorkerPool[Worker] = _pool()
        self.names = 0
        self.waiters: list[_Waiter] = []
        self.held: list[Worker] = []  # one entry per lease not given back
        self.closed = False

    def _settle(self) -> None:
        before = {w.name: w.health for w in self.pool}
        tracked = {id(w) for w in self.pool}
        self.loop.run_until_complete(_turns(30))
        for waiter in self.waiters:
            if waiter.seen or not waiter.task.done():
                continue
            waiter.seen = True
            if waiter.task.exception() is not None:
                assert self.closed and isinstance(waiter.task.exception(), Closed)
                continue
            worker = waiter.task.result()
            assert id(worker) in tracked, "a worker not in the pool was handed out"
            assert before[worker.name] is WorkerHealth.HEALTHY, before[worker.name]
            self.held.append(worker)

    @rule(
        target=workers,
        capacity=st.one_of(st.none(), st.integers(1, 3)),
        health=st.sampled_from(WorkerHealth),
    )
    def add(self, capacity: int | None, health: WorkerHealth) -> Worker:
        self.names += 1
        worker = self.pool.add(Worker(name=f"w{self.names}", capacity=capacity, health=health))
        self._settle()
        return worker

    @precondition(lambda self: not self.closed)
    @rule()
    def acquire(self) -> None:
        task = self.loop.create_task(self.pool.acquire(wait_s=None))
        self.waiters.append(_Waiter(task))
        self._settle()

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        worker = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.pool.release(worker)
        self._settle()

    @rule(worker=workers, health=st.sampled_from(WorkerHealth))
    def mark(self, worker: Worker, health: WorkerHealth) -> None:
        self.pool.mark(worker, health)
        self._settle()

    @rule(
        target=workers,
        dead=consumes(workers),
        capacity=st.one_of(st.none(), st.integers(1, 3)),
    )
    def replace(self, dead: Worker, capacity: int | None) -> Worker:
        # What the Ray pool does with a dead actor: out of the pool, a new one in.
        self.pool.mark(dead, WorkerHealth.DEAD)
        if dead.name in {w.name for w in self.pool}:
            self.pool.remove(dead.name)
        self.names += 1
        worker = self.pool.add(_healthy(f"w{self.names}", capacity))
        self._settle()
        return worker

    @precondition(lambda self: not self.closed)
    @rule()
    def close(self) -> None:
        self.closed = True
        self.loop.run_until_complete(self.pool.aclose())
        self._settle()
        for waiter in self.waiters:
            assert waiter.task.done(), "aclose left a waiter asleep"

    @invariant()
    def never_beyond_capacity(self) -> None:
        for worker in self.pool:
            assert worker.capacity is None or worker.in_flight <= worker.capacity
            assert worker.in_flight == sum(1 for w in self.held if w is worker)

    @invariant()
    def no_waiter_sleeps_while_a_worker_could_serve_it(self) -> None:
        if any(not w.task.done() for w in self.waiters):
            assert not self.closed
            assert not any(w.health is WorkerHealth.HEALTHY and w.has_room for w in self.pool)

    def teardown(self) -> None:
        for waiter in self.waiters:
            waiter.task.cancel()
        self.loop.run_until_complete(_turns(5))
        self.loop.close()


TestWorkerPoolMachine = WorkerPoolMachine.TestCase
TestWorkerPoolMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
