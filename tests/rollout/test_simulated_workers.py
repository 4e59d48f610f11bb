"""Simulated workers: placement, crashes that fail everything in flight, restarts, close.

Tasks are coordinated through the backend's own gauges (``worker_load``,
``worker_status``) and the writer's staging event; ``asyncio.sleep(0)`` only yields to let
other tasks reach their next await, and the hang guard in ``run`` is never a
synchronization.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rollout_support import Rig, failure_of, make_rig, run

from rollout_recovery.capture import LinearizedRollout
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.rollout import AttemptFailure, AttemptResult, FailureReason, FaultsConfig

# With the 1 ms base latency, a straggler's calls take about 17 minutes: the attempt is
# certainly still sleeping when the test acts on it.
SLOW = FaultsConfig.only(straggler_rate=1.0, straggler_factor=1e6)


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0)


def _start(rig: Rig, idx: int = 0) -> asyncio.Task[AttemptResult]:
    return asyncio.create_task(rig.backend.run_attempt(rig.request(idx), rig.writer))


async def _crashed(task: asyncio.Task[AttemptResult | AttemptFailure]) -> AttemptFailure:
    outcome = await task
    assert isinstance(outcome, AttemptFailure), outcome
    return outcome


def test_a_crash_fails_every_attempt_in_flight_on_its_worker() -> None:
    async def main() -> None:
        rig = make_rig(SLOW, workers=1)
        backend = rig.backend
        sleeping = _start(rig, 1)
        await _until(lambda: backend.worker_load()["worker-0"] == 1)
        backend.set_faults(FaultsConfig.only(hang_rate=1.0))
        hanging = _start(rig, 2)
        await rig.writer.first_staged.wait()
        backend.set_faults(FaultsConfig.only(worker_crash_rate=1.0, worker_restart_s=0.0))
        crasher = _start(rig, 3)

        for task in (crasher, sleeping, hanging):
            error = await _crashed(task)
            assert error.reason == "worker_crashed"
            assert error.worker == "worker-0"
        # One crash, three failed attempts: the victims did not crash the worker again.
        assert backend.worker_crashes == 1
        assert backend.fault_counts["worker_crash"] == 1
        assert backend.worker_load() == {"worker-0": 0}

        # The worker comes back, and a fault-free attempt then runs on it.
        backend.set_faults(FaultsConfig.only())
        result = await backend.run_attempt(rig.request(4), rig.writer)
        assert isinstance(fetch_and_verify(result.receipt, rig.data_plane), LinearizedRollout)
        assert backend.worker_status() == {"worker-0": True}
        await backend.aclose()

    run(main)


def test_attempts_go_to_other_workers_while_one_is_down() -> None:
    async def main() -> None:
        rig = make_rig(FaultsConfig.only(worker_crash_rate=1.0, worker_restart_s=3600.0), workers=2)
        backend = rig.backend
        error = await _crashed(_start(rig))
        assert error.worker == "worker-0"
        assert backend.worker_status() == {"worker-0": False, "worker-1": True}

        backend.set_faults(FaultsConfig.only())
        for idx in range(3):
            result = await backend.run_attempt(rig.request(idx), rig.writer)
            assert result.receipt.capture_poisoned is False
        assert backend.worker_status() == {"worker-0": False, "worker-1": True}

        # aclose cancels the pending restart: nothing the backend started outlives it.
        await backend.aclose()
        assert asyncio.all_tasks() == {asyncio.current_task()}
        assert backend.worker_status()["worker-0"] is False

    run(main)


def test_attempts_wait_for_a_worker_when_all_are_down_and_close_wakes_them() -> None:
    async def main() -> None:
        rig = make_rig(FaultsConfig.only(worker_crash_rate=1.0, worker_restart_s=3600.0))
        backend = rig.backend
        await _crashed(_start(rig))
        backend.set_faults(FaultsConfig.only())
        waiting = _start(rig, 1)
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done()  # no worker is up, so it cannot have started a call
        assert len(rig.writer.staged) == 1  # the crasher's first call, nothing more

        await backend.aclose()
        assert (await _crashed(waiting)).reason == "backend_closed"
        closed = await backend.run_attempt(rig.request(2), rig.writer)
        failure_of(closed, FailureReason.BACKEND_CLOSED)

    run(main)


def test_attempts_spread_over_the_least_loaded_workers() -> None:
    async def main() -> None:
        rig = make_rig(SLOW, workers=3)
        backend = rig.backend
        tasks = [_start(rig, idx) for idx in range(6)]
        await _until(lambda: sum(backend.worker_load().values()) == 6)
        assert backend.worker_load() == {"worker-0": 2, "worker-1": 2, "worker-2": 2}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert all(task.cancelled() for task in tasks)
        assert backend.worker_load() == {"worker-0": 0, "worker-1": 0, "worker-2": 0}
        await backend.aclose()

    run(main)


def test_a_crash_during_a_zero_length_wait_fails_the_attempt() -> None:
    # Calls that take no time still yield at every wait (the zero-wait fast path): a
    # crash landing during that yield fails the attempt, as it does a sleeping one.
    async def main() -> None:
        rig = make_rig(workers=1, latency_s=0.0)
        backend = rig.backend
        task = _start(rig, 1)
        await _until(lambda: backend.worker_load()["worker-0"] == 1)
        [worker] = backend._workers  # the attempt is suspended at one of its waits
        backend._crash(worker)
        error = await _crashed(task)
        assert error.reason == "worker_crashed"
        assert backend.worker_crashes == 1
        await backend.aclose()

    run(main)
