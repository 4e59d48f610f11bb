"""Wire dialects: how one token-in, token-out model call looks on each server's HTTP API.

A dialect builds a request body for a :class:`CallSpec` and reads the reply back into a
:class:`ServerReply`, cross-checking everything the server echoes: a reply that disagrees
with itself or with the request is a *data* failure (:class:`DataFailure`), never silently
repaired, because a retokenized or misaligned call would train on tokens the policy did not
sample.

A reply is untrusted bytes. :func:`read_body` reads at most a byte cap of it and stops
there (``reply_too_large``); a dialect decodes it with msgspec into its own typed structs,
so a body that is not JSON, not UTF-8, nested past msgspec's recursion bound or of another
shape is one failure, ``malformed_reply``, and the fields a dialect does not read are
skipped, never built. Every token id, generated or echoed, must lie in the trainer's
vocabulary ``[0, vocab_size)`` (``token_out_of_vocab``, naming the id and its position):
a row the trainer would refuse never reaches staging, so no checkpoint can hold one.

- :class:`VllmCompletions`: ``POST /v1/completions`` with a token-id prompt,
  ``return_token_ids`` and ``return_tokens_as_token_ids``; the echoed ``prompt_token_ids``,
  the ``token_ids`` and the ``token_id:N`` logprob tokens must agree.
- :class:`VllmGenerate`: ``POST /inference/v1/generate`` (vLLM with ``--enable-scale-out``),
  which also reports per-token weight-version spans.
- :class:`SglangGenerate`: SGLang's ``POST /generate`` with ``input_ids`` and
  ``return_logprob``; ``meta_info.output_token_logprobs`` must name the ``output_ids`` and
  ``meta_info.weight_version`` is the server's version.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol, TypeVar

import httpx
import msgspec
import numpy as np

from .._http import read_capped
from ._episode import CallFailed

__all__ = [
    "DIALECTS",
    "CallSpec",
    "DataError",
    "DataFailure",
    "Dialect",
    "DialectName",
    "ServerReply",
    "SglangGenerate",
    "VllmCompletions",
    "VllmGenerate",
    "error_message",
    "error_payload",
    "read_body",
]

DialectName = Literal["vllm-completions", "vllm-generate", "sglang"]

_T = TypeVar("_T")


class DataError(StrEnum):
    """Why a server's answer to a call cannot be trained on; the sealed receipt's
    ``failure_reason`` is ``data_error:<value>`` (``data_error:http_<status>`` for a
    refusal), so the values are an on-disk format."""

    #: The request leaves the model no room (the server's own refusal says so).
    CONTEXT_OVERFLOW = "context_overflow"
    #: Another 4xx: the request was refused; its code is ``http_<status>``.
    HTTP_REFUSED = "http"
    #: Longer than the reply byte cap.
    REPLY_TOO_LARGE = "reply_too_large"
    #: Not JSON of the dialect's shape, not UTF-8, or nested too deeply.
    MALFORMED_REPLY = "malformed_reply"
    #: A token id outside the trainer's vocabulary ``[0, vocab_size)``.
    TOKEN_OUT_OF_VOCAB = "token_out_of_vocab"
    #: Ids, logprobs, echo or spans that disagree with each other or with the request.
    TOKEN_MISMATCH = "token_mismatch"
    #: A logprob that is not a finite number <= 0.
    INVALID_LOGPROBS = "invalid_logprobs"
    #: The server generated no token.
    EMPTY_GENERATION = "empty_generation"
    #: Tokens whose weight version is not one of ours (later than the trainer's newest,
    #: or no version at all), or no spans where every token's version is needed
    #: (``on_weight_update = "interrupt"``).
    UNVERSIONED_TOKENS = "unversioned_tokens"
    #: Tokens of weights older than the server confirmed loading before the call: it
    #: acknowledged a push it never loaded.
    WEIGHT_VERSION_MISMATCH = "weight_version_mismatch"


class DataFailure(CallFailed):
    """The server answered, but the answer cannot be trained on: a failed attempt.

    ``reason`` says why (a :class:`DataError`); ``code`` is what ends up in the
    placeholder's reason (``data_error:<code>``): the reason's value, or ``http_<status>``
    for a refusal. ``detail`` says what exactly disagreed. ``blames_server`` is False
    where the request was refused (a 4xx, a context overflow: any server would refuse it)
    and True where the reply itself is unusable, which counts against the server's
    health. Raised by a model client, it ends the episode as a sealed failed attempt.
    """

    def __init__(
        self,
        reason: DataError,
        detail: str,
        *,
        blames_server: bool = True,
        status: int | None = None,
    ) -> None:
        code = f"http_{status}" if reason is DataError.HTTP_REFUSED else reason.value
        super().__init__(f"data_error:{code}", detail)
        self.reason = reason
        self.code = code
        self.blames_server = blames_server


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSpec:
    """One model call: the whole prompt as token ids and the sampling parameters."""

    prompt_token_ids: Sequence[int]
    max_tokens: int
    temperature: float = 1.0
    seed: int | None = None

    def sampling_params(self) -> dict[str, Any]:
        """What is recorded with the call (and sent, in each dialect's own names)."""
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
            "ignore_eos": True,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerReply:
    """A checked reply: the generated ids, one logprob per id, and what the server said of
    its own weights (``None`` where the dialect reports nothing)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    server_weight_version: str | None = None
    weight_version_spans: list[dict[str, Any]] | None = field(default=None)


class Dialect(Protocol):
    name: DialectName
    path: str

    def body(self, model: str, call: CallSpec) -> dict[str, Any]: ...

    def parse(self, call: CallSpec, raw: bytes, *, vocab_size: int) -> ServerReply:
        """The checked reply in ``raw`` (the body's bytes); raises :class:`DataFailure`."""
        ...


# ------------------------------------------------------------------ reading a reply


async def read_body(response: httpx.Response, cap: int) -> bytes:
    """The body of a streamed ``response``, refused past ``cap`` bytes (as decoded).

    Raises ``DataFailure(DataError.REPLY_TOO_LARGE)`` as soon as the declared length or the bytes
    read pass the cap; the caller's closing of the stream then drops the connection
    without reading the rest.
    """
    body = await read_capped(response, cap)
    if body is None:
        raise DataFailure(
            DataError.REPLY_TOO_LARGE, f"the reply is longer than the cap of {cap} bytes"
        )
    return body


def _decode(raw: bytes, shape: type[_T]) -> _T:
    try:
        return msgspec.json.decode(raw, type=shape)
    except msgspec.ValidationError as error:
        raise DataFailure(DataError.MALFORMED_REPLY, f"unexpected shape: {error}") from None
    except msgspec.DecodeError as error:
        raise DataFailure(DataError.MALFORMED_REPLY, f"not JSON: {error}") from None
    except RecursionError:
        # msgspec's own depth bound (it raises before the stack is at risk).
        raise DataFailure(DataError.MALFORMED_REPLY, "nested too deeply") from None


def error_payload(raw: bytes) -> object:
    """An error reply's body as plain data for :func:`error_message`; where it is not
    JSON (an HTML page, a proxy's text, something nested too deeply), its first 500
    characters."""
    try:
        payload: object = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return raw[:500].decode("utf-8", errors="replace")
    return payload


def error_message(payload: object) -> str:
    """The message of an error body, in vLLM's new (``{"error": {...}}``), vLLM's old
    (``{"object": "error", "message": ...}``) or SGLang's shape; else the body itself."""
    if isinstance(payload, Mapping):
        inner = payload.get("error")
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
        if isinstance(payload.get("message"), str):
            return str(payload["message"])
        if isinstance(payload.get("detail"), str):
            return str(payload["detail"])
    return repr(payload)[:500]


# ---------------------------------------------------------------- shared cross-checks


def _in_vocab(token_ids: list[int], where: str, vocab_size: int) -> list[int]:
    # The trainer's vocabulary, which also keeps every id inside the int32 rows store.
    for position, token in enumerate(token_ids):
        if not 0 <= token < vocab_size:
            raise DataFailure(
                DataError.TOKEN_OUT_OF_VOCAB,
                f"{where}[{position}] is {token}, outside the vocabulary [0, {vocab_size})",
            )
    return token_ids


def _checked_logprobs(values: list[float], where: str) -> list[float]:
    # Rows store float32: a logprob must stay finite there, and be a log-probability.
    array = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore"):
        bad = ~np.isfinite(array.astype(np.float32)) | (array > 0.0)
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise DataFailure(
            DataError.INVALID_LOGPROBS, f"{where}[{position}] is {values[position]!r}"
        )
    return values


def _only(choices: list[_T]) -> _T:
    if len(choices) != 1:
        raise DataFailure(DataError.MALFORMED_REPLY, f"choices has {len(choices)} elements, not 1")
    return choices[0]


def _check_generated(call: CallSpec, token_ids: list[int], logprobs: list[float]) -> None:
    if not token_ids:
        raise DataFailure(DataError.EMPTY_GENERATION, "the server generated no token")
    if len(token_ids) > call.max_tokens:
        raise DataFailure(
            DataError.TOKEN_MISMATCH,
            f"{len(token_ids)} tokens generated, max_tokens was {call.max_tokens}",
        )
    if len(logprobs) != len(token_ids):
        raise DataFailure(
            DataError.TOKEN_MISMATCH,
            f"{len(logprobs)} logprobs for {len(token_ids)} generated tokens",
        )


def _check_prompt_echo(
    call: CallSpec, echoed: list[int] | None, where: str, vocab_size: int
) -> None:
    if echoed is None:
        raise DataFailure(DataError.MALFORMED_REPLY, f"{where} is missing")
    if _in_vocab(echoed, where, vocab_size) != list(call.prompt_token_ids):
        raise DataFailure(
            DataError.TOKEN_MISMATCH,
            f"{where} does not echo the {len(call.prompt_token_ids)} sent ids",
        )


_TOKEN_ID = re.compile(r"token_id:(-?[0-9]{1,20})")


def _parse_token_id_tokens(tokens: list[str], where: str) -> list[int]:
    """vLLM's ``return_tokens_as_token_ids`` logprob tokens, ``"token_id:N"``."""
    ids: list[int] = []
    for i, token in enumerate(tokens):
        match = _TOKEN_ID.fullmatch(token)
        if match is None:
            raise DataFailure(
                DataError.TOKEN_MISMATCH, f"{where}[{i}] is {token[:40]!r}, not 'token_id:N'"
            )
        ids.append(int(match.group(1)))
    return ids


class _VersionSpan(msgspec.Struct, kw_only=True):
    version: str | int | None = None
    start: int
    end: int


def _version_spans(value: list[_VersionSpan] | None, generated: int) -> list[dict[str, Any]] | None:
    """vLLM's ``weight_versions``: contiguous ``{version, start, end}`` spans covering every
    generated token, in order."""
    if value is None:
        return None
    if not value:
        raise DataFailure(DataError.MALFORMED_REPLY, "weight_versions is an empty list")
    spans: list[dict[str, Any]] = []
    position = 0
    for i, span in enumerate(value):
        if span.start != position or span.end <= span.start:
            raise DataFailure(
                DataError.TOKEN_MISMATCH,
                f"weight_versions[{i}] does not continue at token {position}",
            )
        spans.append({"version": str(span.version), "start": span.start, "end": span.end})
        position = span.end
    if position != generated:
        raise DataFailure(
            DataError.TOKEN_MISMATCH,
            f"weight_versions cover {position} of {generated} generated tokens",
        )
    return spans


# ------------------------------------------------------------------------- dialects


class _CompletionLogprobs(msgspec.Struct, kw_only=True):
    tokens: list[str]
    token_logprobs: list[float]


class _CompletionChoice(msgspec.Struct, kw_only=True):
    token_ids: list[int]
    logprobs: _CompletionLogprobs
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None


class _Completion(msgspec.Struct, kw_only=True):
    choices: list[_CompletionChoice]
    # Where the chat endpoints put the echo.
    prompt_token_ids: list[int] | None = None


class VllmCompletions:
    """vLLM's ``/v1/completions``, token in (also what ``rollout-recovery serve`` offers)."""

    name: DialectName = "vllm-completions"
    path = "/v1/completions"

    def body(self, model: str, call: CallSpec) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(call.prompt_token_ids),
            "max_tokens": call.max_tokens,
            "temperature": call.temperature,
            "logprobs": 0,
            "ignore_eos": True,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if call.seed is not None:
            body["seed"] = call.seed
        return body

    def parse(self, call: CallSpec, raw: bytes, *, vocab_size: int) -> ServerReply:
        reply = _decode(raw, _Completion)
        choice = _only(reply.choices)
        # vLLM puts the echo on the choice; accept the chat endpoints' top-level place too.
        echoed = choice.prompt_token_ids
        if echoed is None:
            echoed = reply.prompt_token_ids
        _check_prompt_echo(call, echoed, "prompt_token_ids", vocab_size)
        token_ids = _in_vocab(choice.token_ids, "choices[0].token_ids", vocab_size)
        logprob_ids = _parse_token_id_tokens(choice.logprobs.tokens, "logprobs.tokens")
        if logprob_ids != token_ids:
            raise DataFailure(
                DataError.TOKEN_MISMATCH, "logprobs.tokens name other ids than choices[0].token_ids"
            )
        values = _checked_logprobs(choice.logprobs.token_logprobs, "logprobs.token_logprobs")
        _check_generated(call, token_ids, values)
        return ServerReply(token_ids=token_ids, logprobs=values, finish_reason=choice.finish_reason)


class _GenerateLogprob(msgspec.Struct, kw_only=True):
    token_id: int
    logprob: float


class _GenerateLogprobs(msgspec.Struct, kw_only=True):
    content: list[_GenerateLogprob]


class _GenerateChoice(msgspec.Struct, kw_only=True):
    token_ids: list[int]
    logprobs: _GenerateLogprobs
    weight_versions: list[_VersionSpan] | None = None
    finish_reason: str | None = None


class _Generate(msgspec.Struct, kw_only=True):
    choices: list[_GenerateChoice]
    prompt_token_ids: list[int] | None = None


class VllmGenerate:
    """vLLM's ``/inference/v1/generate``: token in, token out, with weight-version spans.

    Shapes as recorded from vLLM 0.32 (``tests/fixtures/vllm/generate*.json``): the prompt
    echo is top-level ``prompt_token_ids`` (with a top-level ``return_token_ids``), the
    spans are the choice's ``weight_versions``, logprobs are
    ``{"content": [{"token_id": N, "logprob": x, "rank": r, ...}]}``.
    """

    name: DialectName = "vllm-generate"
    path = "/inference/v1/generate"

    def body(self, model: str, call: CallSpec) -> dict[str, Any]:
        sampling: dict[str, Any] = {
            "max_tokens": call.max_tokens,
            "temperature": call.temperature,
            "logprobs": 0,
            "ignore_eos": True,
        }
        if call.seed is not None:
            sampling["seed"] = call.seed
        return {
            "model": model,
            "token_ids": list(call.prompt_token_ids),
            "return_token_ids": True,
            "sampling_params": sampling,
        }

    def parse(self, call: CallSpec, raw: bytes, *, vocab_size: int) -> ServerReply:
        reply = _decode(raw, _Generate)
        choice = _only(reply.choices)
        _check_prompt_echo(call, reply.prompt_token_ids, "prompt_token_ids", vocab_size)
        token_ids = _in_vocab(choice.token_ids, "choices[0].token_ids", vocab_size)
        entries = choice.logprobs.content
        if [entry.token_id for entry in entries] != token_ids:
            raise DataFailure(
                DataError.TOKEN_MISMATCH,
                "logprobs.content names other ids than choices[0].token_ids",
            )
        values = _checked_logprobs(
            [entry.logprob for entry in entries], "logprobs.content[].logprob"
        )
        _check_generated(call, token_ids, values)
        spans = _version_spans(choice.weight_versions, len(token_ids))
        return ServerReply(
            token_ids=token_ids,
            logprobs=values,
            finish_reason=choice.finish_reason,
            server_weight_version=None if spans is None else spans[-1]["version"],
            weight_version_spans=spans,
        )


class _SglangToken(msgspec.Struct, array_like=True):
    # [logprob, token_id, text or null]; the text (and anything after) is not read.
    logprob: float
    token_id: int


class _SglangFinish(msgspec.Struct):
    type: str | None = None


class _SglangMeta(msgspec.Struct, kw_only=True):
    output_token_logprobs: list[_SglangToken]
    prompt_tokens: int | None = None
    weight_version: str | int | None = None
    finish_reason: _SglangFinish | str | None = None


class _Sglang(msgspec.Struct, kw_only=True):
    output_ids: list[int]
    meta_info: _SglangMeta


class SglangGenerate:
    """SGLang's native ``/generate`` with ``input_ids`` and ``return_logprob``."""

    name: DialectName = "sglang"
    path = "/generate"

    def body(self, model: str, call: CallSpec) -> dict[str, Any]:
        sampling: dict[str, Any] = {
            "max_new_tokens": call.max_tokens,
            "temperature": call.temperature,
            "ignore_eos": True,
        }
        if call.seed is not None:
            sampling["sampling_seed"] = call.seed
        return {
            "input_ids": list(call.prompt_token_ids),
            "sampling_params": sampling,
            "return_logprob": True,
            "return_text_in_logprobs": False,
        }

    def parse(self, call: CallSpec, raw: bytes, *, vocab_size: int) -> ServerReply:
        reply = _decode(raw, _Sglang)
        token_ids = _in_vocab(reply.output_ids, "output_ids", vocab_size)
        meta = reply.meta_info
        if meta.prompt_tokens is not None and meta.prompt_tokens != len(call.prompt_token_ids):
            raise DataFailure(
                DataError.TOKEN_MISMATCH,
                f"meta_info.prompt_tokens is {meta.prompt_tokens}, "
                f"{len(call.prompt_token_ids)} ids were sent",
            )
        if [token.token_id for token in meta.output_token_logprobs] != token_ids:
            raise DataFailure(
                DataError.TOKEN_MISMATCH,
                "meta_info.output_token_logprobs name other ids than output_ids",
            )
        logprobs = _checked_logprobs(
            [token.logprob for token in meta.output_token_logprobs],
            "meta_info.output_token_logprobs[].logprob",
        )
        _check_generated(call, token_ids, logprobs)
        finish = meta.finish_reason
        version = meta.weight_version
        return ServerReply(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish.type if isinstance(finish, _SglangFinish) else finish,
            server_weight_version=None if version is None else str(version),
        )


DIALECTS: dict[DialectName, Dialect] = {
    "vllm-completions": VllmCompletions(),
    "vllm-generate": VllmGenerate(),
    "sglang": SglangGenerate(),
}
