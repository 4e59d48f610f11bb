"""A tabular softmax policy in numpy, and the immutable snapshot generation samples from.

Two tables of logits, both conditioned on the prompt's hidden digit ``d``:
``thought_logits[d]`` over the thought tokens and ``answer_logits[d]`` over the ten answer
digits. ``EOS`` after the answer is emitted deterministically (logprob 0.0).

Exactness is the point of this module: the logprob a sampler reports must be the logprob
the trainer recomputes from the canonical row, or the importance ratio is wrong from the
first token. So both read the *same* precomputed log-softmax tables, and a token's context
(digit, kind, column) is derived from the row alone (:func:`row_token_contexts`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError
from ._tasks import (
    ANSWER,
    ANSWER_TOKENS,
    DIGIT_BASE,
    EOS,
    NUM_DIGITS,
    NUM_THOUGHT,
    THOUGHT_BASE,
    VOCAB_SIZE,
    correct_answer,
    digit_token,
    prompt_digit,
)

__all__ = [
    "KIND_ANSWER",
    "KIND_FIXED",
    "KIND_PROMPT",
    "KIND_THOUGHT",
    "PARAM_SHAPES",
    "PolicySnapshot",
    "initial_params",
    "log_softmax",
    "row_token_contexts",
]

# Parameter tables, by name. Rows are indexed by the prompt digit.
PARAM_SHAPES: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {
        "thought_logits": (NUM_DIGITS, NUM_THOUGHT),
        "answer_logits": (NUM_DIGITS, NUM_DIGITS),
    }
)

# Token kinds in a row, as row_token_contexts reports them.
KIND_PROMPT = -1  # carried (mask 0): no logprob, no gradient
KIND_FIXED = 0  # generated deterministically (EOS): logprob 0.0, no parameters
KIND_THOUGHT = 1  # column of thought_logits
KIND_ANSWER = 2  # column of answer_logits


def log_softmax(logits: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Row-wise log-softmax, shifted by the row max for stability."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    out: npt.NDArray[np.float64] = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


def initial_params(seed: int, init_std: float) -> dict[str, npt.NDArray[np.float64]]:
    """Near-uniform starting logits; ``init_std`` 0 gives exactly uniform tables."""
    rng = np.random.default_rng(seed)
    return {
        name: rng.normal(0.0, init_std, size=shape) if init_std > 0 else np.zeros(shape)
        for name, shape in PARAM_SHAPES.items()
    }


def row_token_contexts(
    token_ids: Sequence[int] | npt.NDArray[np.integer],
    token_mask: Sequence[float] | npt.NDArray[np.floating],
) -> tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(digit, kinds, columns)`` of one linearized row, from the row alone.

    ``digit`` is the prompt's hidden digit; ``kinds[i]`` is one of the ``KIND_*`` codes and
    ``columns[i]`` the token's column in its table (0 where it has none). Raises
    ``ValueError`` for a row this policy cannot have produced: mismatched lengths, a mask
    value other than 0/1, no prompt digit, or a generated token outside the action space.
    """
    ids = np.asarray(token_ids)
    mask = np.asarray(token_mask)
    if ids.ndim != 1 or mask.shape != ids.shape:
        raise InvalidArgumentError(
            f"token_ids and token_mask must be 1-D of equal length, got {ids.shape} and "
            f"{mask.shape}"
        )
    if not np.isin(mask, (0.0, 1.0)).all():
        raise InvalidArgumentError("token_mask must hold only 0.0 and 1.0")
    generated = mask == 1.0
    ids64 = ids.astype(np.int64)
    kinds = np.full(ids.shape, KIND_PROMPT, dtype=np.int64)
    columns = np.zeros(ids.shape, dtype=np.int64)
    thought = generated & (ids64 >= THOUGHT_BASE) & (ids64 < THOUGHT_BASE + NUM_THOUGHT)
    answer = generated & (ids64 >= DIGIT_BASE) & (ids64 < DIGIT_BASE + NUM_DIGITS)
    fixed = generated & (ids64 == EOS)
    kinds[thought] = KIND_THOUGHT
    columns[thought] = ids64[thought] - THOUGHT_BASE
    kinds[answer] = KIND_ANSWER
    columns[answer] = ids64[answer] - DIGIT_BASE
    kinds[fixed] = KIND_FIXED
    stray = generated & ~(thought | answer | fixed)
    if stray.any():
        position = int(np.flatnonzero(stray)[0])
        raise InvalidArgumentError(
            f"generated token {int(ids64[position])} at position {position} is not an action "
            "of this policy"
        )
    prompt = ids64[~generated]
    return prompt_digit(prompt), kinds, columns


def _frozen(array: npt.ArrayLike) -> npt.NDArray[np.float64]:
    out = np.array(array, dtype=np.float64, copy=True)
    out.setflags(write=False)
    return out


def _sample(logprobs: npt.NDArray[np.float64], rng: np.random.Generator) -> int:
    # Inverse CDF on exp(logprobs); the reported logprob is then read from the same table.
    cdf = np.cumsum(np.exp(logprobs))
    choice = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(choice, int(logprobs.shape[0]) - 1)


class PolicySnapshot:
    """Immutable policy weights at ``version``: what ``Trainer.weights()`` hands out.

    Arrays are copied and read-only, so a backend may keep a snapshot while training goes
    on. Sampling methods return token ids with their exact logprobs (Python floats).
    """

    __slots__ = ("_logprobs", "_params", "_version")

    # The ids a prompt may hold and the policy may emit: 0 to vocab_size - 1.
    vocab_size: ClassVar[int] = VOCAB_SIZE
    # The name and shape of every parameter table (what a weight push must hold).
    param_shapes: ClassVar[Mapping[str, tuple[int, ...]]] = PARAM_SHAPES

    def __init__(self, version: int, params: Mapping[str, npt.ArrayLike]) -> None:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise InvalidArgumentError(f"version must be a non-negative int, got {version!r}")
        if set(params) != set(PARAM_SHAPES):
            raise InvalidArgumentError(
                f"params must have exactly the keys {sorted(PARAM_SHAPES)}, got {sorted(params)}"
            )
        frozen: dict[str, npt.NDArray[np.float64]] = {}
        for name, shape in PARAM_SHAPES.items():
            array = _frozen(params[name])
            if array.shape != shape or not np.isfinite(array).all():
                raise InvalidArgumentError(f"param {name!r} must be finite with shape {shape}")
            frozen[name] = array
        self._version = version
        self._params: Mapping[str, npt.NDArray[np.float64]] = MappingProxyType(frozen)
        # Computed once: sampling and recomputation must read identical numbers.
        self._logprobs: Mapping[str, npt.NDArray[np.float64]] = MappingProxyType(
            {name: _frozen(log_softmax(array)) for name, array in frozen.items()}
        )

    def __repr__(self) -> str:
        return f"PolicySnapshot(version={self._version})"

    @property
    def version(self) -> int:
        return self._version

    @property
    def params(self) -> Mapping[str, npt.NDArray[np.float64]]:
        """The read-only parameter tables."""
        return self._params

    @property
    def thought_logprobs(self) -> npt.NDArray[np.float64]:
        """Read-only ``[digit, thought]`` log-softmax table."""
        return self._logprobs["thought_logits"]

    @property
    def answer_logprobs(self) -> npt.NDArray[np.float64]:
        """Read-only ``[digit, answer]`` log-softmax table."""
        return self._logprobs["answer_logits"]

    def sample_reasoning(
        self, digit: int, count: int, rng: np.random.Generator
    ) -> tuple[list[int], list[float]]:
        """``count`` thought tokens for a prompt with ``digit``, and their logprobs."""
        table = self.thought_logprobs[digit]
        columns = [_sample(table, rng) for _ in range(count)]
        return [THOUGHT_BASE + c for c in columns], [float(table[c]) for c in columns]

    def sample_answer(self, digit: int, rng: np.random.Generator) -> tuple[list[int], list[float]]:
        """``[answer digit token, EOS]`` and their logprobs (EOS is deterministic: 0.0)."""
        table = self.answer_logprobs[digit]
        column = _sample(table, rng)
        return [digit_token(column), EOS], [float(table[column]), 0.0]

    def sample_continuation(
        self, prompt_ids: Sequence[int], max_tokens: int, rng: np.random.Generator
    ) -> tuple[list[int], list[float]]:
        """What the policy generates after ``prompt_ids`` (token in, token out): after an
        ``ANSWER`` tag its answer (``[digit, EOS]``, cut to ``max_tokens``), anywhere else
        ``max_tokens`` thought tokens; every token conditioned on the prompt's digit."""
        digit = prompt_digit(prompt_ids)
        if int(prompt_ids[-1]) == ANSWER:
            tokens, logprobs = self.sample_answer(digit, rng)
            return tokens[:max_tokens], logprobs[:max_tokens]
        return self.sample_reasoning(digit, max_tokens, rng)

    @staticmethod
    def continuation_length(prompt_ids: Sequence[int], max_tokens: int) -> int:
        """How many tokens :meth:`sample_continuation` generates after ``prompt_ids``."""
        answer = PolicySnapshot.answer_length(prompt_ids)
        return max_tokens if answer is None else min(answer, max_tokens)

    def sample_next(
        self, prompt_ids: Sequence[int], generated: Sequence[int], rng: np.random.Generator
    ) -> tuple[int, float] | None:
        """The token at position ``len(generated)`` of the continuation of ``prompt_ids``
        and its logprob, or None where the continuation ends (after the answer's EOS).

        Token by token, the same rule and the same draws as :meth:`sample_continuation`
        (one draw per sampled token, none for EOS): a caller may switch snapshots between
        tokens, as a server does when new weights arrive under a call in flight.
        """
        digit = prompt_digit(prompt_ids)
        if int(prompt_ids[-1]) != ANSWER:
            table = self.thought_logprobs[digit]
            column = _sample(table, rng)
            return THOUGHT_BASE + column, float(table[column])
        if not generated:
            table = self.answer_logprobs[digit]
            column = _sample(table, rng)
            return digit_token(column), float(table[column])
        if len(generated) == 1:
            return EOS, 0.0
        return None

    @staticmethod
    def answer_length(prompt_ids: Sequence[int]) -> int | None:
        """How many tokens the policy answers after ``prompt_ids`` (its answer ends with its
        EOS), or None when the prompt does not ask for the answer (the policy then thinks
        for as many tokens as it is given)."""
        return ANSWER_TOKENS if int(prompt_ids[-1]) == ANSWER else None

    def logprob_row(self, digit: int, token: int) -> npt.NDArray[np.float64]:
        """The full-vocabulary log distribution the policy sampled ``token`` from, after a
        prompt with ``digit``: ``-inf`` for every token it could not emit there."""
        row = np.full(VOCAB_SIZE, -math.inf)
        if THOUGHT_BASE <= token < THOUGHT_BASE + NUM_THOUGHT:
            row[THOUGHT_BASE : THOUGHT_BASE + NUM_THOUGHT] = self.thought_logprobs[digit]
        elif DIGIT_BASE <= token < DIGIT_BASE + NUM_DIGITS:
            row[DIGIT_BASE : DIGIT_BASE + NUM_DIGITS] = self.answer_logprobs[digit]
        else:  # EOS after the answer: deterministic
            row[EOS] = 0.0
        return row

    def token_logprobs(
        self,
        token_ids: Sequence[int] | npt.NDArray[np.integer],
        token_mask: Sequence[float] | npt.NDArray[np.floating],
    ) -> npt.NDArray[np.float64]:
        """Logprob under these params of every generated token (mask 1) of a whole row.

        Carried tokens get 0.0. Raises ``ValueError`` as :func:`row_token_contexts` does.
        """
        digit, kinds, columns = row_token_contexts(token_ids, token_mask)
        out = np.zeros(kinds.shape, dtype=np.float64)
        thought = kinds == KIND_THOUGHT
        answer = kinds == KIND_ANSWER
        out[thought] = self.thought_logprobs[digit, columns[thought]]
        out[answer] = self.answer_logprobs[digit, columns[answer]]
        return out

    def expected_accuracy(self) -> float:
        """Probability of a correct answer, averaged over the ten digits (a cheap eval)."""
        correct = [correct_answer(d) for d in range(NUM_DIGITS)]
        probs = np.exp(self.answer_logprobs[np.arange(NUM_DIGITS), correct])
        return float(probs.mean())

    def as_arrays(self) -> dict[str, npt.NDArray[Any]]:
        """Writable copies of the params plus the version, e.g. for ``np.savez``."""
        out: dict[str, npt.NDArray[Any]] = {n: np.array(a) for n, a in self._params.items()}
        out["version"] = np.array(self._version, dtype=np.int64)
        return out
