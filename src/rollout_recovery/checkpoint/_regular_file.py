"""Open a file for reading only if it is a regular file (never a FIFO or a device)."""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

from ..errors import NotARegularFileError

__all__ = ["open_regular_file"]

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def open_regular_file(path: str | os.PathLike[str]) -> BinaryIO:
    """``open(path, "rb")`` for a regular file; :class:`NotARegularFileError` otherwise.

    The file is opened non-blocking and checked with ``fstat`` on the open descriptor, so
    neither opening a FIFO (which would wait for a writer) nor a swap of the path between
    the check and the open can make the reader block. Non-blocking mode does not change
    reads of a regular file.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise NotARegularFileError(
                errno.EINVAL, f"not a regular file ({kind}); refusing to read it", os.fspath(path)
            )
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise
