"""Durable files: crash-safe replacement of one file, and durable directory entries.

A reader must see either the old file or the complete new one, whatever instant the
process or the machine dies at. The bytes go to a temporary file in the target's own
directory (``os.replace`` is atomic only within one file system), are fsynced before the
rename (else the rename can reach the disk before the data and leave an empty or torn file
under the final name after a power loss), and the directory is fsynced after it (else the
rename itself can be lost).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "fsync_directory"]


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make the directory's entries (a rename, a new file) durable."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    On any failure (including ``KeyboardInterrupt``) the temporary file is removed and the
    previous content of ``path``, if any, is untouched.
    """
    target = Path(path)
    # A leading dot keeps the temporary out of casual listings and out of any glob for
    # sidecar names; mkstemp's random suffix keeps concurrent writers apart.
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
    )
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    fsync_directory(target.parent)
