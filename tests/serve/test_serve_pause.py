"""``/pause?mode=keep``, ``/resume``, ``/is_paused`` and token-by-token generation: a call
in flight stops between two tokens, weights loaded meanwhile generate the rest, and the
``/inference/v1/generate`` reply's ``weight_versions`` spans say which version made which
token, each token's logprob that version's. Over real sockets."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from serve_support import WAIT_S, peaked_params

from rollout_recovery.policy import PolicySnapshot
from rollout_recovery.policy._tasks import BOS, THINK, THOUGHT_BASE, digit_token
from rollout_recovery.serve import PolicyServer, ServeSettings
from rollout_recovery.serve._app import WEIGHT_VERSION_HEADER

PROMPT = [BOS, digit_token(1), THINK]
TOKENS = 8
SPLIT_AFTER = 2  # the hook holds the request after the token at this position
KEY = "pause-test-key"


def _snapshot(version: int, thought: int) -> PolicySnapshot:
    params = peaked_params(thought=thought, answer=0)
    return PolicySnapshot(version, {name: np.array(table) for name, table in params.items()})


V0 = _snapshot(0, thought=5)
V1 = _snapshot(1, thought=7)


class Hold:
    """Holds the generation request after the token at ``SPLIT_AFTER`` until released."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, position: int) -> None:
        if position == SPLIT_AFTER:
            self.reached.set()
            assert self.release.wait(WAIT_S)


@pytest.fixture
def hold() -> Hold:
    return Hold()


@pytest.fixture
def paced(hold: Hold) -> Iterator[PolicyServer]:
    settings = ServeSettings(port=0, token_latency_s=0.001, api_key=KEY)
    with PolicyServer(settings, initial_weights=V0, on_token=hold) as running:
        yield running


def _client(server: PolicyServer) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, timeout=WAIT_S, headers={"Authorization": f"Bearer {KEY}"}
    )


def _generate_in_thread(server: PolicyServer) -> tuple[threading.Thread, list[httpx.Response]]:
    replies: list[httpx.Response] = []

    def call() -> None:
        body = {
            "token_ids": PROMPT,
            "sampling_params": {"max_tokens": TOKENS, "logprobs": 0},
        }
        with _client(server) as client:
            replies.append(client.post("/inference/v1/generate", json=body))

    thread = threading.Thread(target=call)
    thread.start()
    return thread, replies


def _push(client: httpx.Client, snapshot: PolicySnapshot) -> None:
    params = {name: table.tolist() for name, table in snapshot.params.items()}
    response = client.post("/update_weights", json={"version": snapshot.version, "params": params})
    assert response.status_code == 200, response.text


def _finish(
    hold: Hold, server: PolicyServer, between: Callable[[httpx.Client], None]
) -> dict[str, Any]:
    thread, replies = _generate_in_thread(server)
    assert hold.reached.wait(WAIT_S)
    with _client(server) as client:
        between(client)
    hold.release.set()
    thread.join(WAIT_S)
    (reply,) = replies
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    body["header_version"] = reply.headers[WEIGHT_VERSION_HEADER]
    return body


def _tokens_and_logprobs(body: dict[str, Any]) -> tuple[list[int], list[float]]:
    choice = body["choices"][0]
    return choice["token_ids"], [entry["logprob"] for entry in choice["logprobs"]["content"]]


def test_a_call_paused_between_tokens_finishes_under_the_weights_loaded_meanwhile(
    paced: PolicyServer, hold: Hold
) -> None:
    def pause_load_resume(client: httpx.Client) -> None:
        assert client.get("/is_paused").json() == {"is_paused": False}
        paused = client.post("/pause?mode=keep", json={})
        assert paused.status_code == 200 and paused.json() == {"status": "paused"}
        assert client.get("/is_paused").json() == {"is_paused": True}
        _push(client, V1)
        assert client.post("/resume", json={}).json() == {"status": "resumed"}
        assert client.get("/is_paused").json() == {"is_paused": False}

    body = _finish(hold, paced, pause_load_resume)
    split = SPLIT_AFTER + 1
    spans = body["choices"][0]["weight_versions"]
    assert spans == [
        {"version": "0", "start": 0, "end": split},
        {"version": "1", "start": split, "end": TOKENS},
    ]
    assert body["header_version"] == "1"
    tokens, logprobs = _tokens_and_logprobs(body)
    # The spans tile the generated tokens; each token's logprob is its version's.
    assert len(tokens) == TOKENS == spans[-1]["end"]
    mask = [0.0] * len(PROMPT) + [1.0] * TOKENS
    row = PROMPT + tokens
    for span in spans:
        snapshot = V0 if span["version"] == "0" else V1
        expected = snapshot.token_logprobs(row, mask)[len(PROMPT) :]
        start, end = span["start"], span["end"]
        assert logprobs[start:end] == pytest.approx(expected[start:end].tolist(), abs=0)
    assert tokens[:split] == [THOUGHT_BASE + 5] * split
    assert tokens[split:] == [THOUGHT_BASE + 7] * (TOKENS - split)


def test_a_load_without_a_pause_never_changes_a_call_in_flight(
    paced: PolicyServer, hold: Hold
) -> None:
    body = _finish(hold, paced, lambda client: _push(client, V1))
    assert body["choices"][0]["weight_versions"] == [{"version": "0", "start": 0, "end": TOKENS}]
    assert body["header_version"] == "0"


def test_a_pause_and_resume_without_a_load_keeps_one_version(
    paced: PolicyServer, hold: Hold
) -> None:
    def pause_resume(client: httpx.Client) -> None:
        client.post("/pause?mode=keep", json={}).raise_for_status()
        client.post("/resume", json={}).raise_for_status()

    body = _finish(hold, paced, pause_resume)
    assert body["choices"][0]["weight_versions"] == [{"version": "0", "start": 0, "end": TOKENS}]


@pytest.mark.parametrize("query", ["", "?mode=abort", "?mode=wait", "?mode=keep&clear_cache=x"])
def test_pause_refuses_what_it_does_not_serve(paced: PolicyServer, query: str) -> None:
    with _client(paced) as client:
        response = client.post(f"/pause{query}", json={})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] in ("mode", "clear_cache")
        assert client.get("/is_paused").json() == {"is_paused": False}


def test_the_pause_routes_keep_the_servers_guard(paced: PolicyServer) -> None:
    with httpx.Client(base_url=paced.url, timeout=WAIT_S) as anonymous:
        assert anonymous.post("/pause?mode=keep", json={}).status_code == 401
        assert anonymous.post("/resume", json={}).status_code == 401
        assert anonymous.get("/is_paused").status_code == 401
    with _client(paced) as client:
        # A POST must be declared JSON (a web page's plain-text POST needs no preflight).
        assert client.post("/pause?mode=keep", content=b"").status_code == 415
        assert client.post("/is_paused", json={}).status_code == 405
        assert client.get("/pause").status_code == 405
        assert client.get("/is_paused").json() == {"is_paused": False}


def test_a_request_waiting_out_a_pause_is_answered_at_shutdown() -> None:
    admitted = threading.Event()
    settings = ServeSettings(port=0, token_latency_s=0.001)
    server = PolicyServer(settings, initial_weights=V0, on_token=lambda _: admitted.set())
    server.start()
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as client:
        client.post("/pause?mode=keep", json={}).raise_for_status()
    # The pause's own body is counted until just after its answer went out: once it is
    # released, a body held is the generation request's.
    assert server.wait_for_transport(lambda stats: stats.body_bytes == 0, WAIT_S)
    thread, replies = _generate_in_thread(server)
    # Paused: the request is being handled (its body held) but waits before its first
    # token; shutdown releases it with a 503.
    assert server.wait_for_transport(lambda stats: stats.body_bytes > 0, WAIT_S)
    server.close(grace_s=WAIT_S)
    assert server.finished_in_grace
    thread.join(WAIT_S)
    assert not admitted.is_set()
    assert [reply.status_code for reply in replies] == [503]
