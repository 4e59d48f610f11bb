"""``rollout-recovery chaos``: kill the real job at random moments and at named crash
points, rerun it to the end, and audit it."""

from ._chaos import run_chaos

__all__ = ["run_chaos"]
