"""Property: any mix of healthy and damaged siblings finalizes to exactly N rows."""

from __future__ import annotations

import numpy as np
from finalize_support import (
    EXPECTED_REASON,
    KINDS,
    CallPlan,
    Kind,
    SealOptions,
    build_group,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_recovery.capture import LinearizedRollout
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.finalize._group import finalize_group
from rollout_recovery.finalize._metrics import INVALID_ROW_RATE
from rollout_recovery.ledger import RolloutRecoveryLedger
from rollout_recovery.rewards import CaptureRewardSettings

token = st.integers(min_value=0, max_value=2**31 - 1)
logprob = st.floats(min_value=-30.0, max_value=0.0, width=32, allow_subnormal=False)


@st.composite
def call_plans(draw: st.DrawFn) -> list[CallPlan]:
    plan = []
    for position in range(draw(st.integers(2, 4))):  # >= 2: reorder and re-parent need it
        generated = draw(st.lists(token, min_size=1, max_size=5))
        plan.append(
            CallPlan(
                carried=draw(st.lists(token, min_size=1 if position == 0 else 0, max_size=5)),
                generated=generated,
                logprobs=draw(st.lists(logprob, min_size=len(generated), max_size=len(generated))),
                weight_version=draw(st.integers(0, 20)),
            )
        )
    return plan


@st.composite
def groups(draw: st.DrawFn) -> tuple[list[Kind], list[list[CallPlan]], list[SealOptions]]:
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
    plans = [draw(call_plans()) for _ in kinds]
    options = [
        SealOptions(
            reward=draw(st.floats(-10, 10, allow_nan=False)), mask_sample=draw(st.booleans())
        )
        for _ in kinds
    ]
    return kinds, plans, options


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups(), st.integers(0, 30))
def test_any_mix_publishes_exactly_n_rows(
    drawn: tuple[list[Kind], list[list[CallPlan]], list[SealOptions]], start_version: int
) -> None:
    kinds, plans, options = drawn
    ledger = RolloutRecoveryLedger()
    store = MemoryDataPlane()
    staged = build_group(
        ledger, store, kinds, plans=plans, options=options, start_weight_version=start_version
    )
    record = ledger.get_group("grp")

    result = finalize_group(group=record, data_plane=store, settings=CaptureRewardSettings())

    n = len(kinds)
    assert len(result.rows) == len(result.metas) == n
    assert result.row_keys == tuple(f"grp_g{i}" for i in range(n))
    valid_versions: list[int] = []
    for index, (kind, sibling, option) in enumerate(zip(kinds, staged, options, strict=True)):
        outcome, row = result.metas[index], result.rows[index]
        assert outcome.generation_index == index and outcome.mask_sample == option.mask_sample
        assert row.metadata["sample_id"] == f"grp_g{index}"
        assert row.metadata["rollout_id"] == record.gate_rollout_id(index)
        if kind != "sealed":
            assert not outcome.valid
            assert outcome.reason is not None
            assert outcome.reason.startswith(EXPECTED_REASON[kind]), (kind, outcome.reason)
            assert row.token_ids.size == 0 and row.metadata["sample_mask"] == 0.0
            continue
        assert outcome.valid and outcome.reason is None
        assert outcome.reward == option.reward
        direct = fetch_and_verify(
            record.siblings[index].current_attempt.receipt,
            store,
            expected_rollout_id=record.gate_rollout_id(index),
        )
        assert isinstance(direct, LinearizedRollout)
        assert np.array_equal(row.token_ids, direct.token_ids)
        assert np.array_equal(row.token_mask, direct.token_mask)
        assert np.array_equal(row.logprobs, direct.logprobs)
        assert row.token_ids.tolist() == sibling.expected_tokens
        assert outcome.prompt_len == direct.prompt_len == sibling.prompt_len
        valid_versions += [call.weight_version for call in plans[index]]
    invalid = sum(kind != "sealed" for kind in kinds)
    assert result.metrics[INVALID_ROW_RATE] == invalid / n
    assert result.metrics["finalize/reward_count"] == n - invalid
    assert len(result.reward_observations) == n - invalid
    assert result.min_weight_version == min(valid_versions, default=start_version)
    assert result.max_weight_version == max(valid_versions, default=start_version)
    assert result.train_mask().tolist() == [
        kind == "sealed" and not option.mask_sample
        for kind, option in zip(kinds, options, strict=True)
    ]
