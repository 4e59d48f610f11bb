"""A simulated backend wired to a real CaptureWriter over a MemoryDataPlane."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.capture._records import CallRecord
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.policy import PolicySnapshot, TaskConfig, TaskSet
from rollout_recovery.policy._numpy_policy import initial_params
from rollout_recovery.rollout import (
    AttemptFailure,
    AttemptRequest,
    AttemptResult,
    DigitTask,
    FailureReason,
    FaultsConfig,
    GenerationConfig,
    SimulatedAgentBackend,
)

LATENCY_S = 0.001
GUARD_S = 20.0
TASKS = TaskSet(50, seed=3, prompt_group_every=4)
#: Two calls an episode (a thought, the answer): the tests count calls.
EPISODES = DigitTask(TASKS, TaskConfig(thinking_calls=1, reasoning_tokens=4))


class SignallingWriter(CaptureWriter):
    """A CaptureWriter that also sets an event per staged call: tests wait on what the
    backend did, never on the clock."""

    def __init__(self, data_plane: MemoryDataPlane) -> None:
        super().__init__(data_plane)
        self.staged: list[CallRecord] = []
        self.first_staged = asyncio.Event()

    def stage_call(self, **call: Any) -> CallRecord:
        record = super().stage_call(**call)
        self.staged.append(record)
        self.first_staged.set()
        return record


@dataclass
class Rig:
    backend: SimulatedAgentBackend
    data_plane: MemoryDataPlane
    writer: SignallingWriter
    counter: list[int] = field(default_factory=lambda: [0])

    def request(self, idx: int = 0, *, rollout_id: str | None = None) -> AttemptRequest:
        self.counter[0] += 1
        return AttemptRequest(
            group_id=f"grp{idx}",
            generation_index=0,
            rollout_id=rollout_id or f"grp{idx}_g0_a{self.counter[0]}",
            prompt=TASKS[idx],
            weight_version=self.backend.weight_version,
        )

    def staged_keys(self, rollout_id: str) -> list[str]:
        return [
            k
            for k in self.data_plane.keys(CaptureWriter.staging_partition)
            if k.startswith(rollout_id + "/")
        ]


def snapshot(version: int = 0, seed: int = 0, spread: float = 1.0) -> PolicySnapshot:
    return PolicySnapshot(version, initial_params(seed, spread))


def make_rig(
    faults: FaultsConfig | None = None,
    *,
    workers: int = 1,
    seed: int = 0,
    latency_s: float = LATENCY_S,
    stage_in_thread: bool = False,
) -> Rig:
    # Built inside the running loop, so the writer's event belongs to it.
    data_plane = MemoryDataPlane()
    backend = SimulatedAgentBackend(
        GenerationConfig(workers=workers, call_latency_s=latency_s, latency_jitter=0.3),
        faults=faults or FaultsConfig.only(),
        episodes=EPISODES,
        seed=seed,
        initial_weights=snapshot(),
        data_plane=data_plane,
        stage_in_thread=stage_in_thread,
    )
    return Rig(backend=backend, data_plane=data_plane, writer=SignallingWriter(data_plane))


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` under asyncio.run with a hang guard (never a synchronization)."""

    async def guarded() -> None:
        async with asyncio.timeout(GUARD_S):
            await main()

    asyncio.run(guarded())


def failure_of(outcome: AttemptResult | AttemptFailure, reason: FailureReason) -> AttemptFailure:
    """``outcome`` as the failure value a backend returns, with ``reason`` (a raised
    failure fails the test before this is reached)."""
    assert isinstance(outcome, AttemptFailure), f"expected a {reason} failure, got {outcome}"
    assert outcome.reason is reason, outcome
    return outcome
