"""The HTTP/1.1 transport: a standard-library threading server in front of :class:`ServeApp`.

One thread per connection; connections are kept alive (every answer has a
``Content-Length``). Bodies are read whole, up to the size cap, before the app sees them.
Anything the stdlib itself refuses (a malformed request line, oversized headers) is
answered with vLLM's error body too.

What a client can make the server hold is bounded (``ServeSettings``):

- connections: at most ``max_connections`` open (so at most that many threads); one more
  is answered 503 from the accept loop and closed, without a thread;
- body bytes: a body is admitted only once the app has looked at the headers (so a
  refused client never sends one), only if it is within what its route can use
  (``ServeApp.body_limit``: bytes here, JSON values before the app decodes it; a 413)
  and only if the bodies being read or handled at once stay within
  ``max_inflight_body_bytes``; otherwise a 503, before any of it is read;
- time: every read of a connection runs against a deadline, not a per-read timeout, so a
  client that drips one byte at a time gains nothing: ``keep_alive_timeout_s`` for the
  first byte of a request, then ``read_timeout_s`` for the whole request; an answer must
  be taken within ``write_timeout_s``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from ._api_error import ApiError, error_body
from ._app import Response, ServeApp
from ._settings import ServeSettings

__all__ = ["PolicyHTTPServer", "TransportStats", "make_http_server"]

_log = logging.getLogger("rollout_recovery.serve")

# Content-Length digits read at most: 10**18 bytes is past any cap.
_LENGTH_DIGITS = 18
# How much of a turned-away connection's request is read (without waiting) before it is
# closed: unread data makes the close a reset, which can destroy the 503 in flight.
_TURN_AWAY_DRAIN_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class TransportStats:
    """What the transport holds now, its peaks, and what it refused, since it started."""

    connections: int = 0
    peak_connections: int = 0
    refused_connections: int = 0
    body_bytes: int = 0
    peak_body_bytes: int = 0
    refused_bodies: int = 0


def _busy_answer(message: str) -> bytes:
    body = error_body(HTTPStatus.SERVICE_UNAVAILABLE, message)
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class PolicyHTTPServer(ThreadingHTTPServer):
    """A :class:`ThreadingHTTPServer` that hands every request to one :class:`ServeApp`.

    Connection threads are daemons: an idle keep-alive connection never holds up shutdown.
    """

    daemon_threads = True
    allow_reuse_address = True
    # The listen backlog (the stdlib's is 5): a burst of connects past it has its SYNs
    # dropped and retried a second later, though the accept loop takes them at once.
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int] | str, app: ServeApp, settings: ServeSettings
    ) -> None:
        self.app = app
        self.settings = settings
        self.access_log = settings.access_log
        self.stopping = False
        self._lock = threading.Condition()
        self._connections: set[socket.socket] = set()
        self._in_flight = 0
        self._stats = TransportStats()
        self._full_answer = _busy_answer(
            f"this server has {settings.max_connections} connections open, its limit; retry later"
        )
        # A Unix socket's address is its path (typeshed types TCP addresses only).
        super().__init__(cast("tuple[str, int]", address), _Handler)

    def _count(self, **changes: int) -> None:
        """Apply counter changes (under the lock) and wake whoever waits on them."""
        stats = self._stats
        values = {name: getattr(stats, name) + delta for name, delta in changes.items()}
        updated = dataclasses.replace(stats, **values)
        self._stats = dataclasses.replace(
            updated,
            peak_connections=max(updated.peak_connections, updated.connections),
            peak_body_bytes=max(updated.peak_body_bytes, updated.body_bytes),
        )
        self._lock.notify_all()

    def stats(self) -> TransportStats:
        with self._lock:
            return self._stats

    def wait_for(self, predicate: Callable[[TransportStats], bool], timeout: float) -> bool:
        """Wait until ``predicate(stats)`` holds (``timeout`` at most); whether it does."""
        with self._lock:
            return self._lock.wait_for(lambda: predicate(self._stats), timeout)

    # Connections are tracked so that shutdown can end idle keep-alive ones: their threads
    # would otherwise go on answering on a server that has stopped.

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            admitted = len(self._connections) < self.settings.max_connections
            if admitted:
                self._connections.add(request)
                self._count(connections=1)
        if admitted:
            super().process_request(request, client_address)
            return
        self._turn_away(request)
        with self._lock:
            self._count(refused_connections=1)

    def _turn_away(self, request: socket.socket) -> None:
        """Answer 503 and close, in the accept loop: a connection over the limit gets no
        thread, and nothing here can block (a fresh socket's send buffer takes the answer)."""
        with contextlib.suppress(OSError):
            request.setblocking(False)
            request.send(self._full_answer)
            with contextlib.suppress(BlockingIOError):
                request.recv(_TURN_AWAY_DRAIN_BYTES)
        self.shutdown_request(request)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            if request in self._connections:
                self._connections.discard(request)
                self._count(connections=-1)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that resets or drops its connection is routine, not a server error.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        _log.exception("error on the connection from %s", client_address)

    def reserve_body(self, length: int) -> bool:
        """Count ``length`` bytes against the in-flight budget; False when they do not fit."""
        with self._lock:
            if self._stats.body_bytes + length > self.settings.max_inflight_body_bytes:
                self._count(refused_bodies=1)
                return False
            self._count(body_bytes=length)
            return True

    def release_body(self, length: int) -> None:
        with self._lock:
            self._count(body_bytes=-length)

    def request_started(self) -> None:
        with self._lock:
            self._in_flight += 1

    def request_finished(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._lock.notify_all()

    def drain(self, timeout: float) -> bool:
        """Stop, let requests in flight finish (``timeout`` at most), end every connection.

        Returns whether every request in flight finished in time. Call after
        :meth:`shutdown` (no new connection is accepted then).
        """
        with self._lock:
            self.stopping = True
            finished = self._lock.wait_for(lambda: self._in_flight == 0, timeout)
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # already closed by its own thread
                connection.shutdown(socket.SHUT_RDWR)
        return finished


class _PolicyHTTPServer6(PolicyHTTPServer):
    address_family = socket.AF_INET6


class _PolicyUnixHTTPServer(PolicyHTTPServer):
    """On a Unix socket. A socket file nobody listens on (a killed server's) is replaced;
    anything else there is left alone (the bind then fails: address in use). Closing
    removes the socket only while it is this server's (a server restarted on the same
    path may have replaced it)."""

    address_family = socket.AF_UNIX
    _inode = 0

    def server_bind(self) -> None:
        path = str(self.server_address)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(path).st_mode) and not _listened_on(path):
                os.unlink(path)
        self.socket.bind(path)
        os.chmod(path, 0o600)
        self._inode = os.lstat(path).st_ino
        self.server_name, self.server_port = "localhost", 0

    def server_close(self) -> None:
        super().server_close()
        path = str(self.server_address)
        with contextlib.suppress(OSError):
            if os.lstat(path).st_ino == self._inode:
                os.unlink(path)


def _listened_on(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def make_http_server(settings: ServeSettings, app: ServeApp) -> PolicyHTTPServer:
    """Bind ``settings.uds``, else ``settings.host:port`` (port 0: a free one), IPv6 for
    an IPv6 address."""
    if settings.uds is not None:
        return _PolicyUnixHTTPServer(settings.uds, app, settings)
    kind = _PolicyHTTPServer6 if ":" in settings.host else PolicyHTTPServer
    return kind((settings.host, settings.port), app, settings)


class _DeadlineReader(io.RawIOBase):
    """A connection's reads, each bounded by what is left until one deadline.

    A per-read timeout restarts with every byte; this one does not. ``on_data`` is called
    once, at the first data after it is set (a request's first byte ends the idle wait).
    """

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self.deadline = 0.0
        self.on_data: Callable[[], None] | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the connection's read deadline passed")
        self._sock.settimeout(remaining)
        count = self._sock.recv_into(buffer)
        if count and self.on_data is not None:
            started, self.on_data = self.on_data, None
            started()
        return count


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rollout-recovery"
    server: PolicyHTTPServer
    _reader: _DeadlineReader
    _reserved = 0  # body bytes of the current request counted against the budget

    # -- the connection ---------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the stdlib's reader: ours reads against deadlines
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        settings = self.server.settings
        reader = self._reader
        reader.deadline = time.monotonic() + settings.keep_alive_timeout_s

        def started() -> None:
            reader.deadline = time.monotonic() + settings.read_timeout_s

        reader.on_data = started
        try:
            super().handle_one_request()
        finally:
            reader.on_data = None
            if self._reserved:
                self.server.release_body(self._reserved)
                self._reserved = 0

    # -- methods ----------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")

    # -- the request ------------------------------------------------------------------------

    def _content_length(self) -> int:
        """The body's length; refuses chunked, unparsable and oversized bodies."""
        if self.headers.get("Transfer-Encoding"):
            raise ApiError(
                HTTPStatus.LENGTH_REQUIRED,
                "request bodies must have a Content-Length (chunked bodies are not supported)",
                close=True,
            )
        raw = self.headers.get("Content-Length")
        if raw is None:
            return 0
        # ASCII digits only: int() also takes "1_000", "+5" and other scripts' digits,
        # which a proxy in front would read otherwise (or refuse).
        # More than 18 digits is past any cap (and int() of 5000 of them raises).
        digits = raw.strip()
        length = -1
        if digits.isascii() and digits.isdigit():
            length = int(digits) if len(digits) <= _LENGTH_DIGITS else 10**_LENGTH_DIGITS
        if length < 0:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"invalid Content-Length {raw!r}", close=True)
        path = self.path.split("?", 1)[0]
        cap = self.server.app.body_limit(path).max_bytes
        if length > cap:
            raise ApiError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"request body of {length} bytes is over this server's limit of {cap} bytes "
                f"for {path}",
                close=True,
            )
        return length

    def _admit_body(self) -> int:
        """The body's length, its bytes counted against the server's in-flight budget."""
        length = self._content_length()
        if length and not self._reserved:
            if not self.server.reserve_body(length):
                budget = self.server.settings.max_inflight_body_bytes
                raise ApiError(
                    HTTPStatus.SERVICE_UNAVAILABLE,
                    f"this server is already taking in request bodies up to its limit of "
                    f"{budget} bytes at once; retry later",
                    headers=(("Retry-After", "1"),),
                    close=True,
                )
            self._reserved = length
        return length

    def _read_body(self) -> bytes:
        length = self._admit_body()
        try:
            body = self.rfile.read(length) if length else b""
        except TimeoutError:
            raise ApiError(
                HTTPStatus.REQUEST_TIMEOUT,
                "the request did not arrive within "
                f"{self.server.settings.read_timeout_s:g} s of its first byte",
                close=True,
            ) from None
        if len(body) != length:
            raise ApiError(
                HTTPStatus.BAD_REQUEST,
                f"request body ended after {len(body)} of {length} bytes",
                close=True,
            )
        return body

    def _headers(self) -> list[tuple[str, str]]:
        return self.headers.items()

    def _body_announced(self) -> bool:
        length = self.headers.get("Content-Length")
        return bool(self.headers.get("Transfer-Encoding")) or (
            length is not None and length.strip() != "0"
        )

    def _refusal(self, method: str) -> Response | None:
        """The app's refusal from the headers alone (the body is then never read)."""
        path = self.path.split("?", 1)[0]
        refusal = self.server.app.refusal(method, path, self._headers())
        if refusal is not None and self._body_announced():
            # The unread body is still on the stream: nothing more can be read from it.
            refusal = dataclasses.replace(refusal, close=True)
        return refusal

    def handle_expect_100(self) -> bool:
        # Refuse before the client sends its body: a client that may not ask, or one whose
        # body is over the cap.
        refusal = self._refusal(self.command)
        if refusal is None:
            try:
                self._admit_body()
            except ApiError as error:
                refusal = Response(error.status, error.body(), error.headers, close=True)
        if refusal is not None:
            self._write(dataclasses.replace(refusal, close=True), head=self.command == "HEAD")
            return False
        return super().handle_expect_100()

    def _dispatch(self, method: str) -> None:
        self.server.request_started()
        try:
            self._answer(method)
        finally:
            self.server.request_finished()

    def _answer(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        try:
            refusal = self._refusal(method)
            if refusal is not None:
                response = refusal
            else:
                try:
                    body = self._read_body()
                except ConnectionError:  # the client went away while sending
                    self.close_connection = True
                    return
                query = self.path.partition("?")[2]
                response = self.server.app.handle(method, path, body, self._headers(), query)
        except ApiError as error:
            response = Response(error.status, error.body(), error.headers, error.close)
        except Exception:  # an answer must go out whatever broke
            _log.exception("internal error answering %s %s", method, path)
            response = Response(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                error_body(HTTPStatus.INTERNAL_SERVER_ERROR, "internal server error"),
            )
        try:
            self._write(response, head=method == "HEAD")
        except ConnectionError:  # the client went away: nobody to answer
            self.close_connection = True

    # -- the answer -------------------------------------------------------------------------

    def _write(self, response: Response, *, head: bool = False) -> None:
        # sendall's timeout bounds the whole answer: a client that stops reading is cut off.
        self.connection.settimeout(self.server.settings.write_timeout_s)
        close = response.close or self.close_connection or self.server.stopping
        self.send_response(response.status)
        if response.content_type is not None:
            self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers:
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        if not head:
            self.wfile.write(response.body)
        self.wfile.flush()
        if close:
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Called by the stdlib for requests it cannot parse: answer in vLLM's shape, and
        # close, since the stream position is unknown. A line it could not parse leaves the
        # version at HTTP/0.9, which would suppress the status line.
        if self.request_version == "HTTP/0.9":
            self.request_version = self.protocol_version
        try:
            text = message or HTTPStatus(code).phrase
        except ValueError:
            text = f"HTTP error {code}"
        self.close_connection = True
        self._write(Response(code, error_body(code, text), close=True))

    def address_string(self) -> str:
        # A Unix socket's client has no address.
        return str(self.client_address[0]) if self.client_address else "unix"

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.access_log:
            sys.stderr.write(f"{self.address_string()} - {format % args}\n")
