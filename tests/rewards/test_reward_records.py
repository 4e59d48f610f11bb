"""Reward records (the package's surface is pinned in test_subpackage_api.py)."""

from __future__ import annotations

import pytest

from rollout_recovery.errors import InvalidStateError
from rollout_recovery.rewards import FinalizedReward, RewardChecks, RewardLogContext
from rollout_recovery.rewards._penalties import CAPTURE_PENALTIES


def test_penalty_specs_keep_upstream_order_and_names() -> None:
    assert [(p.name, p.flag, p.metric, p.kind) for p in CAPTURE_PENALTIES] == [
        (
            "duplicated_reasoning",
            "penalize_duplicated_reasoning",
            "reasoning_equal_to_final_answer_rate",
            "text",
        ),
        ("empty_final_answer", "penalize_empty_final_answer", "empty_final_answer_rate", "text"),
        ("unwanted_token", "penalize_unwanted_tokens", "unwanted_token_rate", "token"),
    ]


def test_reward_checks_require_exact_booleans() -> None:
    with pytest.raises(InvalidStateError, match=r"^reward checks must be booleans"):
        RewardChecks(duplicated_reasoning=1, empty_final_answer=False, low_effort=False)  # type: ignore[arg-type]


def test_finalized_reward_round_trip_and_rejections() -> None:
    context = RewardLogContext(agent_name="math", full_result_json='{"a": 1}')
    value = FinalizedReward(sample_id="g_g0", rollout_id="g_g0_a1", reward=0.5, log_context=context)
    assert FinalizedReward.from_state_dict(value.state_dict()) == value
    with pytest.raises(InvalidStateError, match=r"^finalized reward must be numeric"):
        FinalizedReward(sample_id="g_g0", rollout_id="r", reward=True)
    with pytest.raises(InvalidStateError, match="log_context must be a RewardLogContext"):
        FinalizedReward(
            sample_id="g_g0",
            rollout_id="r",
            reward=1.0,
            log_context={"agent_name": "math", "full_result_json": None},  # type: ignore[arg-type]
        )
    with pytest.raises(InvalidStateError, match=r"^invalid finalized reward observation"):
        FinalizedReward.from_state_dict({"sample_id": "g_g0"})
    with pytest.raises(
        InvalidStateError, match=r"^reward log full_result_json must encode an object"
    ):
        RewardLogContext(agent_name="math", full_result_json="[1]")
