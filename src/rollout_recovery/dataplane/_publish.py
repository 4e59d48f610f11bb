"""Atomic publication of a snapshot directory: fill a temporary sibling, fsync, rename."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .._durable import fsync_directory

__all__ = ["publish_directory"]


def publish_directory(directory: Path, fill: Callable[[Path], None]) -> None:
    """Create ``directory`` so that it appears complete or not at all.

    ``fill`` writes into a temporary directory next to the target (same filesystem, so the
    final rename is atomic). Every file and the directory itself are fsynced before the
    rename, and the parent after it, so a crash at any point leaves either no ``directory``
    or a complete one, plus at most a ``.{name}.tmp-*`` leftover that readers ignore.
    """
    directory = Path(directory)
    if directory.exists() or directory.is_symlink():
        raise FileExistsError(f"snapshot directory {str(directory)!r} already exists")
    parent = directory.parent
    if not parent.is_dir():
        raise FileNotFoundError(f"parent of snapshot directory {str(directory)!r} does not exist")
    temporary = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=parent))
    try:
        fill(temporary)
        for path in temporary.iterdir():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_directory(temporary)
        os.rename(temporary, directory)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    fsync_directory(parent)
