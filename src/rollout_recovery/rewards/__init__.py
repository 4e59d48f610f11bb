r"""Reward records, checks, settings, shaping and penalties for token-capture rollouts.

Seal time: :func:`compute_reward_checks` turns the agent's text into :class:`RewardChecks`.
Finalization: :func:`finalize_capture_reward` shapes, then penalizes, the raw reward of a
verified row (walking its :class:`LinkSpan`\ s) under the run's
:class:`CaptureRewardSettings`; :func:`group_reward_metrics` records per-group sums that
:func:`aggregate_capture_reward_metrics` pools exactly.
"""

from ._checks import compute_reward_checks
from ._final_reward import CaptureRewardOutcome, LinkSpan, finalize_capture_reward
from ._metrics import group_reward_metrics
from ._records import FinalizedReward, RewardChecks, RewardLogContext, parse_reward_log_context
from ._settings import CaptureRewardSettings

__all__ = [
    "CaptureRewardOutcome",
    "CaptureRewardSettings",
    "FinalizedReward",
    "LinkSpan",
    "RewardChecks",
    "RewardLogContext",
    "compute_reward_checks",
    "finalize_capture_reward",
    "group_reward_metrics",
    "parse_reward_log_context",
]
