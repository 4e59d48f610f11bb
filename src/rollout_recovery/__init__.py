"""rollout-recovery: crash-safe ownership of GRPO prompt groups for asynchronous RL."""

__version__ = "0.1.0"
