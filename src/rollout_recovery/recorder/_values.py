"""What a caller hands the recorder and gets back: staged calls, outputs, sealed siblings.

Plain frozen values. Everything in them must be JSON (the journal and the data plane keep
them without pickling), checked when the recorder takes them, so a bad value is refused
with the group and sibling it was for, before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = [
    "SealedSibling",
    "SiblingOutput",
    "StagedCall",
    "TakenPrompt",
    "canonical_digest",
    "check_output",
    "check_staged_call",
    "output_from_plain",
    "output_to_plain",
]


@dataclass(frozen=True, slots=True)
class StagedCall:
    """One model call of an unfinished sibling: what was sent and what came back."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]
    logprobs: list[float] | None = None
    weight_version: int | None = None
    #: The peer's own fields for the call (JSON).
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SiblingOutput:
    """A finished sibling: the tokens the caller's trainer trains on, and its reward."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float] | None = None
    reward: float | None = None
    weight_version: int | None = None
    #: The peer's own fields (JSON): the text, verl's ``min/max_global_steps``, ...
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SealedSibling:
    """A sealed sibling's stored output (as sealed, never regenerated)."""

    sibling: int
    rollout_id: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float] | None
    reward: float | None
    weight_version: int | None
    extra: dict[str, Any]

    def output(self) -> SiblingOutput:
        return SiblingOutput(
            prompt_token_ids=list(self.prompt_token_ids),
            completion_token_ids=list(self.completion_token_ids),
            logprobs=None if self.logprobs is None else list(self.logprobs),
            reward=self.reward,
            weight_version=self.weight_version,
            extra=dict(self.extra),
        )


@dataclass(frozen=True, slots=True)
class TakenPrompt:
    """A prompt's group: which siblings are sealed (their outputs) and which unsealed ones
    have staged calls to continue from."""

    group_id: str
    key: str
    sealed: Mapping[int, SealedSibling]
    staged: Mapping[int, Sequence[StagedCall]]
    aliases: Sequence[str] = ()
    group_size: int = 0
    #: Marked trained (and not made trainable again by a restore): the caller's next
    #: occurrence of this row (another epoch) is another key.
    trained: bool = False

    @property
    def unsealed(self) -> list[int]:
        """The siblings still to generate (or to continue), in order."""
        return [index for index in range(self.group_size) if index not in self.sealed]


def canonical_digest(value: object, *, what: str) -> str:
    """The sha256 of ``value``'s canonical JSON (sorted keys, no spaces)."""
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as error:
        raise InvalidArgumentTypeError(f"{what} is not JSON: {error}") from None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _token_ids(value: object, *, what: str) -> list[int]:
    if not isinstance(value, list) or not all(
        type(token) is int and 0 <= token < 2**31 for token in value
    ):
        raise InvalidArgumentTypeError(
            f"{what} must be a list of token ids (ints in [0, 2**31)), got {type(value).__name__}"
        )
    return value


def _logprobs(value: object, length: int, *, what: str) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in value
    ):
        raise InvalidArgumentTypeError(f"{what} must be None or a list of finite floats")
    if len(value) != length:
        raise InvalidArgumentError(f"{what} has {len(value)} values for {length} tokens")
    return [float(x) for x in value]


def _version(value: object, *, what: str) -> int | None:
    if value is not None and (type(value) is not int or not 0 <= value < 2**63):
        raise InvalidArgumentTypeError(f"{what} must be None or an int >= 0, got {value!r}")
    return value


def _extra(value: object, *, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgumentTypeError(f"{what} must be a dict, got {type(value).__name__}")
    canonical_digest(value, what=what)
    # A copy through JSON: what the journal will give back (tuples become lists).
    copied: dict[str, Any] = json.loads(json.dumps(value))
    return copied


def check_staged_call(call: object, *, where: str) -> StagedCall:
    """``call`` checked and copied; ``where`` names the group and sibling in errors."""
    if not isinstance(call, StagedCall):
        raise InvalidArgumentTypeError(f"{where}: expected a StagedCall, got {type(call).__name__}")
    output = _token_ids(call.output_token_ids, what=f"{where}: output_token_ids")
    return StagedCall(
        prompt_token_ids=list(_token_ids(call.prompt_token_ids, what=f"{where}: prompt_token_ids")),
        output_token_ids=list(output),
        logprobs=_logprobs(call.logprobs, len(output), what=f"{where}: logprobs"),
        weight_version=_version(call.weight_version, what=f"{where}: weight_version"),
        extra=_extra(call.extra, what=f"{where}: extra"),
    )


def check_output(output: object, *, where: str) -> SiblingOutput:
    """``output`` checked and copied; ``where`` names the group and sibling in errors."""
    if not isinstance(output, SiblingOutput):
        raise InvalidArgumentTypeError(
            f"{where}: expected a SiblingOutput, got {type(output).__name__}"
        )
    completion = _token_ids(output.completion_token_ids, what=f"{where}: completion_token_ids")
    reward = output.reward
    if reward is not None and (
        not isinstance(reward, int | float) or isinstance(reward, bool) or not math.isfinite(reward)
    ):
        raise InvalidArgumentTypeError(f"{where}: reward must be None or a finite float")
    return SiblingOutput(
        prompt_token_ids=list(
            _token_ids(output.prompt_token_ids, what=f"{where}: prompt_token_ids")
        ),
        completion_token_ids=list(completion),
        logprobs=_logprobs(output.logprobs, len(completion), what=f"{where}: logprobs"),
        reward=None if reward is None else float(reward),
        weight_version=_version(output.weight_version, what=f"{where}: weight_version"),
        extra=_extra(output.extra, what=f"{where}: extra"),
    )


def output_to_plain(output: SiblingOutput) -> dict[str, Any]:
    """The output as the seal's receipt holds it."""
    return {
        "prompt_token_ids": output.prompt_token_ids,
        "completion_token_ids": output.completion_token_ids,
        "logprobs": output.logprobs,
        "reward": output.reward,
        "weight_version": output.weight_version,
        "extra": output.extra,
    }


def output_from_plain(plain: Mapping[str, Any], *, sibling: int, rollout_id: str) -> SealedSibling:
    """A sealed sibling from its receipt's output (as :func:`output_to_plain` wrote it)."""
    return SealedSibling(
        sibling=sibling,
        rollout_id=rollout_id,
        prompt_token_ids=list(plain["prompt_token_ids"]),
        completion_token_ids=list(plain["completion_token_ids"]),
        logprobs=None if plain["logprobs"] is None else list(plain["logprobs"]),
        reward=plain["reward"],
        weight_version=plain["weight_version"],
        extra=dict(plain["extra"]),
    )
