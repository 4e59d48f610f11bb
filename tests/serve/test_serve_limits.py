"""What a client can make a server hold: connections (threads), body bytes, time.

Issue 15 item 20: 12 pending 60 MiB bodies took a server from 57 MB to 778 MB (the body cap
was per request); 300 idle connections made 303 threads. Measured here with real sockets
against an in-process server, scaled down: its threads, the body bytes it admitted (its own
counts, which the tests wait on instead of sleeping), and what each socket received.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
from collections.abc import Iterator

from serve_support import WAIT_S

from rollout_recovery.policy._tasks import BOS, FILLER_BASE, THINK, digit_token
from rollout_recovery.serve import PolicyServer, ServeSettings

PROMPT = [BOS, FILLER_BASE, digit_token(4), FILLER_BASE + 3, THINK]
MIB = 1024 * 1024
# A context long enough that a completion body of 1 MiB is within its route's limit
# (``serve._limits``: a generation request takes about 32 bytes per token of context).
LONG_CONTEXT = 32_768


@contextlib.contextmanager
def _sockets(port: int, count: int) -> Iterator[list[socket.socket]]:
    opened = []
    try:
        for _ in range(count):
            opened.append(socket.create_connection(("127.0.0.1", port), timeout=WAIT_S))
        yield opened
    finally:
        for sock in opened:
            sock.close()


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _finished(socks: list[socket.socket], count: int) -> dict[socket.socket, bytes]:
    """What the first ``count`` sockets the server answers and closes received (waits)."""
    done: dict[socket.socket, bytes] = {}
    buffers: dict[socket.socket, bytearray] = {sock: bytearray() for sock in socks}
    while len(done) < count:
        readable, _, _ = select.select([s for s in socks if s not in done], [], [], WAIT_S)
        assert readable, f"only {len(done)} of {count} sockets were answered"
        for sock in readable:
            chunk = sock.recv(65536)
            if chunk:
                buffers[sock] += chunk
            else:
                done[sock] = bytes(buffers[sock])
    return done


def _silent(socks: list[socket.socket]) -> list[socket.socket]:
    """The sockets with nothing to read right now (no answer, no close)."""
    readable, _, _ = select.select(socks, [], [], 0)
    return [sock for sock in socks if sock not in readable]


def _completion_request(length: int, *, expect: bool = False) -> tuple[bytes, bytes]:
    """Headers and a JSON body of exactly ``length`` bytes for /v1/completions."""
    skeleton = {"prompt": PROMPT, "max_tokens": 1, "padding": ""}
    padding = length - len(json.dumps(skeleton).encode())
    body = json.dumps({**skeleton, "padding": "x" * padding}).encode()
    assert len(body) == length
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n" + ("Expect: 100-continue\r\n" if expect else "") + "\r\n"
    ).encode()
    return head, body


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


# -- connections --------------------------------------------------------------------------


def test_connections_past_the_limit_are_answered_503_without_a_thread() -> None:
    settings = ServeSettings(max_connections=8, keep_alive_timeout_s=WAIT_S)
    with PolicyServer(settings) as server:
        threads_before = threading.active_count()
        with _sockets(server.port, 60) as socks:
            assert server.wait_for_transport(
                lambda s: s.connections == 8 and s.refused_connections == 52, WAIT_S
            ), server.transport_stats()
            # One thread per admitted connection, none for the 52 turned away.
            assert threading.active_count() - threads_before <= 8
            answers = _finished(socks, 52)
            for answer in answers.values():
                assert _status(answer) == 503, answer
                assert b"connections open, its limit" in answer
            idle = _silent(socks)
            assert len(idle) == 8
            # An admitted connection is served as ever.
            idle[0].sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert idle[0].recv(65536).startswith(b"HTTP/1.1 200 ")
        # Closed by the client: their places are free again.
        assert server.wait_for_transport(lambda s: s.connections == 0, WAIT_S)
        with _sockets(server.port, 8) as socks:
            for sock in socks:
                sock.sendall(
                    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                )
                assert _status(_read_all(sock)) == 200
        assert server.transport_stats().peak_connections == 8


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout() -> None:
    settings = ServeSettings(keep_alive_timeout_s=0.2)
    with PolicyServer(settings) as server, _sockets(server.port, 2) as (never, once):
        once.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert once.recv(65536).startswith(b"HTTP/1.1 200 ")
        # Neither sends anything more: the server ends both (EOF), with no answer.
        assert _read_all(never) == b""
        assert _read_all(once) == b""
        assert server.wait_for_transport(lambda s: s.connections == 0, WAIT_S)


# -- body bytes ---------------------------------------------------------------------------


def test_bodies_past_the_in_flight_budget_are_refused_before_they_are_read() -> None:
    # The 12 pending bodies near the cap, scaled from 60 MiB to 1 MiB.
    settings = ServeSettings(
        max_body_bytes=MIB, max_inflight_body_bytes=2 * MIB, max_model_len=LONG_CONTEXT
    )
    head, body = _completion_request(MIB - 1)
    with PolicyServer(settings) as server, _sockets(server.port, 12) as socks:
        for sock in socks:
            sock.sendall(head + body[: 64 * 1024])  # a body that has begun, and stalls
        assert server.wait_for_transport(lambda s: s.refused_bodies == 10, WAIT_S), (
            server.transport_stats()
        )
        refused = _finished(socks, 10)
        for answer in refused.values():
            assert _status(answer) == 503, answer
            assert b"Retry-After: 1" in answer
        stats = server.transport_stats()
        assert stats.body_bytes == stats.peak_body_bytes == 2 * (MIB - 1)
        # The two admitted ones finish their bodies and are answered; the bytes go back.
        admitted = _silent(socks)
        assert len(admitted) == 2
        for sock in admitted:
            sock.sendall(body[64 * 1024 :])
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert server.wait_for_transport(lambda s: s.body_bytes == 0, WAIT_S)
        assert server.transport_stats().peak_body_bytes == 2 * (MIB - 1)


def test_an_expect_continue_body_is_admitted_or_refused_before_it_is_sent() -> None:
    settings = ServeSettings(
        max_body_bytes=MIB, max_inflight_body_bytes=MIB + MIB // 2, max_model_len=LONG_CONTEXT
    )
    head, body = _completion_request(MIB, expect=True)
    with PolicyServer(settings) as server, _sockets(server.port, 3) as (first, second, third):
        first.sendall(head)
        assert first.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        second.sendall(head)  # would pass the budget: refused, its body never asked for
        answer = _read_all(second)
        assert _status(answer) == 503 and b"100 Continue" not in answer
        first.sendall(body)
        assert first.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert server.wait_for_transport(lambda s: s.body_bytes == 0, WAIT_S)
        third.sendall(head)  # the budget is free again
        assert third.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
    stats = server.transport_stats()
    assert (stats.peak_body_bytes, stats.refused_bodies) == (MIB, 1)


def test_a_refused_client_never_counts_against_the_budget() -> None:
    settings = ServeSettings(
        api_key="k", max_body_bytes=MIB, max_inflight_body_bytes=MIB, max_model_len=LONG_CONTEXT
    )
    head, _ = _completion_request(MIB)
    with PolicyServer(settings) as server, _sockets(server.port, 4) as socks:
        for sock in socks:  # no key: 401 from the headers, the body never read
            sock.sendall(head)
        for answer in _finished(socks, 4).values():
            assert _status(answer) == 401
        assert server.wait_for_transport(lambda s: s.connections == 0, WAIT_S)
    stats = server.transport_stats()
    assert (stats.body_bytes, stats.peak_body_bytes, stats.refused_bodies) == (0, 0, 0)


# -- time ---------------------------------------------------------------------------------


def _drip(sock: socket.socket, data: bytes, pause_s: float) -> tuple[int, bytes]:
    """Send ``data`` a byte at a time, pausing by waiting for the server's answer; stop at
    its first answer or close. Returns (bytes sent, what came back)."""
    sock.settimeout(pause_s)
    for sent in range(len(data)):
        sock.sendall(data[sent : sent + 1])
        try:
            reply = sock.recv(65536)
        except TimeoutError:
            continue
        sock.settimeout(WAIT_S)
        return sent + 1, reply + (_read_all(sock) if reply else b"")
    return len(data), b""


def test_a_body_dripped_a_byte_at_a_time_is_cut_off_at_the_read_timeout() -> None:
    settings = ServeSettings(read_timeout_s=0.5, keep_alive_timeout_s=WAIT_S)
    head, body = _completion_request(400)
    with PolicyServer(settings) as server, _sockets(server.port, 1) as (sock,):
        sock.sendall(head)
        sent, answer = _drip(sock, body, pause_s=0.05)
    assert sent < len(body), "the whole dripped body was read"
    assert _status(answer) == 408, answer
    assert b"did not arrive within 0.5 s" in answer
    assert server.transport_stats().body_bytes == 0


def test_headers_dripped_a_byte_at_a_time_are_cut_off_at_the_read_timeout() -> None:
    settings = ServeSettings(read_timeout_s=0.5, keep_alive_timeout_s=WAIT_S)
    headers = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 400 + b"\r\n\r\n"
    with PolicyServer(settings) as server, _sockets(server.port, 1) as (sock,):
        sent, answer = _drip(sock, headers, pause_s=0.05)
        assert server.wait_for_transport(lambda s: s.connections == 0, WAIT_S)
    assert sent < len(headers), "the whole dripped request was read"
    assert answer == b""  # closed, no answer: the request never ended


def test_the_limits_are_command_line_flags() -> None:
    from click.testing import CliRunner

    from rollout_recovery.cli._serve import serve

    help_text = CliRunner().invoke(serve, ["--help"]).output
    for flag in (
        "--max-body-bytes",
        "--max-inflight-body-bytes",
        "--max-connections",
        "--keep-alive-timeout-s",
        "--read-timeout-s",
        "--write-timeout-s",
    ):
        assert flag in help_text
    refused = CliRunner().invoke(
        serve, ["--max-body-bytes", "10", "--max-inflight-body-bytes", "9"]
    )
    assert refused.exit_code == 2
    assert "max_inflight_body_bytes (9) must be at least max_body_bytes (10)" in refused.output
