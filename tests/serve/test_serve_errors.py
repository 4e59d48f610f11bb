"""Every refusal: its status, vLLM's error body, and the field or value it names."""

from __future__ import annotations

import json
import logging
import socket
import threading
from typing import Any

import httpx
import pytest
from serve_support import peaked_params

from rollout_recovery.policy import NumpyGRPOTrainer
from rollout_recovery.policy._tasks import ANSWER, BOS, FILLER_BASE, THINK, VOCAB_SIZE, digit_token
from rollout_recovery.serve import PolicyServer, ServeSettings
from rollout_recovery.serve._app import ServeApp
from rollout_recovery.serve._weights import WeightStore

PROMPT = [BOS, FILLER_BASE, digit_token(4), FILLER_BASE + 3, THINK]


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["error"]
    error: dict[str, Any] = body["error"]
    assert list(error) == ["message", "type", "param", "code"]
    assert error["code"] == status
    return error


def _completion(client: httpx.Client, **fields: Any) -> httpx.Response:
    return client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, **fields})


def _generate(client: httpx.Client, **sampling: Any) -> httpx.Response:
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 4, **sampling}}
    return client.post("/inference/v1/generate", json=body)


# -- routes, methods, bodies -------------------------------------------------------------


def test_an_unknown_route_is_404(client: httpx.Client) -> None:
    error = _error(client.get("/v1/chat/completions"), 404)
    assert error["type"] == "NotFoundError"
    assert "/v1/chat/completions" in error["message"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/health", "GET"),
        ("GET", "/v1/completions", "POST"),
        ("DELETE", "/update_weights", "POST"),
        ("PUT", "/weight_info", "GET"),
        ("HEAD", "/inference/v1/generate", "POST"),
    ],
)
def test_a_wrong_method_is_405_with_allow(
    client: httpx.Client, method: str, path: str, allow: str
) -> None:
    response = client.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    if method != "HEAD":
        assert _error(response, 405)["type"] == "MethodNotAllowedError"


def test_head_of_a_get_route_answers_headers_only(client: httpx.Client) -> None:
    response = client.head("/v1/models")
    assert response.status_code == 200
    assert response.content == b""
    assert int(response.headers["content-length"]) > 0


def test_a_wrong_model_is_404_naming_it(client: httpx.Client) -> None:
    error = _error(_completion(client, model="gpt-4"), 404)
    assert (error["type"], error["param"]) == ("NotFoundError", "model")
    assert error["message"] == (
        "The model `gpt-4` does not exist. Valid aliases: rollout-recovery-numpy."
    )
    assert (
        _error(
            client.post(
                "/inference/v1/generate",
                json={"model": "x", "token_ids": PROMPT, "sampling_params": {}},
            ),
            404,
        )["param"]
        == "model"
    )


@pytest.mark.parametrize("body", [b"{", b"not json", b'{"prompt": [1,2,]}', b"\xff\xfe"])
def test_malformed_json_is_400(client: httpx.Client, body: bytes) -> None:
    response = client.post(
        "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    error = _error(response, 400)
    assert error["type"] == "Bad Request"
    assert "JSON" in error["message"]


def _deep(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


_DEEP_BODIES = pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", _deep(100_000)),
        ("/v1/completions", '{"a":' * 100_000 + "1" + "}" * 100_000),
        ("/v1/completions", '{"prompt": ' + _deep(100_000) + "}"),
        ("/update_weights", '{"version": 1, "params": {"x": ' + _deep(50_000) + "}}"),
        ("/inference/v1/generate", '{"sampling_params": ' + _deep(5_000) + "}"),
    ],
    ids=["array", "object", "in-field", "in-params", "in-generate"],
)


@_DEEP_BODIES
def test_a_deeply_nested_body_is_413_before_it_is_decoded(
    client: httpx.Client, caplog: pytest.LogCaptureFixture, path: str, body: str
) -> None:
    """Far more than any route takes (issue 24 item 16): refused undecoded, for its bytes
    or (where they fit) for its JSON values."""
    caplog.set_level(logging.DEBUG, logger="rollout_recovery.serve")
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    error = _error(response, 413)
    assert "limit of" in error["message"] or "JSON values" in error["message"]
    assert not caplog.records, [record.getMessage() for record in caplog.records]
    # The server goes on answering on the same connection.
    assert client.get("/health").status_code == 200


@_DEEP_BODIES
def test_a_deeply_nested_body_the_route_would_take_is_400_without_a_traceback(
    caplog: pytest.LogCaptureFixture, path: str, body: str
) -> None:
    """A context so long that a generation route takes that many values: the decoder's
    own depth bound refuses it (a weight push never takes them)."""
    caplog.set_level(logging.DEBUG, logger="rollout_recovery.serve")
    settings = ServeSettings(max_model_len=300_000)
    with PolicyServer(settings) as server, httpx.Client(base_url=server.url) as client:
        response = client.post(path, content=body, headers={"content-type": "application/json"})
        if path == "/update_weights":
            assert _error(response, 413)
        else:
            error = _error(response, 400)
            assert error["type"] == "Bad Request"
            assert "nested too deeply" in error["message"]
        assert not caplog.records, [record.getMessage() for record in caplog.records]
        assert client.get("/health").status_code == 200


def test_a_deeply_nested_body_is_refused_without_a_transport() -> None:
    app = ServeApp(
        ServeSettings(),
        WeightStore(NumpyGRPOTrainer(seed=0).weights()),
        stopping=threading.Event(),
    )
    headers = [("Host", "127.0.0.1:8000"), ("Content-Type", "application/json")]
    response = app.handle("POST", "/update_weights", _deep(100_000).encode(), headers)
    assert response.status == 413
    assert b"JSON values" in response.body


@pytest.mark.parametrize(
    "body",
    [
        b'{"prompt": [1, 2], "model": "\xff"}',  # invalid UTF-8 in a string
        b'{"prompt": [1, 2], "model": "\\ud800"}',  # a lone surrogate
        b'{"prompt": [1' + b"0" * 5000 + b"]}",  # an integer past 64 bits
        b'{"prompt": [1, 2], "max_tokens": 1e999}',  # a float past a double
        b'{"prompt": [1, 2], "seed": -1' + b"0" * 5000 + b"}",
    ],
    ids=["utf8", "surrogate", "huge-int", "huge-float", "huge-negative"],
)
def test_every_decode_failure_is_400(
    client: httpx.Client, caplog: pytest.LogCaptureFixture, body: bytes
) -> None:
    caplog.set_level(logging.DEBUG, logger="rollout_recovery.serve")
    response = client.post(
        "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert "JSON decode error" in _error(response, 400)["message"]
    assert not caplog.records


def test_a_duplicate_key_keeps_its_last_value_as_vllm_does(client: httpx.Client) -> None:
    # vLLM reads bodies with Python's json, where the last of two equal keys wins.
    assert json.loads('{"a": 1, "a": 2}') == {"a": 2}
    body = (
        '{"prompt": '
        + json.dumps(PROMPT)
        + ', "return_token_ids": true, "max_tokens": 9, "max_tokens": 1}'
    )
    response = client.post(
        "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"][0]["token_ids"]) == 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        # Each as large as its route takes (item 16: larger ones are 413s).
        ("/update_weights", {"version": "x" * 60_000, "params": {}}),
        ("/update_weights", {"version": 1, "params": {"y" * 60_000: 1}}),
        ("/update_weight_version", {"new_version": "9" * 60_000}),
        ("/update_weight_version", {"new_version": [[[[[[[[[[1]]]]]]]]]] * 20}),
    ],
    ids=["version", "param-name", "label", "label-list"],
)
def test_a_refused_value_is_quoted_short(
    client: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    error = _error(client.post(path, json=body), 400)
    assert len(error["message"]) < 400, error["message"]


@pytest.mark.parametrize("body", [[1, 2], "prompt", 3, None])
def test_a_body_that_is_not_an_object_is_400(client: httpx.Client, body: object) -> None:
    response = client.post(
        "/update_weights",
        content=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    assert "JSON object" in _error(response, 400)["message"]


def test_a_wrongly_typed_field_is_a_schema_error_naming_it(client: httpx.Client) -> None:
    error = _error(_completion(client, max_tokens="4"), 400)
    assert (error["type"], error["param"]) == ("Bad Request", "body.max_tokens")
    error = _error(_generate(client, seed=True), 400)
    assert (error["type"], error["param"]) == ("Bad Request", "body.sampling_params.seed")
    error = _error(client.post("/v1/completions", json={"max_tokens": 4}), 400)
    assert (error["message"], error["param"]) == ("Field required", "body.prompt")
    error = _error(client.post("/inference/v1/generate", json={"token_ids": PROMPT}), 400)
    assert (error["message"], error["param"]) == ("Field required", "body.sampling_params")


def test_a_body_over_the_cap_is_413_and_not_read() -> None:
    settings = ServeSettings(max_body_bytes=1024)
    with PolicyServer(settings) as server, httpx.Client(base_url=server.url) as client:
        big = {"prompt": PROMPT, "padding": "x" * 2048}
        response = client.post("/v1/completions", json=big)
        error = _error(response, 413)
        assert error["type"] == "RequestEntityTooLargeError"
        assert "1024" in error["message"]
        assert response.headers["connection"] == "close"
        # Just under the cap is read and answered.
        small = {"prompt": PROMPT, "max_tokens": 1, "padding": "x" * 900}
        assert client.post("/v1/completions", json=small).status_code == 200


def _raw(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_expect_continue_over_the_cap_is_refused_before_the_body() -> None:
    with PolicyServer(ServeSettings(max_body_bytes=10)) as server:
        answer = _raw(
            server.url,
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n"
            b"Content-Type: application/json\r\n"
            b"Expect: 100-continue\r\n\r\n",
        )
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"100 Continue" not in answer


@pytest.mark.parametrize(
    ("declared", "status"),
    [
        (b"1_0", 400),
        (b"+5", 400),
        (b"-1", 400),
        (b"\xb2", 400),  # "2" superscript in latin-1: str.isdigit() takes it
        (b"0x10", 400),
        (b"9" * 5000, 413),  # int() of it would raise; more than any cap anyway
    ],
    ids=["underscore", "plus", "negative", "superscript", "hex", "5000-digits"],
)
def test_a_content_length_that_is_not_ascii_digits_is_refused(
    server: PolicyServer, declared: bytes, status: int
) -> None:
    answer = _raw(
        server.url,
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
        + declared
        + b"\r\nContent-Type: application/json\r\n\r\n{}",
    )
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:200]


def test_a_chunked_body_is_411(server: PolicyServer) -> None:
    answer = _raw(
        server.url,
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n",
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 411 ")
    assert json.loads(body)["error"]["code"] == 411


def test_a_malformed_request_line_gets_a_json_error(server: PolicyServer) -> None:
    answer = _raw(server.url, b"GARBAGE\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b" 400 " in head.split(b"\r\n")[0]
    assert json.loads(body)["error"]["code"] == 400


def test_an_internal_failure_is_500_and_the_server_goes_on() -> None:
    calls = []

    def explode() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("boom")

    with PolicyServer(on_admitted=explode) as server, httpx.Client(base_url=server.url) as client:
        error = _error(_completion(client), 500)
        assert error["type"] == "InternalServerError"
        assert _completion(client).status_code == 200


# -- what this server cannot honour ------------------------------------------------------


@pytest.mark.parametrize(
    "prompt",
    ["<bos> 4 <think>", ["<bos>", "4"], [PROMPT, PROMPT]],
    ids=["text", "texts", "two prompts"],
)
def test_only_one_token_prompt_is_taken(client: httpx.Client, prompt: object) -> None:
    error = _error(client.post("/v1/completions", json={"prompt": prompt}), 400)
    assert error["param"] == "prompt"
    if isinstance(prompt, str) or isinstance(prompt[0], str):
        assert "token-in only" in error["message"]


@pytest.mark.parametrize("prompt", [[1.5, 2], [True, 4], [[1, "a"]], {"ids": [4]}])
def test_a_prompt_of_other_values_is_a_schema_error(client: httpx.Client, prompt: object) -> None:
    error = _error(client.post("/v1/completions", json={"prompt": prompt}), 400)
    assert (error["type"], error["param"]) == ("Bad Request", "body.prompt")


def test_a_token_outside_the_vocabulary_is_named_with_its_position(client: httpx.Client) -> None:
    prompt = [BOS, digit_token(2), VOCAB_SIZE, THINK]
    error = _error(client.post("/v1/completions", json={"prompt": prompt}), 400)
    assert error["message"].startswith(f"Token id {VOCAB_SIZE} is out of vocabulary")
    assert "prompt[2]" in error["message"]
    error = _error(client.post("/v1/completions", json={"prompt": [BOS, digit_token(2), -3]}), 400)
    assert error["param"] == "body.prompt.2"
    assert "-3" in error["message"]
    body = {"token_ids": [BOS, digit_token(2), 10**6], "sampling_params": {}}
    error = _error(client.post("/inference/v1/generate", json=body), 400)
    assert "token_ids[2]" in error["message"]


def test_a_prompt_without_a_digit_is_refused(client: httpx.Client) -> None:
    error = _error(client.post("/v1/completions", json={"prompt": [BOS, THINK]}), 400)
    assert "no digit" in error["message"]
    error = _error(client.post("/v1/completions", json={"prompt": []}), 400)
    assert error["message"] == "Prompt cannot be empty"


@pytest.mark.parametrize("temperature", [0.0, 0.7, 2.0])
def test_another_temperature_is_refused_not_ignored(
    client: httpx.Client, temperature: float
) -> None:
    error = _error(_completion(client, temperature=temperature), 400)
    assert error["param"] == "temperature"
    assert "1.0" in error["message"]
    assert _error(_generate(client, temperature=temperature), 400)["param"] == (
        "sampling_params.temperature"
    )


def test_temperature_one_or_none_is_taken(client: httpx.Client) -> None:
    assert _completion(client, temperature=1).status_code == 200
    assert _completion(client, temperature=None).status_code == 200


@pytest.mark.parametrize(
    ("fields", "param", "phrase"),
    [
        ({"n": 2}, "n", "one choice"),
        ({"stream": True}, "stream", "streaming not supported"),
        ({"echo": True}, "echo", "echo"),
        ({"logprobs": 21}, "logprobs", "between 0 and 20"),
        ({"logprobs": -1}, "logprobs", "between 0 and 20"),
        ({"seed": 2**64}, "seed", "64 bits"),
        ({"max_tokens": 0}, "max_tokens", "at least 1, got 0"),
        ({"max_tokens": 513}, "max_tokens", "cannot be greater than max_model_len=512"),
    ],
)
def test_a_completion_field_that_cannot_be_honoured(
    client: httpx.Client, fields: dict[str, Any], param: str, phrase: str
) -> None:
    error = _error(_completion(client, **fields), 400)
    assert (error["type"], error["param"]) == ("BadRequestError", param)
    assert phrase in error["message"]


def test_a_generate_field_that_cannot_be_honoured(client: httpx.Client) -> None:
    assert _error(_generate(client, n=3), 400)["param"] == "sampling_params.n"
    assert _error(_generate(client, max_tokens=0), 400)["param"] == "sampling_params.max_tokens"
    body = {"token_ids": PROMPT, "sampling_params": {}, "stream": True}
    assert "streaming" in _error(client.post("/inference/v1/generate", json=body), 400)["message"]


def test_ignore_eos_past_the_answer_is_refused(client: httpx.Client) -> None:
    answer_prompt = [*PROMPT, ANSWER]
    body = {"prompt": answer_prompt, "max_tokens": 3, "ignore_eos": True}
    error = _error(client.post("/v1/completions", json=body), 400)
    assert error["param"] == "ignore_eos"
    # Up to the answer's two tokens ignore_eos changes nothing but the finish reason.
    body["max_tokens"] = 2
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["text"].endswith("<eos>")
    assert len(choice["text"].split()) == 2


# -- weights -----------------------------------------------------------------------------


def _params() -> dict[str, Any]:
    return peaked_params(thought=1, answer=2)


@pytest.mark.parametrize(
    ("body", "param", "phrase"),
    [
        ({"params": _params()}, "version", "version must be an int"),
        ({"version": -1, "params": _params()}, "version", "version must be an int"),
        ({"version": True, "params": _params()}, "version", "version must be an int"),
        ({"version": "2", "params": _params()}, "version", "version must be an int"),
        ({"version": 2**63, "params": _params()}, "version", "version must be an int"),
        ({"version": 1}, "params", "params must be an object"),
        ({"version": 1, "params": [1]}, "params", "params must be an object"),
    ],
)
def test_a_bad_weight_update_is_400_naming_the_field(
    client: httpx.Client, body: dict[str, Any], param: str, phrase: str
) -> None:
    error = _error(client.post("/update_weights", json=body), 400)
    assert error["param"] == param
    assert phrase in error["message"]
    assert client.get("/weight_info").json() == {"weight_version": "0"}


def _with(name: str, value: object) -> dict[str, Any]:
    params: dict[str, Any] = _params()
    params[name] = value
    return {"version": 1, "params": params}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (_with("thought_logits", [[0.0] * 8] * 9), "thought_logits"),
        (_with("answer_logits", [[0.0] * 9] * 10), "answer_logits"),
        (_with("answer_logits", [[0.0] * 10] * 9 + [[0.0] * 9 + ["1"]]), "answer_logits"),
        (_with("answer_logits", [[0.0] * 10] * 9 + [[0.0] * 9 + [None]]), "answer_logits"),
        (_with("answer_logits", [[0.0] * 10] * 9 + [[0.0] * 9 + [True]]), "answer_logits"),
        (_with("thought_logits", 0.0), "thought_logits"),
        (_with("bias", [0.0]), "bias"),
        (
            {"version": 1, "params": {"thought_logits": _params()["thought_logits"]}},
            "answer_logits",
        ),
    ],
    ids=["rows", "columns", "string", "null", "bool", "scalar", "unknown", "missing"],
)
def test_bad_params_are_400_naming_the_param(
    client: httpx.Client, body: dict[str, Any], named: str
) -> None:
    error = _error(client.post("/update_weights", json=body), 400)
    assert error["param"] == f"params.{named}"
    assert repr(named) in error["message"]
    assert client.get("/weight_info").json() == {"weight_version": "0"}


@pytest.mark.parametrize("number", ["1e999", "NaN", "Infinity"])
def test_non_finite_params_are_refused(client: httpx.Client, number: str) -> None:
    params = json.dumps(_params()).replace("60.0", number, 1)
    body = f'{{"version": 1, "params": {params}}}'.encode()
    response = client.post(
        "/update_weights", content=body, headers={"content-type": "application/json"}
    )
    assert "JSON" in _error(response, 400)["message"]
    assert client.get("/weight_info").json() == {"weight_version": "0"}


@pytest.mark.parametrize(
    ("value", "status", "kind"),
    [
        (8, 400, "Bad Request"),
        (None, 400, "Bad Request"),
        ("step-8", 400, "BadRequestError"),
        ("-1", 400, "BadRequestError"),
        ("9" * 30, 400, "BadRequestError"),
    ],
)
def test_a_bad_version_label_is_refused(
    client: httpx.Client, value: object, status: int, kind: str
) -> None:
    body = {} if value is None else {"new_version": value}
    error = _error(client.post("/update_weight_version", json=body), status)
    assert error["type"] == kind
    assert error["param"] in {"new_version", "body.new_version"}
    assert client.get("/weight_info").json() == {"weight_version": "0"}
