"""An attempt waiting for a Ray actor when new weights are pushed takes an actor holding the
new version, and never one still holding the old (the review of issue 16 found the waiter
kept the version it started waiting for)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")  # the [ray] extra: the module imports it; no cluster is started

from rollout_recovery._clock import VirtualClockLoop
from rollout_recovery._workers import WorkerHealth
from rollout_recovery.cluster._pool import (
    ActorPoolSettings,
    ActorStats,
    RayGenerationBackend,
    _Actor,
)
from rollout_recovery.policy import NumpyGRPOTrainer, PolicySnapshot


@pytest.mark.parametrize("push_lands", [True, False], ids=["pushed", "not-yet-pushed"])
def test_a_queued_attempt_follows_the_weight_update(push_lands: bool) -> None:
    weights = NumpyGRPOTrainer(seed=0).weights()
    backend = RayGenerationBackend(
        spec=None,  # type: ignore[arg-type]  # no actor is ever created here
        plane=None,  # type: ignore[arg-type]
        initial_weights=weights,
        settings=ActorPoolSettings(per_actor_concurrency=1, no_actor_wait_s=30.0),
    )

    async def main() -> None:
        actor = backend._actors.add(
            _Actor(
                name="a0",
                capacity=1,
                handle=None,
                stats=ActorStats(),
                version=0,
                health=WorkerHealth.HEALTHY,
            )
        )
        busy = await backend._acquire()
        waiter = asyncio.create_task(backend._acquire())
        await asyncio.sleep(0)  # queued: the only actor is busy
        backend.update_weights(1, PolicySnapshot(1, dict(weights.params)))
        if push_lands:
            actor.version = 1
            backend._actors.wake()
        backend._actors.release(busy)
        await asyncio.sleep(1.0)  # virtual: well inside no_actor_wait_s
        if push_lands:
            assert (await waiter).version == 1
        else:
            assert not waiter.done()  # the actor still holds version 0: not handed out
            waiter.cancel()

    loop = VirtualClockLoop(autojump=True)
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
