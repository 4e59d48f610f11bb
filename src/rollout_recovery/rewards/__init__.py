r"""Reward records, checks, settings, shaping and penalties for token-capture rollouts.

Seal time: :meth:`RewardChecks.from_result` turns the agent's text into
:class:`RewardChecks`. Finalization: :meth:`CaptureRewardSettings.finalize_reward` shapes,
then penalizes, the raw reward of a verified row (walking its link spans) under
the run's settings; :meth:`CaptureRewardSettings.group_metrics` records per-group sums that
``aggregate_capture_reward_metrics`` pools exactly.
"""

from ._checks import RewardChecks
from ._final_reward import CaptureRewardOutcome
from ._records import FinalizedReward, RewardLogContext, parse_reward_log_context
from ._settings import CaptureRewardSettings

__all__ = [
    "CaptureRewardOutcome",
    "CaptureRewardSettings",
    "FinalizedReward",
    "RewardChecks",
    "RewardLogContext",
    "parse_reward_log_context",
]
