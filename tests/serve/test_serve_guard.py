"""Who may talk to a server: JSON bodies, its own origin, loopback hosts, its API key.

The attack of issue 15 item 19: any web page the user visits can send a cross-origin
``text/plain`` POST to a loopback server (no preflight), or reach it under its own name by
DNS rebinding; one such POST set the served weight version to INT64_MAX.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serve_support import WAIT_S

from rollout_recovery._bounds import INT64_MAX
from rollout_recovery.errors import InvalidArgumentError
from rollout_recovery.policy import NumpyGRPOTrainer
from rollout_recovery.policy._tasks import BOS, FILLER_BASE, THINK, digit_token
from rollout_recovery.serve import PolicyServer, ServeSettings
from rollout_recovery.serve._app import ServeApp
from rollout_recovery.serve._weights import WeightStore

PROMPT = [BOS, FILLER_BASE, digit_token(4), FILLER_BASE + 3, THINK]
ATTACK = json.dumps({"new_version": str(INT64_MAX)}).encode()
KEY = "k3y-for-tests_0123456789"
SERVE = [sys.executable, "-m", "rollout_recovery", "serve", "--port", "0"]


def _version(client: httpx.Client) -> str:
    version: str = client.get("/weight_info").json()["weight_version"]
    return version


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


# -- Content-Type --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/jsonp",
        None,
    ],
)
def test_a_post_not_declared_json_is_415_and_changes_nothing(
    client: httpx.Client, content_type: str | None
) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    response = client.post("/update_weight_version", content=ATTACK, headers=headers)
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("UnsupportedMediaTypeError", 415)
    assert "application/json" in error["message"]
    # The body was never read: the connection is closed after the refusal.
    assert response.headers["connection"] == "close"
    assert _version(client) == "0"


@pytest.mark.parametrize(
    "content_type", ["application/json", "Application/JSON", "application/json; charset=utf-8"]
)
def test_a_post_declared_json_is_taken(client: httpx.Client, content_type: str) -> None:
    body = json.dumps({"new_version": "3"}).encode()
    response = client.post(
        "/update_weight_version", content=body, headers={"content-type": content_type}
    )
    assert response.status_code == 200, response.text
    assert _version(client) == "3"


# -- Origin -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "https://127.0.0.1:{port}",
        "http://127.0.0.1:1",
        "http://localhost:{port}",  # another name than the request's Host
        "null",
        "file://",
    ],
)
def test_a_foreign_origin_is_403_and_changes_nothing(
    server: PolicyServer, client: httpx.Client, origin: str
) -> None:
    response = client.post(
        "/update_weight_version",
        json={"new_version": str(INT64_MAX)},
        headers={"origin": origin.format(port=server.port)},
    )
    assert response.status_code == 403, response.text
    assert "cross-origin" in response.json()["error"]["message"]
    # Reads are refused to a foreign origin too.
    foreign = {"origin": origin.format(port=server.port)}
    assert client.get("/weight_info", headers=foreign).status_code == 403
    assert _version(client) == "0"


def test_the_servers_own_origin_is_taken(server: PolicyServer, client: httpx.Client) -> None:
    own = f"http://127.0.0.1:{server.port}"
    response = client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}, headers={"origin": own}
    )
    assert response.status_code == 200, response.text
    with httpx.Client(base_url=f"http://localhost:{server.port}") as by_name:
        origin = {"origin": f"http://localhost:{server.port}"}
        assert by_name.get("/weight_info", headers=origin).status_code == 200


# -- Host ---------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.2", "10.0.0.1"])
def test_a_host_that_is_not_loopback_is_421_and_changes_nothing(
    server: PolicyServer, client: httpx.Client, host: str
) -> None:
    response = client.post(
        "/update_weight_version",
        json={"new_version": str(INT64_MAX)},
        headers={"host": host.format(port=server.port)},
    )
    assert response.status_code == 421, response.text
    error = response.json()["error"]
    assert error["type"] == "MisdirectedRequestError"
    assert "--allow-host" in error["message"]
    assert _version(client) == "0"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:{port}", "LOCALHOST:{port}", "[::1]"])
def test_loopback_hosts_are_answered(server: PolicyServer, client: httpx.Client, host: str) -> None:
    response = client.get("/weight_info", headers={"host": host.format(port=server.port)})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /health HTTP/1.1\r\n", 400),  # no Host at all
        (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n", 400),
        (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:http\r\n", 400),
        (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n", 200),
    ],
    ids=["missing", "repeated", "malformed", "loopback"],
)
def test_a_missing_repeated_or_malformed_host_is_400(
    server: PolicyServer, head: bytes, status: int
) -> None:
    answer = _raw(server.port, head + b"Connection: close\r\n\r\n")
    assert _status(answer) == status, answer


def test_allowed_hosts_are_answered_and_star_answers_any() -> None:
    settings = ServeSettings(allowed_hosts=("API.internal", "[fd00::1]"))
    with PolicyServer(settings) as server, httpx.Client(base_url=server.url) as client:
        for host in ("api.internal:8000", "[fd00::1]:9", "localhost"):
            assert client.get("/health", headers={"host": host}).status_code == 200, host
        assert client.get("/health", headers={"host": "other.internal"}).status_code == 421
    with (
        PolicyServer(ServeSettings(allowed_hosts=("*",))) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        assert client.get("/health", headers={"host": "anything.example"}).status_code == 200


# -- the API key --------------------------------------------------------------------------


@pytest.fixture
def keyed() -> Iterator[PolicyServer]:
    with PolicyServer(ServeSettings(api_key=KEY)) as running:
        yield running


ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/health", None),
    ("GET", "/version", None),
    ("GET", "/v1/models", None),
    ("GET", "/weight_info", None),
    ("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 1}),
    ("POST", "/inference/v1/generate", {"token_ids": PROMPT, "sampling_params": {}}),
    ("POST", "/update_weight_version", {"new_version": "5"}),
]


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer"],
)
@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[r[1] for r in ROUTES])
def test_without_the_key_every_route_is_401(
    keyed: PolicyServer,
    authorization: str | None,
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    headers = {} if authorization is None else {"authorization": authorization}
    with httpx.Client(base_url=keyed.url, headers=headers) as client:
        response = client.request(method, path, json=body)
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
        assert KEY not in response.text
    assert keyed.weights.version == 0


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[r[1] for r in ROUTES])
@pytest.mark.parametrize("scheme", ["Bearer", "bearer"])
def test_with_the_key_every_route_answers(
    keyed: PolicyServer, method: str, path: str, body: dict[str, Any] | None, scheme: str
) -> None:
    with httpx.Client(base_url=keyed.url, headers={"authorization": f"{scheme} {KEY}"}) as client:
        response = client.request(method, path, json=body)
    assert response.status_code == 200, response.text


def test_the_openai_client_sends_its_key(keyed: PolicyServer) -> None:
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    completion = client.completions.create(model="rollout-recovery-numpy", prompt=PROMPT)
    assert completion.choices[0].finish_reason in {"length", "stop"}
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="EMPTY", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_the_key_is_never_shown() -> None:
    settings = ServeSettings(api_key=KEY)
    assert KEY not in repr(settings)
    with PolicyServer(settings) as server:
        assert KEY not in repr(server)


@pytest.mark.parametrize("key", ["", "has space", "tab\there", "é", "line\n"])
def test_a_key_that_cannot_travel_in_a_header_is_refused(key: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        ServeSettings(api_key=key)
    assert key not in str(caught.value) or not key


# -- transport-free -----------------------------------------------------------------------


def _app(**settings: Any) -> ServeApp:
    return ServeApp(
        ServeSettings(**settings),
        WeightStore(NumpyGRPOTrainer(seed=0).weights()),
        stopping=threading.Event(),
    )


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([("Host", "127.0.0.1:8000"), ("Content-Type", "text/plain")], 415),
        ([("Host", "evil.example"), ("Content-Type", "application/json")], 421),
        (
            [
                ("Host", "127.0.0.1:8000"),
                ("Origin", "http://evil.example"),
                ("Content-Type", "application/json"),
            ],
            403,
        ),
        ([("Content-Type", "application/json")], 400),
        ([("host", "localhost:8000"), ("content-type", "application/json")], 200),
    ],
    ids=["text-plain", "foreign-host", "foreign-origin", "no-host", "ok"],
)
def test_the_checks_are_the_apps_own(headers: list[tuple[str, str]], status: int) -> None:
    app = _app()
    assert (app.refusal("POST", "/update_weight_version", headers) is None) == (status == 200)
    response = app.handle("POST", "/update_weight_version", ATTACK, headers)
    assert response.status == status, response.body
    assert app.handle("GET", "/weight_info", b"", [("Host", "127.0.0.1")]).body == (
        b'{"weight_version":"%s"}' % (str(INT64_MAX).encode() if status == 200 else b"0")
    )


def test_a_refused_request_with_a_body_is_not_read_and_its_connection_closed(
    server: PolicyServer,
) -> None:
    # A text/plain POST announcing 1 GiB: refused from its headers, long before the body.
    answer = _raw(
        server.port,
        b"POST /update_weight_version HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: text/plain\r\nContent-Length: 1073741824\r\n\r\n{",
    )
    head = answer.split(b"\r\n\r\n", 1)[0]
    assert _status(answer) == 415
    assert b"Connection: close" in head


# -- the command --------------------------------------------------------------------------


def test_serve_takes_its_key_from_the_environment_never_from_argv(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    env = {**os.environ, "RR_SERVE_TEST_KEY": KEY}
    child = subprocess.Popen(
        [*SERVE, "--api-key-env", "RR_SERVE_TEST_KEY", "--ready-file", str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("serving on "), line
        url = line.split()[-1]
        assert KEY.encode() not in Path(f"/proc/{child.pid}/cmdline").read_bytes()
        assert httpx.get(url + "/health", timeout=WAIT_S).status_code == 401
        authorized = {"authorization": f"Bearer {KEY}"}
        assert httpx.get(url + "/health", headers=authorized, timeout=WAIT_S).status_code == 200
    finally:
        os.killpg(child.pid, 9)
        _, err = child.communicate()
    assert KEY not in err


def test_serve_refuses_to_start_without_its_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RR_SERVE_TEST_KEY"}
    result = subprocess.run(
        [*SERVE, "--api-key-env", "RR_SERVE_TEST_KEY"],
        capture_output=True,
        text=True,
        env=env,
        timeout=WAIT_S,
        check=False,
    )
    assert result.returncode == 2
    assert "RR_SERVE_TEST_KEY is unset" in result.stderr
