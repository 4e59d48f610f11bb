"""An attempt waiting for a Ray actor when new weights are pushed takes an actor holding the
new version, and never one still holding the old (the review of issue 16 found the waiter
kept the version it started waiting for)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")  # the [ray] extra: the module imports it; no cluster is started

from cluster_support import add_actor, pool_without_ray

from rollout_recovery._clock import VirtualClockLoop
from rollout_recovery.policy import PolicySnapshot

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.mark.parametrize("push_lands", [True, False], ids=["pushed", "not-yet-pushed"])
def test_a_queued_attempt_follows_the_weight_update(push_lands: bool) -> None:
    backend, weights = pool_without_ray(no_actor_wait_s=30.0)

    async def main() -> None:
        actor = add_actor(backend, "a0", version=0)
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
