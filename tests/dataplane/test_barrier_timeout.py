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
