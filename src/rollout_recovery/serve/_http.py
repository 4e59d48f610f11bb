"""The HTTP/1.1 transport: a standard-library threading server in front of :class:`ServeApp`.

One thread per connection; connections are kept alive (every answer has a
``Content-Length``). Bodies are read whole, up to the size cap, before the app sees them.
Anything the stdlib itself refuses (a malformed request line, oversized headers) is
answered with vLLM's error body too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ._api_error import ApiError, error_body
from ._app import Response, ServeApp

__all__ = ["PolicyHTTPServer", "make_http_server"]

_log = logging.getLogger("rollout_recovery.serve")

# An idle keep-alive connection is closed after this many seconds (uvicorn's default is 5;
# a generation backend reuses its connections far more often than that).
KEEP_ALIVE_TIMEOUT_S = 60.0


class PolicyHTTPServer(ThreadingHTTPServer):
    """A :class:`ThreadingHTTPServer` that hands every request to one :class:`ServeApp`.

    Connection threads are daemons: an idle keep-alive connection never holds up shutdown.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        app: ServeApp,
        *,
        max_body_bytes: int,
        access_log: bool,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.access_log = access_log
        self.stopping = False
        self._lock = threading.Condition()
        self._connections: set[socket.socket] = set()
        self._in_flight = 0
        super().__init__(address, _Handler)

    # Connections are tracked so that shutdown can end idle keep-alive ones: their threads
    # would otherwise go on answering on a server that has stopped.

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that resets or drops its connection is routine, not a server error.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        _log.exception("error on the connection from %s", client_address)

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


def make_http_server(
    host: str, port: int, app: ServeApp, *, max_body_bytes: int, access_log: bool
) -> PolicyHTTPServer:
    """Bind ``host:port`` (port 0: a free one), IPv6 when ``host`` is an IPv6 address."""
    kind = _PolicyHTTPServer6 if ":" in host else PolicyHTTPServer
    return kind((host, port), app, max_body_bytes=max_body_bytes, access_log=access_log)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rollout-recovery"
    timeout = KEEP_ALIVE_TIMEOUT_S
    server: PolicyHTTPServer

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
        try:
            length = int(raw)
        except ValueError:
            length = -1
        if length < 0:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"invalid Content-Length {raw!r}", close=True)
        cap = self.server.max_body_bytes
        if length > cap:
            raise ApiError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"request body of {length} bytes is over this server's limit of {cap} bytes",
                close=True,
            )
        return length

    def _read_body(self) -> bytes:
        length = self._content_length()
        try:
            body = self.rfile.read(length) if length else b""
        except TimeoutError:
            raise ApiError(
                HTTPStatus.REQUEST_TIMEOUT,
                f"the request body did not arrive within {self.timeout:g} s",
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
                self._content_length()
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
                response = self.server.app.handle(method, path, body, self._headers())
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

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.access_log:
            sys.stderr.write(f"{self.address_string()} - {format % args}\n")
