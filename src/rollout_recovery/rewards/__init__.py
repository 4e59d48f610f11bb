"""Reward records, checks, shaping and penalties for token-capture rollouts."""

from ._records import FinalizedReward, RewardChecks, RewardLogContext, parse_reward_log_context

__all__ = [
    "FinalizedReward",
    "RewardChecks",
    "RewardLogContext",
    "parse_reward_log_context",
]
