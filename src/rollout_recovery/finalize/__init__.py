"""Finalization: sealed receipts and staged rows -> exactly N canonical rows; GRPO advantages.

:func:`finalize_group` verifies and linearizes each sibling's receipt against its staged
rows, finalizes rewards (shape, then penalize) and builds the group's N canonical rows,
masked placeholders included; it only reads. :func:`publish_finalized_group` runs it inside
the caller's ``group_commits`` cut and hands ownership from the ledger to the replay index.
:func:`grpo_advantages` computes one group's advantages with placeholders masked out.
"""

from ._advantages import ADVANTAGE_EPSILON, grpo_advantages
from ._group import FINALIZABLE_STATUSES, finalize_group
from ._metrics import (
    CALLS_PER_ROLLOUT,
    CAPTURE_POISONED_ROLLOUTS,
    INVALID_ROW_RATE,
    MASK_SAMPLE_COUNT,
    REWARD_PROCESSING,
    TEXT_ROOT_CALLS,
    TOKEN_IN_CALLS,
    TOKEN_IN_RATE,
    failure_reason_metric,
)
from ._publish import publish_finalized_group
from ._result import FinalizedGroup, SiblingOutcome

__all__ = [
    "ADVANTAGE_EPSILON",
    "CALLS_PER_ROLLOUT",
    "CAPTURE_POISONED_ROLLOUTS",
    "FINALIZABLE_STATUSES",
    "INVALID_ROW_RATE",
    "MASK_SAMPLE_COUNT",
    "REWARD_PROCESSING",
    "TEXT_ROOT_CALLS",
    "TOKEN_IN_CALLS",
    "TOKEN_IN_RATE",
    "FinalizedGroup",
    "SiblingOutcome",
    "failure_reason_metric",
    "finalize_group",
    "grpo_advantages",
    "publish_finalized_group",
]
