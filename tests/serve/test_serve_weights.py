"""Weights: loaded atomically, never backwards, never under a request in flight; shutdown."""

from __future__ import annotations

import http.client
import threading
from typing import Any

import httpx
import numpy as np
import pytest
from serve_support import WAIT_S, Gate, peaked_params

from rollout_recovery.errors import InvalidOperationError
from rollout_recovery.policy import NumpyGRPOTrainer
from rollout_recovery.policy._tasks import BOS, THINK, THOUGHT_BASE, digit_token
from rollout_recovery.serve import PolicyServer, ServeSettings
from rollout_recovery.serve._app import WEIGHT_VERSION_HEADER

PROMPT = [BOS, digit_token(1), THINK]


def _push(client: httpx.Client, version: int, thought: int) -> httpx.Response:
    body = {"version": version, "params": peaked_params(thought=thought, answer=0)}
    return client.post("/update_weights", json=body)


def _thoughts(client: httpx.Client, **fields: Any) -> tuple[list[int], str]:
    body = {"prompt": PROMPT, "max_tokens": 6, "return_token_ids": True, **fields}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"], response.headers[WEIGHT_VERSION_HEADER]


def test_loaded_weights_serve_every_later_request(
    server: PolicyServer, client: httpx.Client
) -> None:
    response = _push(client, 1, thought=5)
    assert response.status_code == 200
    assert response.json() == {"weight_version": "1"}
    assert client.get("/weight_info").json() == {"weight_version": "1"}
    assert server.weights.version == 1
    assert _thoughts(client) == ([THOUGHT_BASE + 5] * 6, "1")
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 2}}
    generated = client.post("/inference/v1/generate", json=body).json()
    assert generated["choices"][0]["weight_versions"][0]["version"] == "1"


def test_versions_only_move_forwards(client: httpx.Client) -> None:
    assert _push(client, 3, thought=2).status_code == 200
    older = _push(client, 2, thought=7)
    assert older.status_code == 409
    error = older.json()["error"]
    assert (error["type"], error["param"]) == ("ConflictError", "version")
    assert "older" in error["message"]
    # The same version with other params would be two policies under one version.
    clash = _push(client, 3, thought=7)
    assert clash.status_code == 409
    assert "other params" in clash.json()["error"]["message"]
    # The same push again (its answer was lost, say) is a no-op.
    assert _push(client, 3, thought=2).json() == {"weight_version": "3"}
    assert _thoughts(client) == ([THOUGHT_BASE + 2] * 6, "3")
    assert _push(client, 4, thought=7).status_code == 200
    assert _thoughts(client) == ([THOUGHT_BASE + 7] * 6, "4")


def test_a_version_label_moves_forwards_only_and_keeps_the_weights(client: httpx.Client) -> None:
    before = _thoughts(client, seed=11)[0]
    answer = client.post("/update_weight_version", json={"new_version": "5"})
    assert answer.json() == {"success": True, "new_version": "5"}
    assert client.get("/weight_info").json() == {"weight_version": "5"}
    assert _thoughts(client, seed=11) == (before, "5")
    older = client.post("/update_weight_version", json={"new_version": "4"})
    assert older.status_code == 409
    assert client.get("/weight_info").json() == {"weight_version": "5"}
    # A weight push must then carry a version >= 5.
    assert _push(client, 4, thought=1).status_code == 409
    assert _push(client, 6, thought=1).status_code == 200


def test_an_update_mid_flight_leaves_the_request_its_snapshot() -> None:
    gate = Gate()
    initial = NumpyGRPOTrainer(seed=0).weights()
    with (
        PolicyServer(ServeSettings(seed=0), on_admitted=gate) as server,
        httpx.Client(base_url=server.url, timeout=WAIT_S) as client,
    ):
        answers: list[tuple[list[int], str]] = []
        in_flight = threading.Thread(target=lambda: answers.append(_thoughts(client, seed=21)))
        in_flight.start()
        assert gate.entered.wait(WAIT_S)
        # While the request holds its snapshot, new weights land and are served.
        assert _push(client, 1, thought=4).status_code == 200
        assert _thoughts(client) == ([THOUGHT_BASE + 4] * 6, "1")
        gate.release.set()
        in_flight.join(WAIT_S)
        assert not in_flight.is_alive()
    expected, _ = initial.sample_reasoning(1, 6, np.random.default_rng(21))
    assert answers == [(expected, "0")]
    assert expected != [THOUGHT_BASE + 4] * 6


def test_shutdown_cuts_the_call_latency_of_requests_in_flight() -> None:
    admitted = threading.Event()
    server = PolicyServer(ServeSettings(call_latency_s=600.0), on_admitted=admitted.set)
    server.start()
    answers: list[httpx.Response] = []

    def call() -> None:
        with httpx.Client(base_url=server.url, timeout=WAIT_S) as client:
            answers.append(client.post("/v1/completions", json={"prompt": PROMPT}))

    caller = threading.Thread(target=call)
    caller.start()
    try:
        assert admitted.wait(WAIT_S)
    finally:
        server.close(grace_s=WAIT_S)
    caller.join(WAIT_S)
    assert server.finished_in_grace
    assert [a.status_code for a in answers] == [503]
    assert answers[0].json()["error"]["type"] == "ServiceUnavailableError"
    assert answers[0].headers["connection"] == "close"


def test_the_call_latency_is_waited_before_answering() -> None:
    # Not a synchronization: the elapsed time is what is measured.
    with (
        PolicyServer(ServeSettings(call_latency_s=0.3)) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        response = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
    assert response.status_code == 200
    assert response.elapsed.total_seconds() >= 0.3


def test_connections_are_kept_alive_and_closed_at_shutdown() -> None:
    server = PolicyServer()
    server.start()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT_S)
    try:
        for _ in range(3):
            connection.request("GET", "/health")
            response = connection.getresponse()
            assert response.status == 200 and response.read() == b""
            assert response.getheader("connection") != "close"
        sock = connection.sock
        connection.request("GET", "/v1/models")
        connection.getresponse().read()
        assert connection.sock is sock  # one connection all along
    finally:
        server.close()
    assert server.finished_in_grace
    # The idle keep-alive connection was ended with the server: nothing answers on it.
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        connection.request("GET", "/health")
        connection.getresponse()
    connection.close()


def test_close_is_idempotent_and_a_server_starts_once() -> None:
    server = PolicyServer()
    server.start()
    with pytest.raises(InvalidOperationError):
        server.start()
    server.close()
    assert server.finished_in_grace
    server.close()  # a no-op: the socket is not closed twice, nothing raises
    assert server.finished_in_grace
    with pytest.raises(InvalidOperationError):
        server.start()
    never_started = PolicyServer()
    never_started.close()
    never_started.close()
    assert never_started.finished_in_grace
