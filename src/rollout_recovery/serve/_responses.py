"""The JSON answers of every route, in vLLM's shapes and field names.

Kept apart from the routing so that the shapes can be compared field by field with real
vLLM answers (``tests/fixtures/vllm``) in one place.
"""

from __future__ import annotations

import uuid
from typing import Any

from .. import __version__
from ..policy import TaskSet
from ._requests import SamplingRequest
from ._sampling import Generation

__all__ = [
    "OWNED_BY",
    "SYSTEM_FINGERPRINT",
    "completion_body",
    "generate_body",
    "models_body",
    "token_text",
    "version_label",
]

OWNED_BY = "rollout-recovery"
# Where vLLM says "vllm-0.32.0-<commit>".
SYSTEM_FINGERPRINT = f"rollout-recovery-{__version__}"


def version_label(version: int) -> str:
    """A weight version as vLLM renders one: an opaque string."""
    return str(version)


def token_text(token: int, *, as_token_id: bool) -> str:
    """A token as a logprobs entry names it: ``token_id:N`` or its rendered text."""
    return f"token_id:{token}" if as_token_id else TaskSet.render([token])


def models_body(*, model: str, created: int, max_model_len: int) -> dict[str, Any]:
    """``GET /v1/models``: vLLM's model list, its permission card included."""
    permission = {
        "id": f"modelperm-{uuid.uuid4().hex[:16]}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": OWNED_BY,
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def _completion_token_text(token: int, position: int, *, as_token_id: bool) -> str:
    # Like a real tokenizer's pieces, a token after the first carries the space that
    # separates it in the text, so the pieces concatenate to the text and vLLM's
    # text_offset rule (running sum of the pieces' lengths) indexes into it.
    text = token_text(token, as_token_id=as_token_id)
    return text if as_token_id or position == 0 else f" {text}"


def _completion_logprobs(request: SamplingRequest, generation: Generation) -> dict[str, Any]:
    as_id = request.return_tokens_as_token_ids
    tokens = [
        _completion_token_text(t, i, as_token_id=as_id) for i, t in enumerate(generation.token_ids)
    ]
    # vLLM's rule, quirks included: with token_id:N pieces the offsets count their length.
    offsets, offset = [], 0
    for piece in tokens:
        offsets.append(offset)
        offset += len(piece)
    top: list[dict[str, float]] = []
    assert generation.top_logprobs is not None
    for position, (piece, logprob, ranked) in enumerate(
        zip(tokens, generation.logprobs, generation.top_logprobs, strict=True)
    ):
        # vLLM lists the sampled token first, then the top k (a dict: each token once).
        entry = {piece: logprob}
        for candidate, candidate_logprob, _rank in ranked:
            key = _completion_token_text(candidate, position, as_token_id=as_id)
            entry.setdefault(key, candidate_logprob)
        top.append(entry)
    return {
        "text_offset": offsets,
        "token_logprobs": list(generation.logprobs),
        "tokens": tokens,
        "top_logprobs": top,
    }


def completion_body(
    *,
    request_id: str,
    created: int,
    model: str,
    request: SamplingRequest,
    generation: Generation,
) -> dict[str, Any]:
    """``POST /v1/completions``: vLLM 0.32's ``CompletionResponse``, field for field.

    ``token_ids`` and ``prompt_token_ids`` are null unless ``return_token_ids``; vLLM's
    fields this server has nothing for are null.
    """
    ids = request.return_token_ids
    choice: dict[str, Any] = {
        "index": 0,
        "text": TaskSet.render(generation.token_ids),
        "logprobs": None if request.top_k is None else _completion_logprobs(request, generation),
        "finish_reason": generation.finish_reason,
        "stop_reason": None,
        "token_ids": list(generation.token_ids) if ids else None,
        "prompt_logprobs": None,
        "prompt_token_ids": list(request.prompt) if ids else None,
        "routed_experts": None,
    }
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": _usage(len(request.prompt), len(generation.token_ids)),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def _generate_logprobs(request: SamplingRequest, generation: Generation) -> dict[str, Any]:
    assert generation.ranks is not None and generation.top_logprobs is not None
    k = request.top_k or 0
    content = []
    for token, logprob, rank, ranked in zip(
        generation.token_ids,
        generation.logprobs,
        generation.ranks,
        generation.top_logprobs,
        strict=True,
    ):
        # As vLLM 0.32 lists them: the sampled token, then the most likely others, k
        # entries in all (one when k is 0).
        listed = [(token, logprob, rank), *(c for c in ranked if c[0] != token)]
        content.append(
            {
                "token_id": token,
                "logprob": logprob,
                "rank": rank,
                "top_logprobs": [
                    {"token_id": t, "logprob": lp, "rank": r} for t, lp, r in listed[: max(k, 1)]
                ],
            }
        )
    return {"content": content}


def _version_spans(generation: Generation) -> list[dict[str, Any]]:
    versions = generation.token_versions
    if not versions:  # vLLM's shape for no tokens: one empty span at the version
        return [{"version": version_label(generation.weight_version), "start": 0, "end": 0}]
    spans: list[dict[str, Any]] = []
    start = 0
    for index in range(1, len(versions) + 1):
        if index == len(versions) or versions[index] != versions[start]:
            spans.append({"version": version_label(versions[start]), "start": start, "end": index})
            start = index
    return spans


def generate_body(
    *,
    request_id: str,
    created: int,
    model: str,
    request: SamplingRequest,
    generation: Generation,
) -> dict[str, Any]:
    """``POST /inference/v1/generate``: vLLM 0.32's token-out ``GenerateResponse``.

    ``weight_versions`` sits on the choice: one span per run of tokens one weight version
    generated (two or more when new weights were loaded while the call was paused).
    """
    spans = _version_spans(generation)
    choice = {
        "index": 0,
        "finish_reason": generation.finish_reason,
        "stop_reason": None,
        "token_ids": list(generation.token_ids),
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": spans,
        "logprobs": None if request.top_k is None else _generate_logprobs(request, generation),
    }
    return {
        "request_id": request_id,
        "model": model,
        "created": created,
        "usage": _usage(len(request.prompt), len(generation.token_ids)),
        "prompt_logprobs": None,
        "prompt_token_id_logprobs": None,
        "prompt_token_ids": list(request.prompt) if request.return_token_ids else None,
        "mm_placeholders": None,
        "metrics": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "output_mode": "tokens",
        "choices": [choice],
    }
