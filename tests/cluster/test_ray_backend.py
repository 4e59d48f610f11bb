"""Generation actors on Ray: attempts, dead actors (ray.kill, SIGKILL, missed deadlines),
fenced late writes, and a pool that fails loudly instead of waiting forever."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from typing import Any

import pytest
import ray
from cluster_support import kill_and_await_death

from rollout_recovery.capture import (
    CaptureWriter,
    LinearizedRollout,
    StagedPrefix,
)
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.cluster import RayConfig
from rollout_recovery.cluster._pool import RayGenerationBackend
from rollout_recovery.cluster._sharded_plane import RayShardedDataPlane
from rollout_recovery.cluster._worker import WorkerSpec
from rollout_recovery.control._inventory import reconcile_staging
from rollout_recovery.errors import ActorPoolExhaustedError, FencedWriterError
from rollout_recovery.ledger import RolloutRecoveryLedger
from rollout_recovery.policy import NumpyGRPOTrainer, TaskConfig, TaskSet
from rollout_recovery.rollout import (
    AttemptFailure,
    AttemptRequest,
    AttemptResult,
    DigitTask,
    FailureReason,
    GenerationConfig,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NewPlane = Callable[..., RayShardedDataPlane]
TASKS = TaskSet(64, seed=2, prompt_group_every=4)


def _backend(
    plane: RayShardedDataPlane,
    *,
    latency: float = 0.0,
    actors: int = 2,
    thinking_calls: int = 1,
    **settings: Any,
) -> RayGenerationBackend:
    spec = WorkerSpec(
        kind="simulated",
        shards=plane.layout,
        seed=2,
        # TASKS: the worker grades the prompts the tests send.
        episodes=DigitTask(TASKS, TaskConfig(thinking_calls=thinking_calls, reasoning_tokens=4)),
        generation=GenerationConfig(call_latency_s=latency, latency_jitter=0.0),
    )
    return RayGenerationBackend(
        RayConfig(
            actors_per_node=actors,
            cpus_per_actor=0.01,
            ping_interval_s=0.2,
            # Generous: a live actor slow to answer on a loaded machine is not a death.
            ping_timeout_s=30.0,
            **settings,
        ),
        spec=spec,
        plane=plane,
        initial_weights=NumpyGRPOTrainer(seed=0).weights(),
    )


def _request(idx: int, attempt: int = 0) -> AttemptRequest:
    return AttemptRequest(
        group_id=f"grp{idx}",
        generation_index=0,
        rollout_id=f"grp{idx}_g0_a{attempt}",
        prompt=TASKS[idx],
        weight_version=0,
    )


async def _gather(
    backend: RayGenerationBackend, plane: RayShardedDataPlane, idxs: range
) -> list[Any]:
    writer = CaptureWriter(plane)
    return list(
        await asyncio.gather(
            *(backend.run_attempt(_request(i), writer) for i in idxs), return_exceptions=True
        )
    )


def test_attempts_run_on_actors_and_stage_into_the_shards(new_plane: NewPlane) -> None:
    plane = new_plane(2)
    backend = _backend(plane)

    async def scenario() -> list[Any]:
        try:
            return await _gather(backend, plane, range(8))
        finally:
            await backend.aclose()

    results = asyncio.run(scenario())
    for result in results:
        assert isinstance(result, AttemptResult), result
        verified = fetch_and_verify(result.receipt, plane)
        assert isinstance(verified, LinearizedRollout), verified
    counts = backend.telemetry()["actors"]
    assert len(counts) == 2 and sum(a["attempts"] for a in counts.values()) == 8


@pytest.mark.parametrize("how", ["ray.kill", "sigkill"])
def test_a_dead_actor_costs_only_its_attempts_and_is_replaced(
    new_plane: NewPlane, how: str
) -> None:
    plane = new_plane(2)
    # Slow calls (0.5 s each): attempts are in flight on both actors when one dies.
    backend = _backend(plane, latency=0.5)

    async def scenario() -> tuple[list[Any], list[Any], str]:
        try:
            await backend.start()
            writer = CaptureWriter(plane)
            tasks = [
                asyncio.create_task(backend.run_attempt(_request(i), writer)) for i in range(6)
            ]
            victim_name, victim = sorted(backend.live_actors().items())[0]
            # Kill only once attempts are in flight on both actors (each takes >= 1 s).
            while not all(backend.actor_load().values()):
                await asyncio.sleep(0.01)
            if how == "ray.kill":
                ray.kill(victim, no_restart=True)
            else:
                os.kill(backend.telemetry()["actors"][victim_name]["pid"], signal.SIGKILL)
            first = await asyncio.gather(*tasks, return_exceptions=True)
            # The pool goes on: a replacement takes the dead actor's place.
            later = await _gather(backend, plane, range(10, 16))
            async with asyncio.timeout(60):  # a start takes about 1 s on two idle cores
                while not any(
                    a["replaces"] == victim_name for a in backend.telemetry()["actors"].values()
                ):
                    await asyncio.sleep(0.01)
            return first, later, victim_name
        finally:
            await backend.aclose()

    first, later, victim = asyncio.run(scenario())
    # Every outcome is a value: nothing an attempt of a dead actor ends with is raised.
    assert not [r for r in first if isinstance(r, BaseException)], first
    died = [r for r in first if isinstance(r, AttemptFailure)]
    assert died and all(
        f.reason is FailureReason.ACTOR_DIED and f.worker == victim for f in died
    ), died
    assert any(isinstance(r, AttemptResult) for r in first)  # the other actor's finished
    assert all(isinstance(r, AttemptResult) for r in later)
    telemetry = backend.telemetry()
    assert telemetry["actors"][victim]["state"] == "dead"
    assert telemetry["replacements"] == 1
    assert any(a["replaces"] == victim for a in telemetry["actors"].values())
    # Its writer id is fenced: a late put from it can never land.
    with pytest.raises(FencedWriterError):
        RayShardedDataPlane(plane.layout, writer=victim).put(
            CaptureWriter.staging_partition, {"grp0_g0_a0/late": _row()}
        )


def test_the_next_attempt_continues_the_calls_a_dead_actor_staged(new_plane: NewPlane) -> None:
    """Call-level resume on Ray: the driver reads what the killed actor staged (its writer
    is fenced, its rows are not) and another actor continues the episode from there."""
    plane = new_plane(2)
    # Slow calls (1.5 s each): the kill lands while the second of four calls is running.
    backend = _backend(plane, latency=1.5, thinking_calls=3)

    async def scenario() -> tuple[StagedPrefix, AttemptResult, str]:
        try:
            await backend.start()
            writer = CaptureWriter(plane)
            lost = asyncio.create_task(backend.run_attempt(_request(7), writer))
            async with asyncio.timeout(120):  # until its first call is staged
                while not [
                    k
                    for k in plane.keys(CaptureWriter.staging_partition)
                    if k.startswith("grp7_g0_a0/")
                ]:
                    await asyncio.sleep(0.05)
            (victim,) = [name for name, load in backend.actor_load().items() if load]
            kill_and_await_death(backend.live_actors()[victim])
            failure = await lost
            assert isinstance(failure, AttemptFailure), failure
            assert failure.reason is FailureReason.ACTOR_DIED
            keys = [
                k
                for k in plane.keys(CaptureWriter.staging_partition)
                if k.startswith("grp7_g0_a0/")
            ]
            prefix = StagedPrefix.read(plane, "grp7_g0_a0", keys)
            assert isinstance(prefix, StagedPrefix), prefix
            result = await backend.run_attempt(_request(7, attempt=1), writer, prefix)
            return prefix, result, victim
        finally:
            await backend.aclose()

    prefix, result, victim = asyncio.run(scenario())
    assert len(prefix.calls) >= 1
    assert result.inherited_calls == len(prefix.calls)
    assert len(result.receipt.manifest) == 4
    verified = fetch_and_verify(result.receipt, plane, expected_rollout_id="grp7_g0_a1")
    assert isinstance(verified, LinearizedRollout), verified
    assert backend.telemetry()["actors"][victim]["state"] == "dead"


def _row() -> Any:
    from dataplane_support import make_row

    return make_row(5)


def test_a_late_write_that_beat_the_fence_is_an_unreferenced_orphan(
    new_plane: NewPlane,
) -> None:
    """The other half of the guarantee: a row a dying actor staged before its fence is
    named by no sealed receipt, so the restore inventory pass deletes it and no canonical
    row can ever be built from it."""
    plane = new_plane(2)
    late = RayShardedDataPlane(plane.layout, writer="gen-dead")
    late.put(CaptureWriter.staging_partition, {"grp1_g0_aabc/reason-1": _row()})
    plane.fence("gen-dead")
    ledger = RolloutRecoveryLedger()  # the attempt was abandoned: nothing references it

    async def inventory() -> Any:
        from rollout_recovery.dataplane import DataPlaneCheckpointBarrier

        barrier = DataPlaneCheckpointBarrier()
        async with barrier.mutation("recovery_restore") as cut:
            return reconcile_staging(
                ledger,
                plane,
                cut,
                partition=CaptureWriter.staging_partition,
                clear_unreferenced=True,
            )

    asyncio.run(inventory())
    assert plane.keys(CaptureWriter.staging_partition) == []


def test_no_live_actor_and_none_startable_fails_loudly(new_plane: NewPlane) -> None:
    plane = new_plane(1)
    backend = _backend(plane, actors=1, max_replacements=0, no_actor_wait_s=300.0)

    async def scenario() -> BaseException:
        try:
            await backend.start()
            (only,) = backend.live_actors().values()
            kill_and_await_death(only)  # or the doomed actor may still run attempt 1
            writer = CaptureWriter(plane)
            failure = await backend.run_attempt(_request(1), writer)
            assert isinstance(failure, AttemptFailure), failure
            with pytest.raises(ActorPoolExhaustedError) as caught:
                async with asyncio.timeout(60):  # well before no_actor_wait_s
                    await backend.run_attempt(_request(2), writer)
            return caught.value
        finally:
            await backend.aclose()

    error = asyncio.run(scenario())
    assert "replacement budget" in str(error)
    assert error.fatal


def test_an_actor_takes_work_only_once_it_holds_the_current_weights(
    new_plane: NewPlane,
) -> None:
    from rollout_recovery.policy import PolicySnapshot
    from rollout_recovery.policy._numpy_policy import initial_params

    plane = new_plane(2)
    backend = _backend(plane)

    async def scenario() -> list[Any]:
        try:
            await _gather(backend, plane, range(4))
            backend.update_weights(1, PolicySnapshot(1, initial_params(1, 1.0)))
            # Dispatched right after the update: no actor may serve them with version 0.
            return await _gather(backend, plane, range(20, 28))
        finally:
            await backend.aclose()

    results = asyncio.run(scenario())
    for result in results:
        assert isinstance(result, AttemptResult), result
        verified = fetch_and_verify(result.receipt, plane)
        assert isinstance(verified, LinearizedRollout), verified
        assert verified.min_weight_version == verified.max_weight_version == 1


def test_a_finished_attempt_frees_its_slot_for_a_waiting_one(new_plane: NewPlane) -> None:
    plane = new_plane(1)
    # One actor, one slot: every attempt but the first waits for the one before to end.
    backend = _backend(plane, latency=0.05, actors=1, per_actor_concurrency=1, no_actor_wait_s=300)

    async def scenario() -> list[Any]:
        try:
            await backend.start()  # not timed: a loaded machine starts actors slowly
            async with asyncio.timeout(60):  # far below no_actor_wait_s
                return await _gather(backend, plane, range(30, 34))
        finally:
            await backend.aclose()

    results = asyncio.run(scenario())
    assert all(isinstance(r, AttemptResult) for r in results), results


def test_a_failed_health_round_does_not_end_the_health_checks(
    new_plane: NewPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    plane = new_plane(1)
    revive = plane.revive_dead_shards
    rounds: list[int] = []

    def flaky_revive(timeout: float) -> list[int]:
        rounds.append(1)
        if len(rounds) == 1:
            raise RuntimeError("shard 0 would not restart")
        return revive(timeout)

    monkeypatch.setattr(plane, "revive_dead_shards", flaky_revive)
    backend = _backend(plane)

    async def scenario() -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        try:
            await backend.start()
            while not rounds:
                await asyncio.sleep(0.01)
            # No attempt is running: only the health loop's ping can notice this death.
            victim_name, victim = sorted(backend.live_actors().items())[0]
            await asyncio.to_thread(kill_and_await_death, victim)
            events: list[dict[str, Any]] = []
            async with asyncio.timeout(60):
                # The event, not the live set: an actor leaves that before it is fenced.
                while not any(
                    e["event"] == "actor_dead" and e["actor"] == victim_name for e in events
                ):
                    await asyncio.sleep(0.01)
                    events += backend.drain_events()
            return victim_name, backend.telemetry()["actors"][victim_name], events
        finally:
            await backend.aclose()

    name, victim, events = asyncio.run(scenario())
    assert victim["state"] == "dead"
    failed = [e for e in events if e["event"] == "health_check_failed"]
    assert failed and "would not restart" in failed[0]["error"]
    (death,) = [e for e in events if e["event"] == "actor_dead" and e["actor"] == name]
    assert death["why"] == "ping_failed"
