"""A running server: the weights, the API and the HTTP transport, started and stopped whole."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import ClassVar, Self

from .._lifecycle import Resource
from .._unix_http import unix_server_url
from ..errors import InvalidOperationError
from ..policy import NumpyGRPOTrainer, PolicySnapshot
from ._app import ServeApp
from ._http import TransportStats, make_http_server
from ._ready import ServerReady, read_ready_file, write_ready_file
from ._settings import DEFAULT_MODEL_NAME, ServeSettings
from ._weights import WeightStore

__all__ = ["PolicyServer"]

# How often the accept loop looks for a shutdown request.
_POLL_INTERVAL_S = 0.05
# How long a shutdown lets requests in flight finish before it closes their connections.
SHUTDOWN_GRACE_S = 10.0


def _url_host(host: str) -> str:
    """The host part of a URL that reaches a server bound to ``host``."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class PolicyServer(Resource):
    """An OpenAI-compatible (vLLM-compatible) server of the numpy policy.

    The socket is bound when the object is built, so :attr:`url` is known at once (port 0
    picks a free port). :meth:`start` serves from a background thread, :meth:`close`
    stops: it refuses new connections, cuts the call latency of requests in flight short
    (they answer 503), waits for them, then closes every connection. ``with`` starts it on
    entry (a server is entered to serve; the socket is already open) and closes it on exit.

    ``initial_weights`` defaults to ``NumpyGRPOTrainer(seed=settings.seed).weights()``
    (version 0). ``on_admitted`` is a test seam: it is called in a generation request's
    thread once the request holds its weight snapshot, before the call latency and the
    sampling, so a test can hold a request in flight without sleeping. ``on_token`` (with
    ``settings.token_latency_s``) is called after each generated token with its position,
    so a test can pause the server at a chosen token.
    """

    #: The model name a server answers to unless its settings name another (the HTTP
    #: backend's ``[http] model`` default).
    DEFAULT_MODEL_NAME: ClassVar[str] = DEFAULT_MODEL_NAME

    def __init__(
        self,
        settings: ServeSettings | None = None,
        *,
        initial_weights: PolicySnapshot | None = None,
        on_admitted: Callable[[], None] | None = None,
        on_token: Callable[[int], None] | None = None,
    ) -> None:
        self._settings = settings if settings is not None else ServeSettings()
        snapshot = (
            initial_weights
            if initial_weights is not None
            else NumpyGRPOTrainer(seed=self._settings.seed).weights()
        )
        self._weights = WeightStore(snapshot)
        self._stopping = threading.Event()
        self._app = ServeApp(
            self._settings,
            self._weights,
            stopping=self._stopping,
            on_admitted=on_admitted,
            on_token=on_token,
        )
        self._http = make_http_server(self._settings, self._app)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._lock = threading.Lock()
        #: Whether every request in flight finished within the grace of :meth:`close`
        #: (None until closed).
        self.finished_in_grace: bool | None = None

    def __repr__(self) -> str:
        return f"PolicyServer(url={self.url!r})"

    @property
    def settings(self) -> ServeSettings:
        return self._settings

    @property
    def port(self) -> int:
        """The TCP port it listens on (0 on a Unix socket)."""
        if self._settings.uds is not None:
            return 0
        return int(self._http.server_address[1])

    @property
    def url(self) -> str:
        """``http://HOST:PORT``, the base URL (the OpenAI client takes ``url + "/v1"``);
        on a Unix socket ``http+unix://localhost/PATH.sock`` (``_unix_http``)."""
        if self._settings.uds is not None:
            return unix_server_url(self._settings.uds)
        return f"http://{_url_host(self._settings.host)}:{self.port}"

    @property
    def weights(self) -> PolicySnapshot:
        """The snapshot the next generation request will use."""
        return self._weights.current()

    def transport_stats(self) -> TransportStats:
        """Connections and body bytes held now, their peaks, and what was refused."""
        return self._http.stats()

    def wait_for_transport(
        self, predicate: Callable[[TransportStats], bool], timeout: float
    ) -> bool:
        """Wait until ``predicate(transport_stats())`` holds, ``timeout`` at most (a test
        seam: a test waits on what the server counted, never on the clock)."""
        return self._http.wait_for(predicate, timeout)

    def write_ready_file(self, path: str | os.PathLike[str]) -> None:
        """Atomically write ``{"url", "pid"}`` to ``path`` (see :func:`read_ready_file`)."""
        write_ready_file(path, self.url)

    @staticmethod
    def read_ready_file(path: str | os.PathLike[str]) -> ServerReady:
        """Read a ready file a server wrote (its ``url`` and ``pid``); ``InvalidStateError``
        (with the file) if it is not one."""
        return read_ready_file(path)

    def start(self) -> None:
        """Serve from a daemon thread until :meth:`close`."""
        with self._lock:
            if self._closed or self._thread is not None:
                raise InvalidOperationError("a PolicyServer is started once, before close")
            self._thread = threading.Thread(
                target=self._http.serve_forever,
                kwargs={"poll_interval": _POLL_INTERVAL_S},
                name=f"rollout-recovery-serve:{self.port}",
                daemon=True,
            )
            self._thread.start()

    def close(self, *, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop serving and close the socket; closing again is a no-op.

        Sets :attr:`finished_in_grace`: whether every request in flight finished within
        ``grace_s``.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        self._stopping.set()
        self._app.close()  # requests waiting out a pause answer 503
        if thread is not None:
            self._http.shutdown()
            thread.join()
        self.finished_in_grace = self._http.drain(grace_s)
        self._http.server_close()

    def __enter__(self) -> Self:
        self.start()
        return self
