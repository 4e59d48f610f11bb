"""Wire dialects: request bodies, reply parsing and every cross-check, per server shape."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from http_support import completion
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery.rollout._http_backend import classify_status
from rollout_recovery.rollout._wire import (
    CallSpec,
    DataFailure,
    Dialect,
    ServerReply,
    SglangGenerate,
    VllmCompletions,
    VllmGenerate,
)

CALL = CallSpec(prompt_token_ids=[0, 5, 22, 1], max_tokens=4, seed=7)
# Every id a row can store: these tests are about shapes, not a trainer's vocabulary.
WIDE = 2**31
# The recorded replies come from a tiny Llama with 333 tokens.
RECORDED_VOCAB = 333


def _parse(
    dialect: Dialect, payload: object, call: CallSpec = CALL, vocab_size: int = WIDE
) -> ServerReply:
    return dialect.parse(call, json.dumps(payload).encode(), vocab_size=vocab_size)


def _failure(dialect: Dialect, payload: object, vocab_size: int = WIDE) -> DataFailure:
    with pytest.raises(DataFailure) as caught:
        _parse(dialect, payload, vocab_size=vocab_size)
    return caught.value


# ------------------------------------------------------------------------ vLLM completions


def test_vllm_completions_body_is_token_in_with_token_ids_back() -> None:
    body = VllmCompletions().body("tiny", CALL)
    assert body["prompt"] == [0, 5, 22, 1]
    assert body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
    assert body["logprobs"] == 0 and body["seed"] == 7 and body["max_tokens"] == 4


@given(
    tokens=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=4),
    logprob=st.floats(-50.0, 0.0),
    flip=st.integers(0, 3),
)
def test_vllm_completions_accepts_a_consistent_reply_and_no_single_flipped_id(
    tokens: list[int], logprob: float, flip: int
) -> None:
    prompt = list(CALL.prompt_token_ids)
    payload = completion(prompt, tokens)
    payload["choices"][0]["logprobs"]["token_logprobs"] = [logprob] * len(tokens)
    reply = _parse(VllmCompletions(), payload)
    assert reply.token_ids == tokens and reply.logprobs == [logprob] * len(tokens)
    flipped = list(tokens)
    flipped[flip % len(tokens)] = (flipped[flip % len(tokens)] + 1) % 2**31  # another valid id
    broken = completion(prompt, tokens, token_ids=flipped)
    assert _failure(VllmCompletions(), broken).reason == "token_mismatch"


def test_vllm_completions_reads_a_top_level_prompt_echo() -> None:
    payload = completion([0, 5, 22, 1], [9, 9])
    del payload["choices"][0]["prompt_token_ids"]
    payload["prompt_token_ids"] = [0, 5, 22, 1]
    assert _parse(VllmCompletions(), payload).token_ids == [9, 9]


# ------------------------------------------------------------------------ vLLM generate


def _generate_reply(tokens: list[int], spans: Any) -> dict[str, Any]:
    return {
        "request_id": "generate-tokens-1",
        "prompt_token_ids": list(CALL.prompt_token_ids),
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "token_ids": tokens,
                "weight_versions": spans,
                "logprobs": {
                    "content": [{"token_id": t, "logprob": -0.5, "rank": 3} for t in tokens]
                },
            }
        ],
    }


def test_vllm_generate_records_the_weight_version_spans() -> None:
    spans = [{"version": "7", "start": 0, "end": 1}, {"version": "8", "start": 1, "end": 3}]
    reply = _parse(VllmGenerate(), _generate_reply([4, 5, 6], spans))
    assert reply.weight_version_spans == spans
    assert reply.server_weight_version == "8"
    body = VllmGenerate().body("tiny", CALL)
    assert body["token_ids"] == [0, 5, 22, 1] and body["sampling_params"]["max_tokens"] == 4
    assert body["return_token_ids"] is True


def test_vllm_generate_cross_checks_the_logprob_ids_and_the_echo() -> None:
    spans = [{"version": "7", "start": 0, "end": 2}]
    reply = _generate_reply([4, 5], spans)
    reply["choices"][0]["logprobs"]["content"][1]["token_id"] = 6
    assert _failure(VllmGenerate(), reply).reason == "token_mismatch"
    reply = _generate_reply([4, 5], spans)
    reply["prompt_token_ids"] = None  # sent without return_token_ids: nothing to check
    assert _failure(VllmGenerate(), reply).reason == "malformed_reply"


@pytest.mark.parametrize(
    "spans",
    [
        pytest.param([{"version": "7", "start": 0, "end": 2}], id="short"),
        pytest.param([{"version": "7", "start": 1, "end": 3}], id="gap"),
        pytest.param(
            [{"version": "7", "start": 0, "end": 2}, {"version": "8", "start": 1, "end": 3}],
            id="overlap",
        ),
    ],
)
def test_vllm_generate_refuses_spans_that_do_not_tile_the_tokens(spans: Any) -> None:
    assert _failure(VllmGenerate(), _generate_reply([4, 5, 6], spans)).reason == ("token_mismatch")


# ------------------------------------------------------------------------------ SGLang


def _sglang_reply(tokens: list[int], **meta: Any) -> dict[str, Any]:
    return {
        "text": "",
        "output_ids": tokens,
        "meta_info": {
            "prompt_tokens": 4,
            "completion_tokens": len(tokens),
            "output_token_logprobs": [[-0.5, t, None] for t in tokens],
            "weight_version": "12",
            "finish_reason": {"type": "length", "length": len(tokens)},
            **meta,
        },
    }


def test_sglang_body_and_reply_shape() -> None:
    body = SglangGenerate().body("ignored", CALL)
    assert body["input_ids"] == [0, 5, 22, 1] and body["return_logprob"] is True
    assert body["sampling_params"]["max_new_tokens"] == 4
    reply = _parse(SglangGenerate(), _sglang_reply([8, 9]))
    assert reply.token_ids == [8, 9] and reply.logprobs == [-0.5, -0.5]
    assert reply.server_weight_version == "12" and reply.finish_reason == "length"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        pytest.param(
            _sglang_reply([8, 9], output_token_logprobs=[[-0.5, 8, None], [-0.5, 7, None]]),
            "token_mismatch",
            id="logprob-ids-differ",
        ),
        pytest.param(_sglang_reply([8, 9], prompt_tokens=3), "token_mismatch", id="prompt-len"),
        pytest.param({"output_ids": [8]}, "malformed_reply", id="no-meta"),
        pytest.param(
            # NaN is not JSON: the reply is malformed before any logprob is read.
            _sglang_reply([8], output_token_logprobs=[[float("nan"), 8, None]]),
            "malformed_reply",
            id="nan-logprob",
        ),
        pytest.param(
            _sglang_reply([8], output_token_logprobs=[[0.25, 8, None]]),
            "invalid_logprobs",
            id="positive-logprob",
        ),
    ],
)
def test_sglang_cross_checks(payload: Any, reason: str) -> None:
    assert _failure(SglangGenerate(), payload).reason == reason


# --------------------------------------------------------------------- status classes


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 429])
def test_infra_statuses_are_resent_elsewhere(status: int) -> None:
    assert classify_status(status, {}) is None


@pytest.mark.parametrize(
    ("status", "payload", "reason"),
    [
        (400, {"error": {"message": "bad"}}, "http_400"),
        (404, {"object": "error", "message": "model not found"}, "http_404"),
        (422, {"detail": "unprocessable"}, "http_422"),
        (400, {"error": {"message": "max_model_len is 512"}}, "context_overflow"),
    ],
)
def test_other_4xx_are_data_failures(status: int, payload: Any, reason: str) -> None:
    failure = classify_status(status, payload)
    assert failure is not None and failure.code == reason


# ------------------------------------------------------- recorded vLLM 0.32 responses

_FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm"


def _recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((_FIXTURES / name).read_text())
    return data


def _call_of(request: dict[str, Any], prompt_key: str) -> CallSpec:
    sampling = request.get("sampling_params", request)
    return CallSpec(
        prompt_token_ids=request[prompt_key],
        max_tokens=sampling["max_tokens"],
        temperature=sampling["temperature"],
        seed=sampling["seed"],
    )


@pytest.mark.parametrize("name", ["completions_token_in.json", "completions_token_in_top1.json"])
def test_recorded_vllm_completions_parse_and_our_body_asks_the_same(name: str) -> None:
    recorded = _recorded(name)
    call = _call_of(recorded["request"], "prompt")
    reply = _parse(VllmCompletions(), recorded["response"], call, RECORDED_VOCAB)
    choice = recorded["response"]["choices"][0]
    assert reply.token_ids == choice["token_ids"]
    assert reply.logprobs == choice["logprobs"]["token_logprobs"]
    ours = VllmCompletions().body("tiny", call)
    for field in ("prompt", "max_tokens", "return_token_ids", "return_tokens_as_token_ids"):
        assert ours[field] == recorded["request"][field]


@pytest.mark.parametrize("name", ["generate.json", "generate_top2.json"])
def test_recorded_vllm_generate_parses_with_its_spans(name: str) -> None:
    recorded = _recorded(name)
    call = _call_of(recorded["request"], "token_ids")
    reply = _parse(VllmGenerate(), recorded["response"], call, RECORDED_VOCAB)
    choice = recorded["response"]["choices"][0]
    assert reply.token_ids == choice["token_ids"]
    assert reply.weight_version_spans == choice["weight_versions"]
    ours = VllmGenerate().body("tiny", call)
    assert ours["return_token_ids"] is recorded["request"]["return_token_ids"] is True


@pytest.mark.parametrize(
    "case",
    [
        "completions_prompt512_max4",
        "completions_prompt600_max4",
        "generate_prompt512_max4",
        "generate_prompt600_max4",
    ],
)
def test_recorded_vllm_context_refusals_are_context_overflows(case: str) -> None:
    recorded = _recorded("error_context_overflow.json")[case]
    failure = classify_status(recorded["status"], recorded["response"])
    assert failure is not None and failure.reason == "context_overflow"


# ------------------------------------------------------- untrusted bytes (issue 15)

DIALECT_PARSERS = [VllmCompletions(), VllmGenerate(), SglangGenerate()]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=30,
)


@pytest.mark.parametrize("dialect", DIALECT_PARSERS, ids=lambda d: d.name)
@given(raw=st.binary(max_size=200) | _JSON.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_parse_or_fail_as_data(dialect: Dialect, raw: bytes) -> None:
    """Whatever a server sends, a dialect returns a checked reply or a DataFailure."""
    with contextlib.suppress(DataFailure):
        dialect.parse(CALL, raw, vocab_size=WIDE)


@pytest.mark.parametrize("dialect", DIALECT_PARSERS, ids=lambda d: d.name)
@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="nested-array"),
        pytest.param(b'{"a":' * 50_000 + b"1" + b"}" * 50_000, id="nested-object"),
        pytest.param(b'{"x": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", id="nested-unread-field"),
        pytest.param(b'{"text": "\xc3\x28"}', id="invalid-utf8"),
        pytest.param(b"<!DOCTYPE html><html></html>", id="html"),
        pytest.param(b'{"choices": NaN}', id="nan"),
    ],
)
def test_undecodable_replies_are_malformed_in_every_dialect(dialect: Dialect, raw: bytes) -> None:
    with pytest.raises(DataFailure) as caught:
        dialect.parse(CALL, raw, vocab_size=WIDE)
    assert caught.value.reason == "malformed_reply"
    assert caught.value.blames_server


def _consistent(dialect: Dialect, tokens: list[int], prompt: list[int]) -> dict[str, Any]:
    if isinstance(dialect, VllmCompletions):
        return completion(prompt, tokens)
    if isinstance(dialect, VllmGenerate):
        reply = _generate_reply(tokens, None)
        reply["prompt_token_ids"] = prompt
        return reply
    reply = _sglang_reply(tokens)
    return reply


@pytest.mark.parametrize("dialect", DIALECT_PARSERS, ids=lambda d: d.name)
@given(
    vocab=st.integers(1, 64),
    tokens=st.lists(st.integers(-(2**70), 2**70), min_size=1, max_size=4),
)
def test_generated_ids_outside_the_vocabulary_are_refused_naming_the_first(
    dialect: Dialect, vocab: int, tokens: list[int]
) -> None:
    # The prompt [0, 5, 22, 1] must pass: a vocabulary of at least 23.
    vocab += 22
    raw = json.dumps(_consistent(dialect, tokens, list(CALL.prompt_token_ids))).encode()
    outside = [(i, t) for i, t in enumerate(tokens) if not 0 <= t < vocab]
    if not outside:
        assert dialect.parse(CALL, raw, vocab_size=vocab).token_ids == tokens
        return
    with pytest.raises(DataFailure) as caught:
        dialect.parse(CALL, raw, vocab_size=vocab)
    position, token = outside[0]
    assert caught.value.reason == "token_out_of_vocab"
    assert f"[{position}] is {token}, outside the vocabulary [0, {vocab})" in caught.value.detail


@pytest.mark.parametrize("dialect", DIALECT_PARSERS[:2], ids=lambda d: d.name)
def test_an_echoed_prompt_id_outside_the_vocabulary_is_refused(dialect: Dialect) -> None:
    call = CallSpec(prompt_token_ids=[0, 5, 40], max_tokens=4)
    raw = json.dumps(_consistent(dialect, [7], [0, 5, 40])).encode()
    with pytest.raises(DataFailure) as caught:
        dialect.parse(call, raw, vocab_size=38)
    assert caught.value.reason == "token_out_of_vocab"
    assert caught.value.detail == "prompt_token_ids[2] is 40, outside the vocabulary [0, 38)"
