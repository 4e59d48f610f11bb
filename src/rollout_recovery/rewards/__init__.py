"""Reward records, checks, settings, shaping and penalties for token-capture rollouts.

Seal time: :func:`compute_reward_checks` turns the agent's text into :class:`RewardChecks`.
Finalization: :func:`finalize_capture_reward` shapes, then penalizes, the raw reward of a
verified row under the run's :class:`CaptureRewardSettings`; :func:`group_reward_metrics`
records per-group sums that :func:`aggregate_capture_reward_metrics` pools exactly.
"""

from ._checks import (
    compute_reward_checks,
    has_duplicated_reasoning,
    has_empty_final_answer,
    is_low_effort,
)
from ._final_reward import (
    CaptureRewardOutcome,
    LinkSpan,
    effort_length_metric,
    finalize_capture_reward,
    generated_segments,
    has_unwanted_tokens,
    shape_effort_reward,
)
from ._metrics import (
    MetricValue,
    aggregate_capture_reward_metrics,
    capture_reward_result_tables,
    group_reward_metrics,
)
from ._records import FinalizedReward, RewardChecks, RewardLogContext, parse_reward_log_context
from ._settings import (
    CAPTURE_PENALTIES,
    CaptureOptionalPenalty,
    CapturePenalty,
    CaptureRewardSettings,
    EffortRewardSettings,
    effort_shaping_enabled,
)

__all__ = [
    "CAPTURE_PENALTIES",
    "CaptureOptionalPenalty",
    "CapturePenalty",
    "CaptureRewardOutcome",
    "CaptureRewardSettings",
    "EffortRewardSettings",
    "FinalizedReward",
    "LinkSpan",
    "MetricValue",
    "RewardChecks",
    "RewardLogContext",
    "aggregate_capture_reward_metrics",
    "capture_reward_result_tables",
    "compute_reward_checks",
    "effort_length_metric",
    "effort_shaping_enabled",
    "finalize_capture_reward",
    "generated_segments",
    "group_reward_metrics",
    "has_duplicated_reasoning",
    "has_empty_final_answer",
    "has_unwanted_tokens",
    "is_low_effort",
    "parse_reward_log_context",
    "shape_effort_reward",
]
