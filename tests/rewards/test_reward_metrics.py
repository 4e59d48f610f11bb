"""Reward metrics: per-group sums, exact pooling across unequal groups, agent tables."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery.errors import InvalidStateError
from rollout_recovery.rewards import (
    CaptureRewardOutcome,
    CaptureRewardSettings,
    FinalizedReward,
    RewardChecks,
    RewardLogContext,
)
from rollout_recovery.rewards._final_reward import finalize_capture_reward
from rollout_recovery.rewards._metrics import (
    aggregate_capture_reward_metrics,
    capture_reward_result_tables,
    group_reward_metrics,
)

NO_COUNTS = {"duplicated_reasoning": 0, "empty_final_answer": 0, "unwanted_token": 0}


def collect(groups: Iterable[Mapping[str, float]]) -> dict[str, list[float]]:
    """What a trainer step does: one list entry per group that reported the metric."""
    pooled: dict[str, list[float]] = {}
    for group in groups:
        for name, value in group.items():
            pooled.setdefault(name, []).append(value)
    return pooled


def outcome(reward: float, **counts: int) -> CaptureRewardOutcome:
    return CaptureRewardOutcome(reward, {**NO_COUNTS, **counts}, {})


def test_metric_pooling_uses_valid_rollouts_and_legacy_names() -> None:
    groups = [
        {
            "finalize/reward_count": 2.0,
            "finalize/reward_sum": 1.0,
            "finalize/reward_sumsq": 1.0,
            "finalize/reward_min": 0.0,
            "finalize/reward_max": 1.0,
            "finalize/penalty_count/duplicated_reasoning": 1.0,
            "finalize/penalty_count/empty_final_answer": 0.0,
        },
        {
            "finalize/reward_count": 1.0,
            "finalize/reward_sum": 0.5,
            "finalize/reward_sumsq": 0.25,
            "finalize/reward_min": 0.5,
            "finalize/reward_max": 0.5,
            "finalize/penalty_count/duplicated_reasoning": 0.0,
            "finalize/penalty_count/empty_final_answer": 0.0,
        },
        {  # all placeholders: counts toward nothing
            "finalize/reward_count": 0.0,
            "finalize/penalty_count/duplicated_reasoning": 0.0,
            "finalize/penalty_count/empty_final_answer": 0.0,
        },
    ]
    assert aggregate_capture_reward_metrics(collect(groups)) == pytest.approx(
        {
            "reasoning_equal_to_final_answer_rate": 1 / 3,
            "empty_final_answer_rate": 0.0,
            "total_reward/mean": 0.5,
            "total_reward/stddev": 0.5,
            "total_reward/min": 0.0,
            "total_reward/max": 1.0,
        }
    )
    assert aggregate_capture_reward_metrics(collect([groups[2]])) == {}
    assert aggregate_capture_reward_metrics({}) == {}


def test_group_reward_metrics_records_sums_for_enabled_penalties_only() -> None:
    settings = CaptureRewardSettings.from_configs(penalties={"penalize_empty_final_answer": True})
    metrics = group_reward_metrics(
        [outcome(1.0), outcome(0.0, empty_final_answer=1, duplicated_reasoning=1), outcome(0.5)],
        settings=settings,
    )
    assert metrics == {
        "finalize/reward_count": 3.0,
        "finalize/reward_sum": 1.5,
        "finalize/reward_sumsq": 1.25,
        "finalize/reward_min": 0.0,
        "finalize/reward_max": 1.0,
        "finalize/penalty_count/empty_final_answer": 1.0,
    }
    assert group_reward_metrics([], settings=settings) == {
        "finalize/reward_count": 0.0,
        "finalize/penalty_count/empty_final_answer": 0.0,
    }


def test_metric_pooling_single_row_reports_nan_stddev_and_no_disabled_keys() -> None:
    group = group_reward_metrics([outcome(0.25)], settings=CaptureRewardSettings())
    result = aggregate_capture_reward_metrics(collect([group]))
    assert set(result) == {
        "total_reward/mean",
        "total_reward/stddev",
        "total_reward/min",
        "total_reward/max",
    }
    assert math.isnan(result["total_reward/stddev"])  # type: ignore[arg-type]
    assert (result["total_reward/mean"], result["total_reward/min"]) == (0.25, 0.25)


EFFORT_SETTINGS = CaptureRewardSettings.from_configs(
    effort={"low_weight": 1.0, "low_penalty": 1.0, "low_ub": 2000, "low_string": "/low"}
)


def effort_group(low: list[int], high: list[int]) -> dict[str, float]:
    """Finalize reward-1.0 rows of the given terminal lengths, as the finalizer would."""
    outcomes = []
    for low_effort, lengths in ((True, low), (False, high)):
        checks = RewardChecks(
            duplicated_reasoning=False, empty_final_answer=False, low_effort=low_effort
        )
        for length in lengths:
            outcomes.append(
                finalize_capture_reward(
                    1.0,
                    settings=EFFORT_SETTINGS,
                    checks=checks,
                    token_ids=[1, *([2] * length)],
                    link_spans=[("c0", 1, length)],
                )
            )
    return group_reward_metrics(outcomes, settings=EFFORT_SETTINGS)


def test_metric_pooling_mixes_low_and_high_effort_groups() -> None:
    groups = [effort_group([100, 300], [50]), effort_group([200], [150, 250, 1000])]
    result = aggregate_capture_reward_metrics(collect(groups))
    assert result["mean_length_low"] == pytest.approx(200.0)
    assert result["median_length_low"] == 200.0
    assert result["mean_length_high"] == pytest.approx(362.5)
    assert result["median_length_high"] == 200.0  # (150 + 250) / 2 across groups
    assert result["mean_length_reward_low"] == pytest.approx(0.9)  # 1 - 200/2000
    assert result["mean_reward_low"] == pytest.approx(1.9)
    high_only = aggregate_capture_reward_metrics(collect([effort_group([], [10])]))
    assert "mean_length_low" not in high_only and "mean_reward_low" not in high_only
    assert high_only["median_length_high"] == 10.0


def test_exact_effort_metrics_pool_unequal_groups_through_checkpoint() -> None:
    groups = [
        effort_group([900, 950, 1000], [250, 250]),
        effort_group([800, 1200], [100, 400]),
    ]
    # The sidecar stores each group's metrics; a msgpack round trip stands in for it here.
    restored = [
        msgspec.msgpack.decode(msgspec.msgpack.encode(group), type=dict[str, float])
        for group in groups
    ]
    assert restored == groups
    result = aggregate_capture_reward_metrics(collect(restored))
    # Averaging the groups' own medians would give 975 and 250; pooling rows gives 950.
    assert result["median_length_low"] == 950.0
    assert result["median_length_high"] == 250.0
    assert result["mean_length_low"] == pytest.approx(970.0)
    assert result["mean_length_high"] == pytest.approx(250.0)
    assert result["mean_length_reward_low"] == pytest.approx(0.515)
    assert result["mean_reward_low"] == pytest.approx(1.515)
    assert result["total_reward/mean"] == pytest.approx((5 * 1.515 + 4) / 9)


def test_effort_bucket_names_must_carry_a_length() -> None:
    metrics = collect([effort_group([5], [])])
    metrics["finalize/effort/low/abc"] = [1.0]
    with pytest.raises(InvalidStateError, match="nonnegative integer length"):
        aggregate_capture_reward_metrics(metrics)
    metrics = collect([effort_group([5], [])])
    metrics["finalize/effort/low/5"] = [0.5]
    with pytest.raises(InvalidStateError, match="whole row counts"):
        aggregate_capture_reward_metrics(metrics)


def test_pooling_refuses_counts_without_sums() -> None:
    with pytest.raises(InvalidStateError, match="finalize/reward_sum"):
        aggregate_capture_reward_metrics({"finalize/reward_count": [2.0]})


def observation(
    sample: str, reward: float, agent: str | None = None, full: dict[str, Any] | None = None
) -> FinalizedReward:
    context = None
    if agent is not None:
        context = RewardLogContext(
            agent_name=agent, full_result_json=None if full is None else json.dumps(full)
        )
    return FinalizedReward(
        sample_id=sample, rollout_id=f"{sample}_a00ff", reward=reward, log_context=context
    )


def test_final_reward_distribution_and_agent_tables_are_pooled_exactly() -> None:
    group_a = [
        observation("a_g0", 1.0, "math"),
        observation("a_g1", 0.0, "math"),
        observation("a_g2", 0.5, "code"),
    ]
    group_b = [observation("b_g0", 0.25, "code", full={"reward": 0.9, "trace": "x y"})]
    group_c = [observation("c_g3", 2.0)]
    groups = [group_a, group_b, group_c]
    metrics = collect(
        group_reward_metrics([outcome(o.reward) for o in g], settings=CaptureRewardSettings())
        for g in groups
    )
    observations = [o for g in groups for o in g]
    result = aggregate_capture_reward_metrics(metrics, observations)

    assert result["total_reward/median"] == 0.5
    assert result["total_reward/histogram"] == [0.0, 0.25, 0.5, 1.0, 2.0]
    assert result["total_reward/count"] == 5.0
    assert result["total_reward/mean"] == pytest.approx(0.75)
    assert result["total_reward/stddev"] == pytest.approx(statistics.stdev([1, 0, 0.5, 0.25, 2]))
    assert result["math/reward/mean"] == 0.5
    assert result["math/reward/median"] == 0.5
    assert result["math/reward/stddev"] == pytest.approx(math.sqrt(0.5))
    assert result["math/reward/histogram"] == [0.0, 1.0]
    assert result["code/reward/count"] == 2.0
    assert result["code/reward/min"] == 0.25
    assert result["code/reward/max"] == 0.5
    assert not any(key.startswith("None/") for key in result)

    tables = capture_reward_result_tables(observations)
    assert list(tables) == ["code/full_result"]
    (row_text,) = tables["code/full_result"]
    assert " " not in row_text.replace("x y", "")  # compact separators
    assert json.loads(row_text) == {
        "reward": 0.25,  # the final reward, not the 0.9 the agent reported
        "trace": "x y",
        "ng_rollout_id": "b_g0_a00ff",
        "sample_id": "b_g0",
    }

    with pytest.raises(InvalidStateError) as info:
        aggregate_capture_reward_metrics(metrics, observations[:-1])
    assert str(info.value).startswith(
        "finalized reward observations must match the valid-row count"
    )


# --- properties ---------------------------------------------------------------------------

ALL_ON = CaptureRewardSettings.from_configs(
    penalties={
        "penalize_duplicated_reasoning": True,
        "penalize_empty_final_answer": True,
        "penalize_unwanted_tokens": True,
        "token_ids": {"unwanted": [7]},
    },
    effort={"low_weight": 0.5, "low_penalty": 2.0, "low_ub": 40, "low_string": "/low"},
)

row_strategy = st.tuples(
    st.floats(min_value=-10, max_value=10, allow_nan=False),  # raw reward
    st.booleans(),  # duplicated reasoning
    st.booleans(),  # empty final answer
    st.booleans(),  # low effort
    st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=60),  # generated
)


@given(st.lists(st.lists(row_strategy, max_size=6), min_size=1, max_size=6))
def test_metric_pooling_over_random_groups_equals_pooling_all_rows(
    groups: list[list[tuple[float, bool, bool, bool, list[int]]]],
) -> None:
    group_metrics = []
    all_rows: list[tuple[CaptureRewardOutcome, bool, int]] = []
    for group in groups:
        outcomes = []
        for raw, duplicated, empty, low, generated in group:
            checks = RewardChecks(
                duplicated_reasoning=duplicated, empty_final_answer=empty, low_effort=low
            )
            result = finalize_capture_reward(
                raw,
                settings=ALL_ON,
                checks=checks,
                token_ids=[1, *generated],
                link_spans=[("c0", 1, len(generated))],
            )
            outcomes.append(result)
            all_rows.append((result, low, len(generated)))
        group_metrics.append(group_reward_metrics(outcomes, settings=ALL_ON))
    pooled = aggregate_capture_reward_metrics(collect(group_metrics))

    if not all_rows:
        assert pooled == {}
        return
    rewards = [row.reward for row, _, _ in all_rows]
    n = len(rewards)
    expected: dict[str, float] = {
        "total_reward/mean": math.fsum(rewards) / n,
        "total_reward/min": min(rewards),
        "total_reward/max": max(rewards),
        "reasoning_equal_to_final_answer_rate": sum(
            r.counts["duplicated_reasoning"] for r, _, _ in all_rows
        )
        / n,
        "empty_final_answer_rate": sum(r.counts["empty_final_answer"] for r, _, _ in all_rows) / n,
        "unwanted_token_rate": sum(r.counts["unwanted_token"] for r, _, _ in all_rows) / n,
    }
    for bucket, is_low in (("low", True), ("high", False)):
        lengths = [length for _, low, length in all_rows if low is is_low]
        if lengths:
            expected[f"mean_length_{bucket}"] = statistics.fmean(lengths)
            expected[f"median_length_{bucket}"] = float(statistics.median(lengths))
    low_rows = [row for row, low, _ in all_rows if low]
    if low_rows:
        expected["mean_length_reward_low"] = statistics.fmean(
            row.metrics["finalize/effort/length_reward_sum"] for row in low_rows
        )
        expected["mean_reward_low"] = statistics.fmean(
            row.metrics["finalize/effort/reward_sum"] for row in low_rows
        )
    stddev = pooled.pop("total_reward/stddev")
    assert pooled == pytest.approx(expected, rel=1e-9, abs=1e-9)
    if n == 1:
        assert math.isnan(stddev)  # type: ignore[arg-type]
    else:
        # Sufficient statistics lose a little precision to cancellation; that is all.
        assert stddev == pytest.approx(statistics.stdev(rewards), rel=1e-6, abs=1e-6)
