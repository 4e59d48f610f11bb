"""``[task]`` and ``[policy]``: the prompt set and the numpy policy's update rule.

Both are the job's identity: they change what is trained (but for where a dataset's
files are: ``[task] path`` may move, ``[task] digest`` says which files they are).
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from .._settings import (
    IDENTITY_WHEN_SET,
    OPERATIONAL,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Section,
)

__all__ = ["PolicyConfig", "TaskConfig", "TaskKind"]

TaskKind = Literal["digits", "emit_token", "dataset"]

# A column name of a dataset (the `datasets` library takes any non-empty string).
# The dataset task's fields came after runs existed: at their defaults they leave a run's
# identity fingerprint as it was (IDENTITY_WHEN_SET).
_Field = Annotated[str, Meta(min_length=1, max_length=256), IDENTITY_WHEN_SET]
_Digest = Annotated[str, Meta(pattern=r"^([0-9a-f]{64})?$"), IDENTITY_WHEN_SET]


class TaskConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[task]``: the prompt set, how an episode is graded and the shape of its episodes.

    ``"digits"`` is the synthetic agent task (thinking calls, then an answer digit) of
    the numpy policy, simulated agents and HTTP servers; ``"emit_token"`` is the LLM task
    (``llm.EmitTokenTask``): a prompt of random tokens, ``max_tokens`` sampled tokens, the
    reward the share of them equal to ``target_token``. ``"dataset"`` is your own data
    for the torch trainer: each row of the file or directory at ``path`` is a prompt (its
    ``prompt_field``, or the chat of its ``messages_field``, rendered by the model
    tokenizer's chat template), ``max_tokens`` tokens are sampled after it, and ``[reward]
    function`` scores them, given the row's other fields.
    """

    kind: TaskKind = "digits"
    #: How many prompts there are ("digits", "emit_token"). For "dataset", the dataset's
    #: row count, taken from the data at the first start and recorded in the run
    #: directory's job.toml (like ``digest``).
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
    #: The dataset ("dataset"): a JSONL, JSON, Parquet or CSV file (by its suffix), or a
    #: directory written by the `datasets` library's ``save_to_disk``. Relative to the
    #: config file's directory. It may move: ``digest`` says which data it is.
    path: Annotated[str, OPERATIONAL] = ""
    #: The column holding each row's prompt text ("dataset"); rendered as one user
    #: message by the model tokenizer's chat template (as is, without a template).
    prompt_field: _Field = "prompt"
    #: When set, the column holding each row's chat, a list of ``{"role", "content"}``
    #: messages, rendered by the chat template instead of ``prompt_field``.
    messages_field: Annotated[str, Meta(max_length=256), IDENTITY_WHEN_SET] = ""
    #: The split of a ``save_to_disk`` directory holding several ("dataset").
    split: _Field = "train"
    #: sha256 of the dataset's files and of the model's tokenizer files (what the
    #: prompts' tokens are made of). "" takes it at the first start and records it in the
    #: run directory's job.toml; a later start against other data is refused.
    digest: _Digest = ""


class PolicyConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[policy]``: the toy policy's update rule."""

    learning_rate: PositiveFloat = 0.2
    clip_epsilon: PositiveFloat = 0.2
