"""The generation rule: token ids in, the policy's tokens and exact logprobs out.

A prompt is a list of ids of the policy's vocabulary holding the task's digit. After an
``ANSWER`` tag the policy answers (``[digit, EOS]``, cut to ``max_tokens``); anywhere else it
thinks (``max_tokens`` thought tokens). Each reported logprob is read from the snapshot's
own table, so it is the logprob the trainer recomputes for that token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError
from ..policy import PolicySnapshot, TaskSet
from ._api_error import bad_request, schema_error

__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP",
    "LOGPROB_FLOOR",
    "MAX_TOP_LOGPROBS",
    "Generation",
    "check_prompt",
    "generate",
    "generation_of",
]

# vLLM's default --max-logprobs: the most top logprobs one position may ask for.
MAX_TOP_LOGPROBS = 20
# What the OpenAI shapes report for a token of probability 0 (vLLM clamps -inf to it).
LOGPROB_FLOOR = -9999.0

FINISH_LENGTH = "length"
FINISH_STOP = "stop"


@dataclass(frozen=True, slots=True)
class Generation:
    """One sampled continuation.

    Only when logprobs were asked for: ``ranks[i]`` is the sampled token's rank at position
    ``i`` (1 + the number of tokens more likely than it, as vLLM counts), and
    ``top_logprobs[i]`` the position's ``k`` most likely tokens as ``(token id, logprob,
    rank)``, most likely first, ties in id order. A token the policy cannot emit at a
    position has logprob ``LOGPROB_FLOOR`` there.
    """

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int] | None
    top_logprobs: list[list[tuple[int, float, int]]] | None
    finish_reason: str
    weight_version: int
    #: The weight version of each token (a call paused and resumed under new weights
    #: holds two or more); ``weight_version`` is the last token's.
    token_versions: list[int]


def check_prompt(prompt: Sequence[int], *, param: str) -> int:
    """The prompt's digit; a 400 for an id outside the vocabulary or a prompt without digit.

    ``prompt`` holds ints already (the request parser checked the JSON types); ``param``
    is the request field that holds it. An id outside the vocabulary is refused with
    vLLM's message, then where it is.
    """
    if not prompt:
        raise bad_request("Prompt cannot be empty", param=param)
    for position, token in enumerate(prompt):
        if token < 0:
            raise schema_error(
                f"Input should be greater than or equal to 0 ({param}[{position}] is {token})",
                field=f"{param}.{position}",
            )
        if token >= PolicySnapshot.vocab_size:
            raise bad_request(
                f"Token id {token} is out of vocabulary ({param}[{position}]; the policy's "
                f"ids are 0 to {PolicySnapshot.vocab_size - 1})"
            )
    try:
        return TaskSet.prompt_digit(prompt)
    except InvalidArgumentError:
        raise bad_request(
            f"{param} holds no digit token: the policy conditions every token on the "
            "prompt's digit",
            param=param,
        ) from None


def _clamped(logprob: float) -> float:
    return max(float(logprob), LOGPROB_FLOOR)


def _rank(row: npt.NDArray[np.float64], token: int) -> int:
    return int(np.count_nonzero(row > row[token])) + 1


def _top(row: npt.NDArray[np.float64], k: int) -> list[tuple[int, float, int]]:
    # A stable sort of -row keeps equal logprobs in id order.
    ranked = (int(t) for t in np.argsort(-row, kind="stable")[:k])
    return [(t, _clamped(row[t]), _rank(row, t)) for t in ranked]


def generate(
    snapshot: PolicySnapshot,
    prompt: Sequence[int],
    *,
    digit: int,
    max_tokens: int,
    rng: np.random.Generator,
    top_k: int | None,
    ignore_eos: bool = False,
) -> Generation:
    """Sample ``max_tokens`` tokens at most after ``prompt`` (whose digit is ``digit``).

    ``top_k`` None reports no candidates; 0 reports the sampled token only. An answer
    finishes for ``stop`` at its EOS, or for ``length`` when cut before it or when
    ``ignore_eos`` (EOS then stops nothing: ``max_tokens`` does, as in vLLM).
    """
    tokens, logprobs = snapshot.sample_continuation(prompt, max_tokens, rng)
    return generation_of(
        prompt,
        tokens,
        logprobs,
        [snapshot] * len(tokens),
        digit=digit,
        top_k=top_k,
        ignore_eos=ignore_eos,
        last=snapshot,
    )


def generation_of(
    prompt: Sequence[int],
    tokens: list[int],
    logprobs: list[float],
    snapshots: Sequence[PolicySnapshot],
    *,
    digit: int,
    top_k: int | None,
    ignore_eos: bool,
    last: PolicySnapshot,
) -> Generation:
    """The :class:`Generation` of ``tokens``, token ``i`` sampled from ``snapshots[i]``
    (ranks and candidates read from that snapshot's tables); ``last`` names the version
    of a generation without tokens."""
    answer_length = last.answer_length(prompt)
    if answer_length is not None:
        # An answer stops at its EOS, its last token: a shorter one was cut by max_tokens.
        stopped = len(tokens) == answer_length and not ignore_eos
        finish = FINISH_STOP if stopped else FINISH_LENGTH
    else:
        finish = FINISH_LENGTH
    ranks, top = None, None
    if top_k is not None:
        rows = [snap.logprob_row(digit, t) for snap, t in zip(snapshots, tokens, strict=True)]
        ranks = [_rank(row, t) for row, t in zip(rows, tokens, strict=True)]
        top = [_top(row, top_k) for row in rows]
    return Generation(
        token_ids=tokens,
        logprobs=[_clamped(lp) for lp in logprobs],
        ranks=ranks,
        top_logprobs=top,
        finish_reason=finish,
        weight_version=snapshots[-1].version if snapshots else last.version,
        token_versions=[snap.version for snap in snapshots],
    )
