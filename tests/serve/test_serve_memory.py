"""What a request can cost ``serve`` in memory: its route's bytes and JSON values, decoded.

Issue 24 item 16: the in-flight budget counted a body's bytes, not what decoding made of
them; two 32 MiB bodies (half the budget) took a server from 59 MB to 0.9-1.7 GB. Now a
body longer than its route can use is refused before it is read, and one holding more JSON
values than its route can use before it is decoded. Measured with ``tracemalloc`` (every
thread's Python allocations) around a real server and around the app alone.
"""

from __future__ import annotations

import json
import socket
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from serve_process import serve_process

from rollout_recovery.policy import NumpyGRPOTrainer
from rollout_recovery.serve import ServeSettings
from rollout_recovery.serve._app import ServeApp
from rollout_recovery.serve._limits import body_limit, json_values_at_most
from rollout_recovery.serve._weights import WeightStore

MIB = 2**20
HEADERS = [("Host", "127.0.0.1:8000"), ("Content-Type", "application/json")]
ROUTES = ["/v1/completions", "/inference/v1/generate", "/update_weights", "/pause"]


def _peak(action: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        result = action()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory so far (``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _post_expecting_continue(url: str, path: str, body: bytes) -> bytes:
    """POST ``body`` as a client that asks first (``Expect: 100-continue``); the body is
    sent only if the server asks for it. The server's final answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head)
        answer = sock.recv(65536)
        if answer.startswith(b"HTTP/1.1 100 "):
            sock.sendall(body)
            answer = answer.split(b"\r\n\r\n", 1)[1]
        chunks = [answer]
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_the_issues_bodies_cost_a_real_server_nothing(tmp_path: Path) -> None:
    """Two bodies the default budget admitted at once (8 MiB of ``[]`` each, a quarter of
    the issue's 32 MiB) once took the server's peak memory up by about 170 MiB each;
    now each is a 413 before its body is sent, and the peak does not move."""
    body = b'{"prompt": [' + b",".join([b"[]"] * (8 * MIB // 3)) + b"]}"
    with serve_process(tmp_path / "serve.log") as (url, pid):
        before = _peak_rss(pid)
        answers = [_post_expecting_continue(url, "/v1/completions", body) for _ in range(2)]
        grown = _peak_rss(pid) - before
    assert [answer.split(b" ", 2)[1] for answer in answers] == [b"413", b"413"], answers
    assert grown < 16 * MIB, f"peak memory grew {grown / MIB:.0f} MiB"


def _app(**settings: Any) -> ServeApp:
    return ServeApp(
        ServeSettings(**settings),
        WeightStore(NumpyGRPOTrainer(seed=0).weights()),
        stopping=threading.Event(),
    )


def _hostile_bodies(path: str, max_bytes: int, max_values: int) -> dict[str, bytes]:
    """Bodies at the route's limits shaped to cost the most once decoded (each item of a
    list counts as its opening bracket and its comma)."""
    room = max_values - 2

    def fill(item: bytes, count: int) -> bytes:
        return b'{"x": [' + b",".join([item] * count) + b"]}"

    shapes = {
        "lists": fill(b"[]", room // 2),
        "objects": fill(b'{"":0}', room // 2),
        "floats": fill(b"1e1", room),
        "ints": fill(b"1000000", room),
        "wide-string": b'{"x": "\xf0\x9d\x9f\x98' + b"a" * (max_bytes - 32) + b'"}',
        "long-keys": b'{"x": {' + b",".join(b'"%d":0' % i for i in range(room // 2)) + b"}}",
    }
    return {name: body for name, body in shapes.items() if len(body) <= max_bytes}


@pytest.mark.parametrize("path", ROUTES)
def test_the_costliest_body_a_route_takes_is_bounded_once_decoded(path: str) -> None:
    """Each shape at the most bytes and values the route takes: what handling it
    allocates stays within 4 bytes a body byte and 256 a JSON value (``_limits``)."""
    app = _app()
    limit = app.body_limit(path)
    bound = 4 * limit.max_bytes + 256 * limit.max_values
    assert bound < 3 * MIB  # a few MiB a request, whatever the default max_body_bytes
    for name, body in _hostile_bodies(path, limit.max_bytes, limit.max_values).items():
        assert json_values_at_most(body) <= limit.max_values, name
        response, peak = _peak(lambda body=body: app.handle("POST", path, body, HEADERS))
        assert response.status in (200, 400, 404, 409), (name, response.body[:200])
        assert peak < bound, f"{path} {name}: {peak} bytes traced, bound {bound}"


@pytest.mark.parametrize("path", ROUTES)
def test_a_body_of_more_values_than_the_route_takes_is_413_before_decoding(path: str) -> None:
    app = _app()
    limit = app.body_limit(path)
    body = b"[" + b",".join([b"0"] * limit.max_values) + b"]"
    assert len(body) <= limit.max_bytes
    response = app.handle("POST", path, body, HEADERS)
    assert response.status == 413
    assert b"JSON values" in response.body


def test_a_route_takes_what_its_requests_need_within_max_body_bytes() -> None:
    settings = ServeSettings(max_model_len=512)
    generation = body_limit(settings, "/v1/completions")
    assert generation == body_limit(settings, "/inference/v1/generate")
    # A prompt of the whole context, as a client sends it, fits.
    prompt = {"prompt": [2**31 - 1] * 512, "max_tokens": 1, "model": "m" * 200}
    encoded = json.dumps(prompt, indent=4).encode()
    assert len(encoded) <= generation.max_bytes
    assert json_values_at_most(encoded) <= generation.max_values
    # A longer context takes more; max_body_bytes caps every route.
    longer = body_limit(ServeSettings(max_model_len=4096), "/v1/completions")
    assert longer.max_bytes > generation.max_bytes and longer.max_values > generation.max_values
    small = ServeSettings(max_body_bytes=1000)
    assert {body_limit(small, path).max_bytes for path in ROUTES} == {1000}


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=40,
)


def _values(value: object) -> int:
    if isinstance(value, list):
        return 1 + sum(_values(item) for item in value)
    if isinstance(value, dict):
        return 1 + sum(_values(item) for item in value.values())
    return 1


@given(_JSON)
def test_the_count_of_json_values_is_never_too_low(value: object) -> None:
    encoded = msgspec.json.encode(value)
    assert json_values_at_most(encoded) >= _values(value)
    assert json_values_at_most(json.dumps(value, indent=2).encode()) >= _values(value)
