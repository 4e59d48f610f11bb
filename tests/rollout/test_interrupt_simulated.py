"""``on_weight_update = "interrupt"`` on the simulated backend: a call in flight at an
update finishes under the new weights, each token keeping the version and logprob of the
weights that generated it; the trainer's ratios then use each token's own version."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pytest
from rollout_support import TASKS, SignallingWriter, run, snapshot

from rollout_recovery.capture import CaptureWriter, LinearizedRollout
from rollout_recovery.capture._spans import TokenVersionSpan
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.errors import ConfigError
from rollout_recovery.policy import NumpyGRPOTrainer, PolicySnapshot, TaskConfig, TrainSample
from rollout_recovery.rollout import (
    AttemptRequest,
    AttemptResult,
    DigitTask,
    FaultsConfig,
    GenerationConfig,
)
from rollout_recovery.rollout import SimulatedAgentBackend as Backend

REASONING = 4
Waits = Callable[[Any, Any, float | None], Coroutine[Any, Any, None]]


def _backend(mode: str, initial: PolicySnapshot, plane: MemoryDataPlane) -> Backend:
    return Backend(
        GenerationConfig(
            workers=1,
            call_latency_s=0.001,
            latency_jitter=0.0,
            on_weight_update=mode,  # type: ignore[arg-type]
        ),
        faults=FaultsConfig.only(),
        episodes=DigitTask(TASKS, TaskConfig(thinking_calls=1, reasoning_tokens=REASONING)),
        seed=7,
        initial_weights=initial,
        data_plane=plane,
    )


def _update_at_wait(backend: Backend, wait: int, weights: PolicySnapshot) -> None:
    """Push ``weights`` when the backend enters its ``wait``-th latency wait (1-based):
    in interrupt mode every token waits once before it is sampled, so the update lands
    between tokens ``wait - 1`` and ``wait`` of the first call."""
    original: Waits = backend._wait_on
    count = [0]

    async def counting(worker: Any, life: Any, seconds: float | None) -> None:
        count[0] += 1
        if count[0] == wait:
            backend.update_weights(weights.version, weights)
        await original(worker, life, seconds)

    backend._wait_on = counting  # type: ignore[method-assign]


def _attempt(
    mode: str, *, update_at: int | None, v0: PolicySnapshot, v1: PolicySnapshot
) -> tuple[AttemptResult, MemoryDataPlane, SignallingWriter]:
    out: list[tuple[AttemptResult, MemoryDataPlane, SignallingWriter]] = []

    async def main() -> None:
        plane = MemoryDataPlane()
        backend = _backend(mode, v0, plane)
        if update_at is not None:
            _update_at_wait(backend, update_at, v1)
        writer = SignallingWriter(plane)
        request = AttemptRequest(
            group_id="grp3",
            generation_index=0,
            rollout_id="grp3_g0_a1",
            prompt=TASKS[3],
            weight_version=0,
        )
        result = await backend.run_attempt(request, writer)
        await backend.aclose()
        out.append((result, plane, writer))

    run(main)
    return out[0]


V0 = snapshot(version=0, seed=1, spread=2.0)
V1 = snapshot(version=1, seed=2, spread=2.0)


def _linearized(result: AttemptResult, plane: MemoryDataPlane) -> LinearizedRollout:
    row = fetch_and_verify(result.receipt, plane, expected_rollout_id=result.rollout_id)
    assert isinstance(row, LinearizedRollout), row
    return row


def test_a_call_in_flight_finishes_under_the_new_weights_with_spans() -> None:
    # The update lands after 2 of the reasoning call's 4 tokens.
    result, plane, writer = _attempt("interrupt", update_at=3, v0=V0, v1=V1)
    reasoning, answer = writer.staged
    assert reasoning.weight_version == 1  # its newest weights
    assert answer.weight_version == 1
    staged = plane.get(CaptureWriter.staging_partition, [reasoning.staging_key])[0]
    assert staged.metadata["extras"]["weight_version_spans"] == [
        {"version": "0", "start": 0, "end": 2},
        {"version": "1", "start": 2, "end": 4},
    ]
    row = _linearized(result, plane)
    generated = np.flatnonzero(row.token_mask == 1.0)
    # The spans tile the generated tokens: the reasoning call's split 2 + 2, the answer's.
    covered = [p for span in row.token_version_spans for p in range(span.start, span.end)]
    assert covered == generated.tolist()
    first = int(generated[0])
    assert row.token_version_spans[:2] == (
        TokenVersionSpan(0, first, first + 2),
        TokenVersionSpan(1, first + 2, first + 4),
    )
    assert {span.version for span in row.token_version_spans[2:]} == {1}
    # Each token's captured logprob is that of the weights that generated it.
    by_version = {0: V0.token_logprobs(row.token_ids, row.token_mask)}
    by_version[1] = V1.token_logprobs(row.token_ids, row.token_mask)
    for span in row.token_version_spans:
        np.testing.assert_array_equal(
            row.logprobs[span.start : span.end],
            by_version[span.version][span.start : span.end].astype(np.float32),
        )


def test_without_an_update_interrupt_generates_what_continue_does() -> None:
    interrupted, plane_i, _ = _attempt("interrupt", update_at=None, v0=V0, v1=V1)
    continued, plane_c, _ = _attempt("continue", update_at=None, v0=V0, v1=V1)
    a, b = _linearized(interrupted, plane_i), _linearized(continued, plane_c)
    assert a.token_ids.tolist() == b.token_ids.tolist()
    assert a.logprobs.tolist() == b.logprobs.tolist()
    assert a.token_version_spans == b.token_version_spans


def test_continue_keeps_a_call_on_one_version() -> None:
    # "continue" (today's behaviour): an update during the call's latency wait makes the
    # whole call sample the newest weights, one version per call, no spans extra.
    result, plane, writer = _attempt("continue", update_at=1, v0=V0, v1=V1)
    reasoning = writer.staged[0]
    staged = plane.get(CaptureWriter.staging_partition, [reasoning.staging_key])[0]
    assert "extras" not in staged.metadata or staged.metadata["extras"] is None
    row = _linearized(result, plane)
    assert [s.version for s in row.token_version_spans] == [1, 1]


def test_the_trainer_ratio_of_each_token_uses_its_own_versions_logprob() -> None:
    # A trainer at v1 trains the interrupted row: tokens v1 generated have ratio 1, the
    # tokens v0 generated exp(logp_v1 - logp_v0). The numpy trainer reads the captured
    # logprob per token, so its loss is exactly that per-token objective.
    result, plane, _ = _attempt("interrupt", update_at=3, v0=V0, v1=V1)
    row = _linearized(result, plane)
    trainer = NumpyGRPOTrainer(seed=0, clip_epsilon=0.5)
    state = trainer.state()
    for name, table in V1.params.items():
        state[f"param.{name}"] = np.array(table)
    trainer.load_state(state)
    advantage = 1.0
    sample = TrainSample(
        token_ids=row.token_ids,
        token_mask=row.token_mask,
        logprobs=row.logprobs,
        advantage=advantage,
    )
    loss, _ = trainer.loss_and_grad([sample])
    current = V1.token_logprobs(row.token_ids, row.token_mask)
    generated = row.token_mask == 1.0
    ratio = np.exp(current[generated] - row.logprobs[generated].astype(np.float64))
    expected = -float(np.minimum(ratio * advantage, np.clip(ratio, 0.5, 1.5) * advantage).mean())
    assert loss == pytest.approx(expected, rel=1e-6)
    v1_tokens = np.zeros(row.token_mask.shape, dtype=bool)
    for span in row.token_version_spans:
        if span.version == 1:
            v1_tokens[span.start : span.end] = True
    np.testing.assert_allclose(ratio[v1_tokens[generated]], 1.0, atol=1e-6)
    assert not np.allclose(ratio[~v1_tokens[generated]], 1.0)
    # Stamping the whole row with one version's logprobs would give another objective.
    for version in (V0, V1):
        whole = TrainSample(
            token_ids=row.token_ids,
            token_mask=row.token_mask,
            logprobs=version.token_logprobs(row.token_ids, row.token_mask).astype(np.float32),
            advantage=advantage,
        )
        assert trainer.loss_and_grad([whole])[0] != pytest.approx(expected, rel=1e-6)


def test_an_unknown_mode_is_refused_where_the_config_is_read() -> None:
    with pytest.raises(ConfigError) as refused:
        config_from_builtins({"generation": {"on_weight_update": "sometimes"}})
    assert refused.value.path == "$.generation.on_weight_update"
