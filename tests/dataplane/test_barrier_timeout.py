"""Entry deadlines: no barrier wait is unbounded when the caller gives a timeout.

The waits here are the behaviour under test (a deadline expiring), not synchronization:
every ordering between tasks is still arranged with events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from rollout_recovery.dataplane import DataPlaneCheckpointBarrier
from rollout_recovery.errors import BarrierTimeoutError

GUARD = 5.0  # hang guard only


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coroutine, GUARD))


async def _hold(
    barrier: DataPlaneCheckpointBarrier,
    entered: asyncio.Event,
    release: asyncio.Event,
    *,
    checkpoint: bool,
) -> None:
    section = barrier.checkpoint() if checkpoint else barrier.mutation(kind="sibling_seals")
    async with section:
        entered.set()
        await release.wait()


def test_a_checkpoint_gives_up_on_a_mutation_that_never_exits() -> None:
    async def scenario() -> None:
        barrier = DataPlaneCheckpointBarrier()
        entered, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold(barrier, entered, release, checkpoint=False))
        await entered.wait()
        with pytest.raises(BarrierTimeoutError) as caught:
            async with barrier.checkpoint(timeout=0.05):
                pytest.fail("entered despite an open mutation")
        assert isinstance(caught.value, TimeoutError) and caught.value.section == "checkpoint"
        # Nothing is left behind: no queued or active checkpoint, mutations flow at once.
        assert not barrier.checkpoint_active and barrier.waiting_checkpoints == 0
        async with barrier.mutation(kind="other", timeout=0.05):
            pass
        release.set()
        await holder
        async with barrier.checkpoint(timeout=1.0):
            pass

    run(scenario())


def test_a_mutation_gives_up_behind_a_checkpoint_and_is_counted() -> None:
    async def scenario() -> None:
        barrier = DataPlaneCheckpointBarrier()
        entered, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold(barrier, entered, release, checkpoint=True))
        await entered.wait()
        with pytest.raises(BarrierTimeoutError) as caught:
            async with barrier.mutation(kind="group_commits", timeout=0.05):
                pytest.fail("entered during a checkpoint")
        assert caught.value.kind == "group_commits"
        assert barrier.waiting_mutations == 0
        telemetry = barrier.drain_telemetry()
        assert telemetry.blocked_by_kind == {"group_commits": 1}
        assert len(telemetry.wait_durations_s) == 1 and telemetry.wait_durations_s[0] >= 0.04
        release.set()
        await holder
        async with barrier.mutation(kind="group_commits", timeout=1.0):
            pass

    run(scenario())


def test_a_queued_checkpoint_times_out_and_leaves_the_queue() -> None:
    async def scenario() -> None:
        barrier = DataPlaneCheckpointBarrier()
        entered, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold(barrier, entered, release, checkpoint=True))
        await entered.wait()
        with pytest.raises(BarrierTimeoutError):
            async with barrier.checkpoint(timeout=0.05):
                pytest.fail("two checkpoints at once")
        assert barrier.waiting_checkpoints == 0
        release.set()
        await holder
        async with barrier.mutation(kind="other", timeout=1.0):
            pass

    run(scenario())


def test_an_uncontended_section_enters_within_its_deadline() -> None:
    async def scenario() -> None:
        barrier = DataPlaneCheckpointBarrier()
        async with barrier.mutation(kind="other", timeout=0.01) as cut:
            cut.require_live()
        async with barrier.checkpoint(timeout=0.01) as cut:
            cut.require_live()
        assert barrier.mutation_version == 1

    run(scenario())


@pytest.mark.parametrize("timeout", [0, -1, "1", float("nan")])
def test_a_bad_timeout_is_refused_at_call_time(timeout: Any) -> None:
    barrier = DataPlaneCheckpointBarrier()
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        barrier.mutation(kind="other", timeout=timeout)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        barrier.checkpoint(timeout=timeout)


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_a_cancel_that_was_accepted_is_never_dropped(timeout: float | None) -> None:
    """Found by review: on Python 3.11 a wait_for-based deadline could swallow a cancel that
    raced a successful entry, and the checkpoint body ran anyway. Scheduling is stepped
    with sleep(0) turns, so every interleaving k is reproduced exactly."""

    async def trial(turns: int) -> tuple[bool, str, list[str]]:
        barrier = DataPlaneCheckpointBarrier()
        release, entered = asyncio.Event(), asyncio.Event()
        body: list[str] = []

        async def mutation() -> None:
            async with barrier.mutation(kind="other"):
                entered.set()
                await release.wait()

        async def checkpoint() -> None:
            async with barrier.checkpoint(timeout=timeout):
                body.append("entered")

        holder = asyncio.create_task(mutation())
        await entered.wait()
        task = asyncio.create_task(checkpoint())
        for _ in range(3):
            await asyncio.sleep(0)
        release.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        requested = task.cancel()
        try:
            await task
            outcome = "completed"
        except asyncio.CancelledError:
            outcome = "cancelled"
        await holder
        return requested, outcome, body

    async def scenario() -> None:
        for turns in range(12):
            requested, outcome, body = await trial(turns)
            if requested:
                assert outcome == "cancelled" and body == [], (turns, outcome, body)

    run(scenario())
