"""Our answers have vLLM 0.32's shapes: each captured exchange is replayed against the server.

The server serves the fixtures' model name (``tiny``) and their prompts are valid in the
policy's vocabulary, so every captured request is sent as it was; the answer must have the
same fields in the same order, with the same types and list lengths. Values differ (another
model), except where the rule is the same: errors, versions, echoed ids, usage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from serve_support import FIXTURES, expand, load_fixture, load_fixture_text, shape

from rollout_recovery.serve import PolicyServer, ServeSettings
from rollout_recovery.serve._app import WEIGHT_VERSION_HEADER

MODEL = "tiny"


@pytest.fixture
def tiny() -> Iterator[httpx.Client]:
    with (
        PolicyServer(ServeSettings(model_name=MODEL, max_model_len=512)) as running,
        httpx.Client(base_url=running.url, timeout=30.0) as http,
    ):
        yield http


def _send(client: httpx.Client, exchange: dict[str, Any]) -> httpx.Response:
    request = exchange.get("request")
    return client.request(
        exchange["method"],
        exchange["path"],
        json=None if request is None else expand(request),
        params=exchange.get("params"),
    )


def _same_offsets_rule(logprobs: dict[str, Any]) -> None:
    # vLLM's text_offset: the running sum of the tokens' lengths.
    expected, offset = [], 0
    for token in logprobs["tokens"]:
        expected.append(offset)
        offset += len(token)
    assert logprobs["text_offset"] == expected


GENERATIONS = [
    "completions_token_in.json",
    "completions_token_in_top1.json",
    "generate.json",
    "generate_minimal.json",
    "generate_top2.json",
]


@pytest.mark.parametrize("name", GENERATIONS)
def test_a_generation_answer_has_the_captured_shape(tiny: httpx.Client, name: str) -> None:
    exchange = load_fixture(name)
    response = _send(tiny, exchange)
    assert response.status_code == exchange["status"]
    assert response.headers["content-type"] == exchange["content_type"]
    ours, theirs = response.json(), exchange["response"]
    assert shape(ours) == shape(theirs)
    assert ours["usage"] == theirs["usage"]
    assert ours["model"] == theirs["model"]
    assert response.headers[WEIGHT_VERSION_HEADER] == "0"
    if exchange["path"] == "/v1/completions":
        assert ours["id"].startswith("cmpl-") and len(ours["id"]) == len(theirs["id"])
        choice, their_choice = ours["choices"][0], theirs["choices"][0]
        assert choice["prompt_token_ids"] == their_choice["prompt_token_ids"]
        _same_offsets_rule(choice["logprobs"])
        _same_offsets_rule(their_choice["logprobs"])
    else:
        assert ours["request_id"].startswith("generate-tokens-")
        assert len(ours["request_id"]) == len(theirs["request_id"])
        assert ours["prompt_token_ids"] == theirs["prompt_token_ids"]
        spans = ours["choices"][0]["weight_versions"]
        assert spans == [{"version": "0", "start": 0, "end": 4}]


def test_health_and_models_have_the_captured_shape(tiny: httpx.Client) -> None:
    captured = load_fixture("health.json")
    health = _send(tiny, captured["health"])
    assert health.status_code == 200
    assert health.content == b""
    assert "content-type" not in health.headers
    models = _send(tiny, captured["models"])
    assert models.status_code == 200
    assert shape(models.json()) == shape(captured["models"]["response"])
    card = models.json()["data"][0]
    assert (card["id"], card["max_model_len"], card["owned_by"]) == (MODEL, 512, "rollout-recovery")
    version = _send(tiny, captured["version"])
    assert shape(version.json()) == shape(captured["version"]["response"])


@pytest.mark.parametrize(
    "case",
    ["completions", "generate", "completions_negative", "completions_wrong_model"],
)
def test_a_refusal_has_the_captured_error_body(tiny: httpx.Client, case: str) -> None:
    exchange = load_fixture("error_bad_token.json")[case]
    response = _send(tiny, exchange)
    assert response.status_code == exchange["status"]
    ours, theirs = response.json()["error"], exchange["response"]["error"]
    assert list(ours) == list(theirs)
    assert (ours["type"], ours["param"], ours["code"]) == (
        theirs["type"],
        theirs["param"],
        theirs["code"],
    )
    if case != "completions_negative":  # pydantic's wording there is not ours
        assert ours["message"].startswith(theirs["message"])


OVERFLOW_CASES = [
    "completions_prompt510_max8_clamped",
    "completions_prompt512_max4",
    "completions_prompt600_max4",
    "completions_prompt4_max600",
    "generate_prompt510_max8_clamped",
    "generate_prompt512_max4",
    "generate_prompt600_max4",
]


@pytest.mark.parametrize("case", OVERFLOW_CASES)
def test_context_overflow_is_what_vllm_does(tiny: httpx.Client, case: str) -> None:
    # Past the context vLLM cuts the generation to what fits (200, finish "length"); a
    # prompt that leaves no room, or max_tokens over the context, is refused.
    exchange = load_fixture("error_context_overflow.json")[case]
    response = _send(tiny, exchange)
    assert response.status_code == exchange["status"]
    ours, theirs = response.json(), expand(exchange["response"])
    assert shape(ours) == shape(theirs)
    if "error" in theirs:
        assert ours == theirs
    else:
        assert ours["usage"] == theirs["usage"]
        assert ours["choices"][0]["finish_reason"] == "length"


def test_every_captured_overflow_case_is_replayed() -> None:
    captured = load_fixture("error_context_overflow.json")
    assert set(captured) - {"notes"} == set(OVERFLOW_CASES)


def test_the_weight_version_routes_follow_the_captured_steps(tiny: httpx.Client) -> None:
    steps = load_fixture("weight_versions.json")["steps"]
    # vLLM's versions are free strings ("default", "step-7"); ours are numbers.
    ours_for = {"default": "0", "step-7": "7", "step-8": "8"}
    replayed = 0
    for step in steps:
        if "method" not in step or step["path"] in {"/pause", "/resume", "/is_paused"}:
            continue  # an in-flight request note, and pause routes this server lacks
        if isinstance(step["response"].get("choices", [{}])[0].get("token_ids"), str):
            continue  # a long answer whose ids were elided from the capture
        request = step.get("request")
        if isinstance(request, dict) and isinstance(request.get("new_version"), str):
            step = {**step, "request": {"new_version": ours_for[request["new_version"]]}}
        response = _send(tiny, step)
        replayed += 1
        if step["method"] == "POST" and request is None:
            # No body, so no Content-Type: this server refuses every POST that does not
            # declare JSON (415) before it looks at a field; vLLM says the field is
            # missing (400). Both refuse, and nothing changes.
            assert response.status_code == 415, response.text
            continue
        assert response.status_code == step["status"], (step, response.text)
        ours, theirs = response.json(), step["response"]
        assert shape(ours) == shape(theirs), step["path"]
        if "error" in theirs:
            assert (ours["error"]["type"], ours["error"]["param"]) == (
                theirs["error"]["type"],
                theirs["error"]["param"],
            )
        elif step["path"] == "/weight_info":
            assert ours["weight_version"] == ours_for[theirs["weight_version"]]
        elif step["path"] == "/update_weight_version":
            assert ours == {"success": True, "new_version": ours_for[theirs["new_version"]]}
        else:
            their_span = theirs["choices"][0]["weight_versions"][0]
            ours_span = ours["choices"][0]["weight_versions"][0]
            assert ours_span == {**their_span, "version": ours_for[their_span["version"]]}
    assert replayed >= 8


@pytest.mark.parametrize("name", ["completions_stream.txt", "generate_stream.txt"])
def test_a_captured_streaming_request_is_refused(tiny: httpx.Client, name: str) -> None:
    first = load_fixture_text(name).splitlines()[0]
    method, path, request = first.removeprefix("# ").split(" ", 2)
    body = json.loads(request)
    assert body["stream"] is True
    response = tiny.request(method, path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["type"]) == ("stream", "BadRequestError")
    assert error["message"].startswith("streaming not supported")


def test_every_captured_exchange_is_compared() -> None:
    # A new capture must be looked at here: add it to a test above, or say why not.
    compared = {
        *GENERATIONS,
        "health.json",
        "error_bad_token.json",
        "error_context_overflow.json",
        "weight_versions.json",
        "completions_stream.txt",
        "generate_stream.txt",
        "README.md",
    }
    assert {path.name for path in FIXTURES.iterdir()} == compared
