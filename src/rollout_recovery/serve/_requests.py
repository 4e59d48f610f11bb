"""Request bodies of the generation routes, parsed and checked into one typed request.

Field names, defaults and refusals are vLLM 0.32's (``tests/fixtures/vllm``): ``max_tokens``
16 on ``/v1/completions`` and the rest of the context on ``/inference/v1/generate``; a
``max_tokens`` past the context is cut to what fits (the answer finishes for ``length``),
a prompt that leaves no room is refused, each with vLLM's message. Fields vLLM knows that
do not change this policy's answer are ignored, as vLLM ignores unknown ones; what would
change the answer but cannot be honoured (another temperature, ``n`` > 1, streaming,
``echo``, a text prompt) is refused with a 400 naming the field, never silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeVar

import msgspec

from .._messages import split_validation_path
from ..policy import PolicySnapshot
from ._api_error import ApiError, bad_request, schema_error
from ._sampling import MAX_TOP_LOGPROBS, check_prompt

__all__ = [
    "SamplingRequest",
    "decode_json_object",
    "field_of",
    "parse_completion_request",
    "parse_generate_request",
]

# vLLM takes any seed of a C long long or unsigned long long.
_SEED_MIN = -(2**63)
_SEED_LIMIT = 2**64


@dataclass(frozen=True, slots=True)
class SamplingRequest:
    """One generation request, checked: what the sampler and the response builder need.

    ``max_tokens`` is already cut to the context left after the prompt; ``seed`` is mapped
    to numpy's unsigned range; ``top_k`` is the request's ``logprobs`` (None: no logprobs
    at all). ``ignore_eos`` makes an answer that ends with EOS finish for ``length``, as
    vLLM reports it.
    """

    prompt: list[int]
    digit: int
    max_tokens: int
    seed: int | None
    top_k: int | None
    ignore_eos: bool
    return_token_ids: bool
    return_tokens_as_token_ids: bool


class _SamplingFields(msgspec.Struct):
    max_tokens: int | None = 16
    temperature: float | None = None
    seed: int | None = None
    logprobs: int | None = None
    n: int | None = 1
    ignore_eos: bool | None = False


class _GenerateSamplingFields(_SamplingFields):
    # vLLM's generate route fills an omitted max_tokens with the rest of the context.
    max_tokens: int | None = None


class _CompletionBody(_SamplingFields):
    prompt: Any = msgspec.UNSET
    model: str | None = None
    return_token_ids: bool | None = False
    return_tokens_as_token_ids: bool | None = False
    stream: bool | None = False
    echo: bool | None = False


class _GenerateBody(msgspec.Struct):
    token_ids: Any = msgspec.UNSET
    sampling_params: _GenerateSamplingFields | msgspec.UnsetType = msgspec.UNSET
    model: str | None = None
    request_id: str | None = None
    return_token_ids: bool | None = False
    stream: bool | None = False


_Body = TypeVar("_Body", _CompletionBody, _GenerateBody)


def field_of(path: str | None) -> str | None:
    """msgspec's ``$.a.b[1]`` as vLLM names a field, ``a.b.1``."""
    if path is None or path == "$":
        return None
    return re.sub(r"\[(\d+)\]", r".\1", path.removeprefix("$.").removeprefix("$"))


def decode_json_object(body: bytes) -> dict[str, Any]:
    """The request's JSON object (no body: an empty one); a 400 for anything else.

    Every way a body can fail to decode is a 400: invalid JSON or UTF-8, a number out of
    range (msgspec refuses integers past 64 bits and floats past a double), and arrays or
    objects nested deeper than the interpreter's recursion limit lets msgspec build.
    A duplicate key keeps its last value, as vLLM's Python ``json`` does.
    """
    if not body:
        # As FastAPI reads a missing body: each required field is then reported missing.
        return {}
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError as error:
        raise schema_error(f"JSON decode error: {error}", field=None) from None
    except RecursionError:
        # msgspec checks the recursion limit as it descends, so nothing half-built is
        # left behind; no request of this API nests more than a few levels.
        raise schema_error(
            "JSON decode error: arrays or objects are nested too deeply", field=None
        ) from None
    if not isinstance(value, dict):
        raise schema_error(
            f"the request body must be a JSON object, got {type(value).__name__}", field=None
        )
    return value


def _convert(value: Mapping[str, Any], kind: type[_Body]) -> _Body:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as error:
        message, path = split_validation_path(str(error))
        raise schema_error(message, field=field_of(path)) from None


def _check_model(model: str | None, served: str) -> None:
    if model is not None and model != served:
        raise ApiError(
            HTTPStatus.NOT_FOUND,
            f"The model `{model}` does not exist. Valid aliases: {served}.",
            param="model",
        )


def _token_list(value: object) -> list[int] | None:
    """``value`` as a list of ints, or None when it is not one (bools are not ints)."""
    if not isinstance(value, list):
        return None
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return None
    return value


def _completion_prompt(prompt: object) -> list[int]:
    if prompt is msgspec.UNSET:
        raise schema_error("Field required", field="prompt")
    if isinstance(prompt, str) or (
        isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt)
    ):
        raise bad_request(
            "this server is token-in only: prompt must be a list of token ids, not text",
            param="prompt",
        )
    tokens = _token_list(prompt)
    if tokens is not None:
        return tokens
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        if len(prompt) != 1:
            raise bad_request(
                f"prompt holds {len(prompt)} token lists; this server takes one per request",
                param="prompt",
            )
        tokens = _token_list(prompt[0])
        if tokens is not None:
            return tokens
    raise schema_error(
        "prompt must be a list of token ids (ints), or a list holding one such list",
        field="prompt",
    )


def _completion_budget(prompt_len: int, max_tokens: int | None, max_model_len: int) -> int:
    """How many tokens a completion may generate, or vLLM's refusal (its messages)."""
    if max_tokens is not None and max_tokens > max_model_len:
        raise bad_request(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
            param="max_tokens",
        )
    if prompt_len > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {prompt_len} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={prompt_len})",
            param="input_tokens",
        )
    room = max_model_len - prompt_len
    budget = room if max_tokens is None else min(max_tokens, room)
    if budget < 1:
        raise bad_request(
            f"max_tokens must be at least 1, got {budget}. (parameter=max_tokens, value={budget})",
            param="max_tokens",
        )
    return budget


def _generate_budget(prompt_len: int, max_tokens: int | None, max_model_len: int) -> int:
    """How many tokens a generate call may generate, or vLLM's refusal (its messages)."""
    if prompt_len > max_model_len:
        raise bad_request(
            f"The decoder prompt (length {prompt_len}) is longer than the maximum model "
            f"length of {max_model_len}. Make sure that `max_model_len` is no smaller than "
            "the number of text tokens."
        )
    if prompt_len == max_model_len:
        raise bad_request(
            f"The decoder prompt (length {prompt_len}) plus the number of requested output "
            f"tokens (at least 1) is longer than the maximum model length of {max_model_len}. "
            "Make sure that `max_model_len` is no smaller than the number of text tokens "
            "(prompt + requested output tokens)."
        )
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(
            f"max_tokens must be at least 1, got {max_tokens}.",
            param="sampling_params.max_tokens",
        )
    room = max_model_len - prompt_len
    return room if max_tokens is None else min(max_tokens, room)


def _sampling_request(
    fields: _SamplingFields,
    prompt: list[int],
    *,
    generate_route: bool,
    max_model_len: int,
    return_token_ids: bool,
    return_tokens_as_token_ids: bool,
) -> SamplingRequest:
    prompt_param, prefix = ("token_ids", "sampling_params.") if generate_route else ("prompt", "")
    if fields.temperature is not None and fields.temperature != 1.0:
        raise bad_request(
            f"temperature {fields.temperature!r} is not supported: this policy samples at "
            "temperature 1.0 only (omit it or send 1.0)",
            param=f"{prefix}temperature",
        )
    if fields.n is not None and fields.n != 1:
        raise bad_request(
            f"n = {fields.n} is not supported: this server returns one choice per request",
            param=f"{prefix}n",
        )
    if fields.logprobs is not None and not 0 <= fields.logprobs <= MAX_TOP_LOGPROBS:
        raise bad_request(
            f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {fields.logprobs}",
            param=f"{prefix}logprobs",
        )
    seed = fields.seed
    if seed is not None and not _SEED_MIN <= seed < _SEED_LIMIT:
        raise bad_request(f"seed must fit in 64 bits, got {seed}", param=f"{prefix}seed")
    digit = check_prompt(prompt, param=prompt_param)
    # Past the context, vLLM 0.32 generates what fits and finishes for "length".
    budget = _generate_budget if generate_route else _completion_budget
    max_tokens = budget(len(prompt), fields.max_tokens, max_model_len)
    answer_length = PolicySnapshot.answer_length(prompt)
    if fields.ignore_eos and answer_length is not None and max_tokens > answer_length:
        raise bad_request(
            f"ignore_eos with max_tokens {max_tokens} is not supported after <answer>: the "
            f"policy has no token after its answer's EOS (send max_tokens <= {answer_length})",
            param=f"{prefix}ignore_eos",
        )
    return SamplingRequest(
        prompt=prompt,
        digit=digit,
        max_tokens=max_tokens,
        # numpy seeds are unsigned: a negative seed maps to its two's complement.
        seed=None if seed is None else seed % _SEED_LIMIT,
        top_k=fields.logprobs,
        ignore_eos=bool(fields.ignore_eos),
        return_token_ids=return_token_ids,
        return_tokens_as_token_ids=return_tokens_as_token_ids,
    )


def parse_completion_request(
    body: Mapping[str, Any], *, model_name: str, max_model_len: int
) -> SamplingRequest:
    """A ``POST /v1/completions`` body; 400 (404 for another model) when refused."""
    parsed = _convert(body, _CompletionBody)
    _check_model(parsed.model, model_name)
    if parsed.stream:
        raise bad_request("streaming not supported: send stream=false", param="stream")
    if parsed.echo:
        raise bad_request("echo is not supported: send echo=false", param="echo")
    return _sampling_request(
        parsed,
        _completion_prompt(parsed.prompt),
        generate_route=False,
        max_model_len=max_model_len,
        return_token_ids=bool(parsed.return_token_ids),
        return_tokens_as_token_ids=bool(parsed.return_tokens_as_token_ids),
    )


def parse_generate_request(
    body: Mapping[str, Any], *, model_name: str, max_model_len: int
) -> tuple[SamplingRequest, str | None]:
    """A ``POST /inference/v1/generate`` body and its ``request_id``; 400 (404) if refused.

    ``return_token_ids`` (top level, as in vLLM) echoes the prompt's ids.
    """
    parsed = _convert(body, _GenerateBody)
    _check_model(parsed.model, model_name)
    if parsed.stream:
        raise bad_request("streaming not supported: send stream=false", param="stream")
    if parsed.token_ids is msgspec.UNSET:
        raise schema_error("Field required", field="token_ids")
    tokens = _token_list(parsed.token_ids)
    if tokens is None:
        raise schema_error("token_ids must be a list of token ids (ints)", field="token_ids")
    if isinstance(parsed.sampling_params, msgspec.UnsetType):
        raise schema_error("Field required", field="sampling_params")
    fields = parsed.sampling_params
    request = _sampling_request(
        fields,
        tokens,
        generate_route=True,
        max_model_len=max_model_len,
        return_token_ids=bool(parsed.return_token_ids),
        return_tokens_as_token_ids=True,
    )
    return request, parsed.request_id
