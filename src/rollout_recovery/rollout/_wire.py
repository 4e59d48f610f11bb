"""Wire dialects: how one token-in, token-out model call looks on each server's HTTP API.

A dialect builds a request body for a :class:`CallSpec` and reads the reply back into a
:class:`ServerReply`, cross-checking everything the server echoes: a reply that disagrees
with itself or with the request is a *data* failure (:class:`DataFailure`), never silently
repaired, because a retokenized or misaligned call would train on tokens the policy did not
sample.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from .._bounds import INT32_MAX

__all__ = [
    "DIALECTS",
    "CallSpec",
    "DataFailure",
    "Dialect",
    "DialectName",
    "ServerReply",
    "SglangGenerate",
    "VllmCompletions",
    "VllmGenerate",
    "error_message",
]

DialectName = Literal["vllm-completions", "vllm-generate", "sglang"]


class DataFailure(Exception):
    """The server answered, but the answer cannot be trained on: a failed attempt.

    ``reason`` is a short code (``token_mismatch``, ``context_overflow``, ``http_400``, ...)
    that ends up in the placeholder's reason; ``detail`` says what exactly disagreed.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


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

    def parse(self, call: CallSpec, payload: object) -> ServerReply: ...


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


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise DataFailure("malformed_response", f"{where} is not an object")
    return value


def _token_list(value: object, where: str) -> list[int]:
    # The writer's bounds (rows store int32): a reply outside them is the server's data
    # failure here, not a refusal at staging that would stop the run.
    if not isinstance(value, list) or not all(
        type(item) is int and 0 <= item <= INT32_MAX for item in value
    ):
        raise DataFailure("malformed_response", f"{where} is not a list of token ids")
    return list(value)


def _logprob_list(value: object, where: str) -> list[float]:
    if not isinstance(value, list):
        raise DataFailure("malformed_response", f"{where} is not a list")
    out: list[float] = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise DataFailure("invalid_logprobs", f"{where}[{i}] is {item!r}, not a number")
        number = float(item)
        with np.errstate(over="ignore"):  # rows store float32: must stay finite there
            finite = bool(np.isfinite(np.float32(number)))
        if not finite or number > 0.0:
            raise DataFailure("invalid_logprobs", f"{where}[{i}] is {item!r}")
        out.append(number)
    return out


def _only_choice(reply: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = reply.get("choices")
    if not isinstance(choices, list) or len(choices) != 1:
        raise DataFailure("malformed_response", "choices is not a one-element list")
    return _mapping(choices[0], "choices[0]")


def _check_generated(call: CallSpec, token_ids: list[int], logprobs: list[float]) -> None:
    if not token_ids:
        raise DataFailure("empty_generation", "the server generated no token")
    if len(token_ids) > call.max_tokens:
        raise DataFailure(
            "token_mismatch",
            f"{len(token_ids)} tokens generated, max_tokens was {call.max_tokens}",
        )
    if len(logprobs) != len(token_ids):
        raise DataFailure(
            "token_mismatch", f"{len(logprobs)} logprobs for {len(token_ids)} generated tokens"
        )


def _check_prompt_echo(call: CallSpec, echoed: object, where: str) -> None:
    if echoed is None:
        raise DataFailure("malformed_response", f"{where} is missing")
    if _token_list(echoed, where) != list(call.prompt_token_ids):
        raise DataFailure(
            "token_mismatch", f"{where} does not echo the {len(call.prompt_token_ids)} sent ids"
        )


def _parse_token_id_tokens(tokens: object, where: str) -> list[int]:
    """vLLM's ``return_tokens_as_token_ids`` logprob tokens, ``"token_id:N"``."""
    if not isinstance(tokens, list):
        raise DataFailure("malformed_response", f"{where} is not a list")
    ids: list[int] = []
    for i, token in enumerate(tokens):
        if not isinstance(token, str) or not token.startswith("token_id:"):
            raise DataFailure("token_mismatch", f"{where}[{i}] is {token!r}, not 'token_id:N'")
        try:
            ids.append(int(token.removeprefix("token_id:")))
        except ValueError:
            raise DataFailure("token_mismatch", f"{where}[{i}] is {token!r}") from None
    return ids


def _version_spans(value: object, generated: int) -> list[dict[str, Any]] | None:
    """vLLM's ``weight_versions``: contiguous ``{version, start, end}`` spans covering every
    generated token, in order."""
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise DataFailure("malformed_response", "weight_versions is not a non-empty list")
    spans: list[dict[str, Any]] = []
    position = 0
    for i, span in enumerate(value):
        span = _mapping(span, f"weight_versions[{i}]")
        start, end, version = span.get("start"), span.get("end"), span.get("version")
        if type(start) is not int or type(end) is not int or start != position or end <= start:
            raise DataFailure(
                "token_mismatch", f"weight_versions[{i}] does not continue at token {position}"
            )
        spans.append({"version": str(version), "start": start, "end": end})
        position = end
    if position != generated:
        raise DataFailure(
            "token_mismatch", f"weight_versions cover {position} of {generated} generated tokens"
        )
    return spans


# ------------------------------------------------------------------------- dialects


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

    def parse(self, call: CallSpec, payload: object) -> ServerReply:
        reply = _mapping(payload, "the response")
        choice = _only_choice(reply)
        # vLLM puts the echo on the choice; accept the chat endpoints' top-level place too.
        echoed = choice.get("prompt_token_ids", reply.get("prompt_token_ids"))
        _check_prompt_echo(call, echoed, "prompt_token_ids")
        token_ids = _token_list(choice.get("token_ids"), "choices[0].token_ids")
        logprobs = _mapping(choice.get("logprobs"), "choices[0].logprobs")
        logprob_ids = _parse_token_id_tokens(logprobs.get("tokens"), "logprobs.tokens")
        if logprob_ids != token_ids:
            raise DataFailure(
                "token_mismatch", "logprobs.tokens name other ids than choices[0].token_ids"
            )
        values = _logprob_list(logprobs.get("token_logprobs"), "logprobs.token_logprobs")
        _check_generated(call, token_ids, values)
        finish = choice.get("finish_reason")
        return ServerReply(
            token_ids=token_ids,
            logprobs=values,
            finish_reason=finish if isinstance(finish, str) else None,
        )


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

    def parse(self, call: CallSpec, payload: object) -> ServerReply:
        reply = _mapping(payload, "the response")
        choice = _only_choice(reply)
        _check_prompt_echo(call, reply.get("prompt_token_ids"), "prompt_token_ids")
        token_ids = _token_list(choice.get("token_ids"), "choices[0].token_ids")
        values = _generate_logprobs(choice.get("logprobs"), token_ids)
        _check_generated(call, token_ids, values)
        spans = _version_spans(choice.get("weight_versions"), len(token_ids))
        finish = choice.get("finish_reason")
        return ServerReply(
            token_ids=token_ids,
            logprobs=values,
            finish_reason=finish if isinstance(finish, str) else None,
            server_weight_version=None if spans is None else spans[-1]["version"],
            weight_version_spans=spans,
        )


def _generate_logprobs(value: object, token_ids: list[int]) -> list[float]:
    """The generate route's ``{"content": [{"token_id": N, "logprob": x}, ...]}``, one
    entry per generated token, naming exactly the generated ids."""
    logprobs = _mapping(value, "choices[0].logprobs")
    entries = logprobs.get("content")
    if not isinstance(entries, list):
        raise DataFailure("malformed_response", "choices[0].logprobs.content is not a list")
    ids = [_mapping(e, f"logprobs.content[{i}]").get("token_id") for i, e in enumerate(entries)]
    if ids != token_ids:
        raise DataFailure(
            "token_mismatch", "logprobs.content names other ids than choices[0].token_ids"
        )
    return _logprob_list([e.get("logprob") for e in entries], "logprobs.content[].logprob")


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

    def parse(self, call: CallSpec, payload: object) -> ServerReply:
        reply = _mapping(payload, "the response")
        token_ids = _token_list(reply.get("output_ids"), "output_ids")
        meta = _mapping(reply.get("meta_info"), "meta_info")
        prompt_tokens = meta.get("prompt_tokens")
        if prompt_tokens is not None and prompt_tokens != len(call.prompt_token_ids):
            raise DataFailure(
                "token_mismatch",
                f"meta_info.prompt_tokens is {prompt_tokens}, "
                f"{len(call.prompt_token_ids)} ids were sent",
            )
        triples = meta.get("output_token_logprobs")
        if not isinstance(triples, list):
            raise DataFailure("malformed_response", "meta_info.output_token_logprobs is missing")
        ids: list[int] = []
        values: list[object] = []
        for i, triple in enumerate(triples):
            if not isinstance(triple, list | tuple) or len(triple) < 2:
                raise DataFailure(
                    "malformed_response", f"meta_info.output_token_logprobs[{i}] is {triple!r}"
                )
            values.append(triple[0])
            ids.append(triple[1])
        if ids != token_ids:
            raise DataFailure(
                "token_mismatch", "meta_info.output_token_logprobs name other ids than output_ids"
            )
        logprobs = _logprob_list(values, "meta_info.output_token_logprobs[].logprob")
        _check_generated(call, token_ids, logprobs)
        version = meta.get("weight_version")
        finish = meta.get("finish_reason")
        finish_type = finish.get("type") if isinstance(finish, Mapping) else finish
        return ServerReply(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish_type if isinstance(finish_type, str) else None,
            server_weight_version=None if version is None else str(version),
        )


DIALECTS: dict[DialectName, Dialect] = {
    "vllm-completions": VllmCompletions(),
    "vllm-generate": VllmGenerate(),
    "sglang": SglangGenerate(),
}
