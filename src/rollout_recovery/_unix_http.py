"""Servers on Unix sockets: their URLs, a transport that reaches them, and who listens.

A server the job launches listens on a Unix socket in a directory only this user can
enter (0700, made by the job), never on a loopback port. A port is anyone's to bind
first: the job used to pick a free one, close it and start vLLM on it, so another local
user who bound it in between answered ``/health``, was taken as the server (the job's
API key, its weight pushes, every completion), while the real server died on "address
in use". A socket in a private directory can be bound only by this user's processes and
reached by nobody else's, and :func:`listener_pid` names the process that listens on it
(``SO_PEERCRED``), so the job checks it is one it launched.

Such a server's URL is ``http+unix://localhost`` followed by the socket's absolute path,
whose name ends in ``.sock``; what a client appends (``/health``) follows it:
``http+unix://localhost/tmp/rollout-recovery-x/vllm-0.sock/health``. The URL is all
another process needs (a Ray worker on this machine builds its backend from it), and
:class:`ServerTransport` sends each request to the socket its URL names (``http`` and
``https`` URLs go out as ever).
"""

from __future__ import annotations

import os
import socket
import struct
import tempfile
from pathlib import Path
from urllib.parse import quote

import httpx

from ._lifecycle import AsyncResource
from ._private_dir import private_dir_problem
from .errors import InvalidArgumentError, InvalidStateError

__all__ = [
    "UNIX_SCHEME",
    "ServerTransport",
    "listener_pid",
    "private_socket_dir",
    "require_private_dir",
    "unix_server_url",
]

UNIX_SCHEME = "http+unix"
_SUFFIX = ".sock"
# Linux's sun_path holds 108 bytes, the terminating NUL included.
_MAX_SOCKET_PATH = 107


def unix_server_url(socket_path: str | os.PathLike[str]) -> str:
    """The URL of the server listening on ``socket_path`` (absolute, named ``*.sock``)."""
    path = os.fspath(socket_path)
    if not os.path.isabs(path) or not path.endswith(_SUFFIX):
        raise InvalidArgumentError(
            f"a server socket is an absolute path ending in {_SUFFIX}: {path!r}"
        )
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise InvalidArgumentError(
            f"a Unix socket path holds at most {_MAX_SOCKET_PATH} bytes: {path!r} (set "
            "TMPDIR to a shorter directory)"
        )
    return f"{UNIX_SCHEME}://localhost{quote(path)}"


def _split(url: httpx.URL) -> tuple[str, str]:
    """(socket path, the request's own path) of a ``http+unix`` URL."""
    path = url.path
    cut = path.find(_SUFFIX + "/")
    if cut < 0:
        if not path.endswith(_SUFFIX):
            raise httpx.UnsupportedProtocol(f"{url} names no socket (a path ending in {_SUFFIX})")
        return path, "/"
    end = cut + len(_SUFFIX)
    return path[:end], path[end:]


class ServerTransport(httpx.AsyncBaseTransport, AsyncResource):
    """``http``/``https`` as httpx sends them; ``http+unix`` to the socket the URL names,
    one connection pool per socket (``Host: localhost``). Closed with its client."""

    def __init__(self) -> None:
        self._network = httpx.AsyncHTTPTransport()
        self._sockets: dict[str, httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != UNIX_SCHEME:
            return await self._network.handle_async_request(request)
        path, target = _split(request.url)
        transport = self._sockets.get(path)
        if transport is None:
            transport = self._sockets[path] = httpx.AsyncHTTPTransport(uds=path)
        local = httpx.URL(scheme="http", host="localhost", path=target, query=request.url.query)
        forwarded = httpx.Request(
            request.method,
            local,
            headers=request.headers,
            stream=request.stream,
            extensions=request.extensions,
        )
        return await transport.handle_async_request(forwarded)

    async def aclose(self) -> None:
        """Close every connection pool; closing again is a no-op."""
        await self._network.aclose()
        for transport in self._sockets.values():
            await transport.aclose()
        self._sockets.clear()


def private_socket_dir(prefix: str) -> Path:
    """A new directory for server sockets that only this user can enter (0700), in the
    temporary directory (short, for the 107 bytes a socket path may take)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


def require_private_dir(
    directory: Path, why: str = "a socket in it may not be this job's"
) -> None:
    """Refuse (``InvalidStateError``, saying ``why``) a socket directory that is a
    symlink, is not this user's, or that another user may enter or write to: a socket in
    it could then be another user's (what a controller that adopts running servers checks
    first)."""
    problem = private_dir_problem(directory)
    if problem is not None:
        raise InvalidStateError(f"{problem}: {why}", file=str(directory))


def listener_pid(socket_path: str | os.PathLike[str]) -> int | None:
    """The pid of the process listening on ``socket_path`` (its ``SO_PEERCRED``), or None
    where the system does not say (not Linux). ``OSError`` when nothing listens there."""
    option = getattr(socket, "SO_PEERCRED", None)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(5.0)
        probe.connect(os.fspath(socket_path))
        if option is None:
            return None
        pid, _uid, _gid = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, option, 12))
    return int(pid)
