"""The ready file: how a parent process learns a server's URL without parsing its output.

Written atomically once the socket listens, so a reader sees no file or a complete one:
``{"url": "http://127.0.0.1:PORT", "pid": PID}`` (with ``--uds``,
``"http+unix://localhost/PATH.sock"``: the pid is what a launcher checks the socket's
listener against).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from .._durable import atomic_write_bytes
from .._messages import split_validation_path
from ..errors import InvalidStateError

__all__ = ["ServerReady", "read_ready_file", "write_ready_file"]


class ServerReady(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A listening server: the URL to reach it at and its process id."""

    url: str
    pid: int


def write_ready_file(path: str | os.PathLike[str], url: str) -> None:
    """Atomically write this process's ready file for ``url``."""
    atomic_write_bytes(path, msgspec.json.encode(ServerReady(url=url, pid=os.getpid())))


def read_ready_file(path: str | os.PathLike[str]) -> ServerReady:
    """Read a ready file; ``InvalidStateError`` (with the file) if it is not one."""
    data = Path(path).read_bytes()
    try:
        return msgspec.json.decode(data, type=ServerReady)
    except msgspec.DecodeError as error:
        message, where = split_validation_path(str(error))
        raise InvalidStateError(
            f"not a server ready file: {message}", path=where, file=os.fspath(path)
        ) from None
