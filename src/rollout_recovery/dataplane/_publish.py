"""Atomic publication of a snapshot directory: fill a temporary sibling, fsync, rename.

A process killed while filling leaves its temporary directory behind, as large as the
store. Each temporary's name records its writer (``.{name}.tmp-{pid}@{host}-{random}``), so
a later successful publication, or a store opening, removes the ones whose writer is dead:
only this host's, only of processes that no longer exist, never one still being written.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from .._durable import fsync_directory

__all__ = ["publish_directory", "remove_stale_temporaries"]

_TEMPORARY = re.compile(r"\A\..*\.tmp-(?P<pid>[0-9]+)@(?P<host>[A-Za-z0-9._-]+)-[^/]+\Z")
# Temporaries this process is filling right now (another thread may publish concurrently).
_in_progress: set[str] = set()
_in_progress_lock = threading.Lock()


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    except OSError:
        return True  # cannot tell: keep it
    return True


def remove_stale_temporaries(parent: Path) -> list[Path]:
    """Remove the temporaries of dead writers on this host in ``parent``; returns them.

    Best effort: a directory that cannot be listed or removed is left alone.
    """
    host = _host()
    own = os.getpid()
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMPORARY.match(entry.name)
        if match is None or match["host"] != host:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
        except OSError:
            continue
        pid = int(match["pid"])
        if pid == own:
            with _in_progress_lock:
                if os.path.abspath(entry.path) in _in_progress:
                    continue
        elif _process_exists(pid):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(Path(entry.path))
    return removed


def publish_directory(directory: Path, fill: Callable[[Path], None]) -> None:
    """Create ``directory`` so that it appears complete or not at all.

    ``fill`` writes into a temporary directory next to the target (same filesystem, so the
    final rename is atomic). Every file and the directory itself are fsynced before the
    rename, and the parent after it, so a crash at any point leaves either no ``directory``
    or a complete one, plus at most a ``.{name}.tmp-*`` leftover that readers ignore and
    the next successful publication in the same parent removes.
    """
    directory = Path(directory)
    if directory.exists() or directory.is_symlink():
        raise FileExistsError(f"snapshot directory {str(directory)!r} already exists")
    parent = directory.parent
    if not parent.is_dir():
        raise FileNotFoundError(f"parent of snapshot directory {str(directory)!r} does not exist")
    prefix = f".{directory.name}.tmp-{os.getpid()}@{_host()}-"
    with _in_progress_lock:
        temporary = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        _in_progress.add(os.path.abspath(temporary))
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
    finally:
        with _in_progress_lock:
            _in_progress.discard(os.path.abspath(temporary))
    fsync_directory(parent)
    remove_stale_temporaries(parent)
