"""Per-group finalizer metrics beyond the reward sums (upstream §2.8 item 2).

Everything is a per-group count or a per-group rate over the group's own rows, as upstream
logs them; reward statistics come from :func:`rollout_recovery.rewards.group_reward_metrics`
so that they pool exactly across groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..capture import Rejection

__all__ = [
    "CALLS_PER_ROLLOUT",
    "CAPTURE_POISONED_ROLLOUTS",
    "INVALID_ROW_RATE",
    "MASK_SAMPLE_COUNT",
    "REWARD_PROCESSING",
    "TEXT_ROOT_CALLS",
    "TOKEN_IN_CALLS",
    "TOKEN_IN_RATE",
    "capture_metrics",
    "failure_reason_metric",
]

INVALID_ROW_RATE: Final = "finalize/invalid_row_rate"
CALLS_PER_ROLLOUT: Final = "finalize/calls_per_rollout"
TOKEN_IN_CALLS: Final = "finalize/token_in_calls"
TEXT_ROOT_CALLS: Final = "finalize/text_root_calls"
TOKEN_IN_RATE: Final = "finalize/token_in_rate"
CAPTURE_POISONED_ROLLOUTS: Final = "finalize/capture_poisoned_rollouts"
MASK_SAMPLE_COUNT: Final = "finalize/mask_sample_count"
# The bucket of placeholders whose capture verified but whose reward could not be finalized.
REWARD_PROCESSING: Final = "reward_processing"


def failure_reason_metric(bucket: str) -> str:
    """``finalize/capture_failure_reason_{bucket}_count``; the bucket is a rejection code
    (never its detail, which names keys and would explode the metric namespace)."""
    return f"finalize/capture_failure_reason_{bucket}_count"


def capture_metrics(
    *,
    total_rows: int,
    failure_buckets: Sequence[str],
    valid_manifests: Sequence[Sequence[Mapping[str, Any]]],
    rejections: Sequence[Rejection],
    mask_sample_count: int,
) -> dict[str, float]:
    """Counts and rates of one group.

    ``failure_buckets`` has one entry per placeholder; ``valid_manifests`` the verified
    receipt manifests of the valid rows (every call, dead branches included, as upstream
    counts them); ``rejections`` the capture rejections among the placeholders.
    """
    metrics: dict[str, float] = {
        INVALID_ROW_RATE: len(failure_buckets) / total_rows,
        CAPTURE_POISONED_ROLLOUTS: float(
            sum(rejection.code == "capture_poisoned" for rejection in rejections)
        ),
        MASK_SAMPLE_COUNT: float(mask_sample_count),
    }
    for bucket in failure_buckets:
        name = failure_reason_metric(bucket)
        metrics[name] = metrics.get(name, 0.0) + 1.0
    if valid_manifests:
        calls = [entry for manifest in valid_manifests for entry in manifest]
        token_in = sum(entry.get("mode") == "token_in" for entry in calls)
        metrics[CALLS_PER_ROLLOUT] = len(calls) / len(valid_manifests)
        metrics[TOKEN_IN_CALLS] = float(token_in)
        metrics[TEXT_ROOT_CALLS] = float(len(calls) - token_in)
        metrics[TOKEN_IN_RATE] = token_in / len(calls)
    return metrics
