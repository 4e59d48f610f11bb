"""``[task]`` and ``[policy]``: the synthetic task set and the numpy policy's update rule.

Both are the job's identity: they change what is trained.
"""

from __future__ import annotations

from .._settings import PositiveFloat, PositiveInt, Section

__all__ = ["PolicyConfig", "TaskConfig"]


class TaskConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[task]``: the simulated prompt set and the shape of its episodes."""

    dataset_size: PositiveInt = 4096
    #: Every k-th prompt uses prompt_group granularity, the rest sibling granularity.
    prompt_group_every: PositiveInt = 4
    #: Model calls an episode thinks in before its answer call (the answer makes one
    #: more): a lost attempt can be continued from its last staged call.
    thinking_calls: PositiveInt = 3
    #: Thought tokens each thinking call generates.
    reasoning_tokens: PositiveInt = 4


class PolicyConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[policy]``: the toy policy's update rule."""

    learning_rate: PositiveFloat = 0.2
    clip_epsilon: PositiveFloat = 0.2
