"""``[task]`` and ``[policy]``: the prompt set and the numpy policy's update rule.

Both are the job's identity: they change what is trained.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from .._settings import NonNegativeInt, PositiveFloat, PositiveInt, Section

__all__ = ["PolicyConfig", "TaskConfig", "TaskKind"]

TaskKind = Literal["digits", "emit_token"]


class TaskConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[task]``: the prompt set, how an episode is graded and the shape of its episodes.

    ``"digits"`` is the synthetic agent task (thinking calls, then an answer digit) of
    the numpy policy, simulated agents and HTTP servers; ``"emit_token"`` is the LLM task
    (``llm.EmitTokenTask``): a prompt of random tokens, ``max_tokens`` sampled tokens, the
    reward the share of them equal to ``target_token``.
    """

    kind: TaskKind = "digits"
    dataset_size: PositiveInt = 4096
    #: Every k-th prompt uses prompt_group granularity, the rest sibling granularity
    #: ("digits").
    prompt_group_every: PositiveInt = 4
    #: The token id the reward counts ("emit_token"); below the model's vocabulary. 313 is
    #: the tiny Llama's most likely first token (p about 0.004).
    target_token: NonNegativeInt = 313
    #: Tokens sampled per attempt ("emit_token").
    max_tokens: Annotated[int, Meta(ge=1, le=4096)] = 8
    #: Model calls an episode thinks in before its answer call (the answer makes one
    #: more): a lost attempt can be continued from its last staged call.
    thinking_calls: PositiveInt = 3
    #: Thought tokens each thinking call generates.
    reasoning_tokens: PositiveInt = 4


class PolicyConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[policy]``: the toy policy's update rule."""

    learning_rate: PositiveFloat = 0.2
    clip_epsilon: PositiveFloat = 0.2
