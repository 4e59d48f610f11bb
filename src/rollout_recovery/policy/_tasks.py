"""The synthetic task set: one hidden digit per prompt, answered by a fixed rule.

Every prompt carries a digit ``d``; the correct answer is ``correct_answer(d)``, a fixed
bijection on 0-9 the policy has to discover from rewards alone. The whole vocabulary is
defined here, in one place, as contiguous id ranges, so a token's kind is readable from
its id alone: the policy recomputes logprobs from a canonical row without any side data.

Prompt layout: ``[BOS, filler..., DIGIT(d), filler..., THINK]``. The environment then
generates thought tokens, carries an ``ANSWER`` tag, and generates ``DIGIT(answer), EOS``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from .._datasets import item_rng
from ..errors import InvalidArgumentError
from ._config import TaskConfig

__all__ = [
    "ANSWER",
    "ANSWER_TOKENS",
    "BOS",
    "DIGIT_BASE",
    "EOS",
    "FILLER_BASE",
    "NUM_DIGITS",
    "NUM_FILLER",
    "NUM_THOUGHT",
    "THINK",
    "THOUGHT_BASE",
    "VOCAB_SIZE",
    "TaskSet",
    "correct_answer",
    "digit_token",
    "prompt_digit",
    "render",
]

# Specials.
BOS = 0
THINK = 1
ANSWER = 2
EOS = 3
# What an answer is: the answer digit, then EOS.
ANSWER_TOKENS = 2
# Digits 0-9: both the prompt's hidden digit and the answer the policy emits.
DIGIT_BASE = 4
NUM_DIGITS = 10
# Thought tokens: what the reasoning call generates. They do not change the reward; they
# make every episode a genuine two-call chain with several generated tokens to train on.
THOUGHT_BASE = DIGIT_BASE + NUM_DIGITS
NUM_THOUGHT = 8
# Filler tokens: prompt noise, so prompts with the same digit still differ.
FILLER_BASE = THOUGHT_BASE + NUM_THOUGHT
NUM_FILLER = 16
VOCAB_SIZE = FILLER_BASE + NUM_FILLER

_SPECIAL_TEXT = {BOS: "<bos>", THINK: "<think>", ANSWER: "<answer>", EOS: "<eos>"}
# Thoughts render as words so a reasoning summary never equals an answer's text (which
# would trip the duplicated-reasoning reward check).
_THOUGHT_WORDS = ("hmm", "so", "then", "maybe", "carry", "add", "wait", "check")
assert len(_THOUGHT_WORDS) == NUM_THOUGHT

_MIN_FILLER = 2
_MAX_FILLER = 6


def correct_answer(digit: int) -> int:
    """The hidden rule: ``(3 * d + 7) % 10``, a bijection, so no answer is a free guess."""
    return (3 * digit + 7) % NUM_DIGITS


def digit_token(digit: int) -> int:
    """The token id of digit ``digit`` (0-9)."""
    if not 0 <= digit < NUM_DIGITS:
        raise InvalidArgumentError(f"digit must be in [0, {NUM_DIGITS}), got {digit!r}")
    return DIGIT_BASE + digit


def _render_one(token: int) -> str:
    if token in _SPECIAL_TEXT:
        return _SPECIAL_TEXT[token]
    if DIGIT_BASE <= token < DIGIT_BASE + NUM_DIGITS:
        return str(token - DIGIT_BASE)
    if THOUGHT_BASE <= token < THOUGHT_BASE + NUM_THOUGHT:
        return _THOUGHT_WORDS[token - THOUGHT_BASE]
    if FILLER_BASE <= token < FILLER_BASE + NUM_FILLER:
        return f"w{token - FILLER_BASE}"
    return f"<unk:{token}>"


def render(token_ids: Iterable[int] | np.ndarray[Any, Any]) -> str:
    """Readable text for token ids, space separated; unknown ids render as ``<unk:id>``."""
    return " ".join(_render_one(int(token)) for token in token_ids)


class TaskSet:
    """A deterministic map-style dataset of ``size`` prompts.

    ``dataset[idx]`` is a fresh payload dict; the same ``(seed, idx)`` always gives an equal
    payload, because the controller rebuilds prompts from the dataset after a restart and
    the ledger checks them by ``idx`` and ``task_name``. Every ``prompt_group_every``-th
    prompt is tagged ``task_source="atomic"`` (the controller finalizes those as a whole
    prompt group) and the rest ``"arith"``.
    """

    @classmethod
    def from_config(cls, task: TaskConfig, *, seed: int) -> TaskSet:
        """The prompt set ``[task]`` describes, drawn from the job's ``seed`` (the job and
        every Ray worker build it here, so they agree on every prompt)."""
        return cls(task.dataset_size, seed=seed, prompt_group_every=task.prompt_group_every)

    # The turns of an episode in the task's own tokens, so an environment asks for them
    # without knowing the vocabulary: how many tokens an answer is...
    answer_tokens: ClassVar[int] = ANSWER_TOKENS

    @staticmethod
    def render(token_ids: Iterable[int] | np.ndarray[Any, Any]) -> str:
        """Readable text for the task's token ids (what a server's reply text shows)."""
        return render(token_ids)

    @staticmethod
    def prompt_digit(token_ids: Sequence[int] | np.ndarray[Any, Any]) -> int:
        """The hidden digit of a prompt or row (a server samples its answer from it)."""
        return prompt_digit(token_ids)

    @staticmethod
    def thinking_prompt(token_ids: Sequence[int]) -> list[int]:
        """``token_ids`` (everything so far) extended to ask for more thinking."""
        return [*token_ids, THINK]

    @staticmethod
    def answer_prompt(token_ids: Sequence[int]) -> list[int]:
        """``token_ids`` (everything so far) extended to ask for the answer."""
        return [*token_ids, ANSWER]

    @staticmethod
    def answer_digit(answer: Sequence[int]) -> int | None:
        """The digit an answer's first token says, or None (no token, or not a digit)."""
        if not answer or not DIGIT_BASE <= int(answer[0]) < DIGIT_BASE + NUM_DIGITS:
            return None
        return int(answer[0]) - DIGIT_BASE

    def __init__(self, size: int, *, seed: int, prompt_group_every: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidArgumentError(f"size must be a positive int, got {size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InvalidArgumentError(f"seed must be a non-negative int, got {seed!r}")
        if (
            isinstance(prompt_group_every, bool)
            or not isinstance(prompt_group_every, int)
            or prompt_group_every < 1
        ):
            raise InvalidArgumentError(
                f"prompt_group_every must be a positive int, got {prompt_group_every!r}"
            )
        self._size = size
        self._seed = seed
        self._prompt_group_every = prompt_group_every

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def prompt_group_every(self) -> int:
        return self._prompt_group_every

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return (
            f"TaskSet(size={self._size}, seed={self._seed}, "
            f"prompt_group_every={self._prompt_group_every})"
        )

    def __getitem__(self, idx: int) -> dict[str, Any]:
        idx, rng = item_rng(idx, size=self._size, seed=self._seed)
        digit = int(rng.integers(NUM_DIGITS))
        filler = rng.integers(FILLER_BASE, FILLER_BASE + NUM_FILLER, size=_MAX_FILLER)
        count = int(rng.integers(_MIN_FILLER, _MAX_FILLER + 1))
        cut = int(rng.integers(count + 1))
        prompt = [
            BOS,
            *(int(t) for t in filler[:cut]),
            digit_token(digit),
            *(int(t) for t in filler[cut:count]),
            THINK,
        ]
        atomic = idx % self._prompt_group_every == 0
        return {
            "idx": idx,
            "task_name": None,
            "task_source": "atomic" if atomic else "arith",
            "prompt_token_ids": prompt,
            "digit": digit,
            "answer": correct_answer(digit),
            "messages": [{"role": "user", "content": render(prompt)}],
        }


def prompt_digit(token_ids: Sequence[int] | np.ndarray[Any, Any]) -> int:
    """The hidden digit of a row: its first digit token (the prompt holds exactly one)."""
    for token in token_ids:
        value = int(token)
        if DIGIT_BASE <= value < DIGIT_BASE + NUM_DIGITS:
            return value - DIGIT_BASE
    raise InvalidArgumentError("row has no digit token in its prompt")
