"""Durable files: crash-safe replacement of one file, new files, directories published whole.

A reader must see either the old file or the complete new one, whatever instant the
process or the machine dies at. The bytes go to a temporary file in the target's own
directory (``os.replace`` is atomic only within one file system), are fsynced before the
rename (else the rename can reach the disk before the data and leave an empty or torn file
under the final name after a power loss), and the directory is fsynced after it (else the
rename itself can be lost).

A directory is published the same way (``publish_directory``): filled in a temporary
sibling, every file and the directory fsynced, renamed, the parent fsynced. A process
killed while filling leaves its temporary directory behind, as large as the store. Each
temporary's name records its writer (``.{name}.tmp-{pid}@{host}-{random}``), so a later
successful publication, or a store opening, removes the ones whose writer is dead: only
this host's, only of processes that no longer exist, never one still being written.

A new file may be written from its parts (``FileParts``): many buffers written with
``writev``, never joined, each seen by the caller (a running checksum) as it is written.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = [
    "PRIVATE_FILE_MODE",
    "FileParts",
    "atomic_write_bytes",
    "fsync_directory",
    "fsync_path",
    "publish_directory",
    "remove_stale_temporaries",
    "write_new_file",
]

#: Mode of every file a run creates (the umask may take more away, never add): a run's
#: files hold prompts, rewards and server names.
PRIVATE_FILE_MODE = 0o600


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Make a file's content, or a directory's entries (a rename, a new file), durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make the directory's entries (a rename, a new file) durable."""
    fsync_path(directory)


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


#: Byte buffers a file can be written from.
Chunk = bytes | bytearray | memoryview
# At most this many buffers per writev(2) call (Linux's IOV_MAX).
_IOV_MAX = 1024


@runtime_checkable
class FileParts(Protocol):
    """A file given as the buffers it is written from, one after another.

    A large file assembled from many buffers (a checkpoint's sidecar: one per group) is
    written without joining them, and whatever its bytes depend on that only the whole can
    say (a checksum in its header) is computed by ``parts`` as the writer asks for them:
    in the writer's thread, not by whoever built the parts.
    """

    def parts(self) -> Iterable[Chunk]:
        """The file's bytes, in order (may be called more than once: same bytes)."""
        ...


def write_new_file(
    path: Path,
    data: Chunk | FileParts,
    *,
    observe: Callable[[memoryview], object] | None = None,
) -> int:
    """Create ``path`` (it must not exist) with ``data``, fsynced before returning; the
    number of bytes written.

    ``observe`` sees every byte written, in order, just before it is written (a running
    checksum: one pass over the bytes for both). Parts are written with ``writev`` in
    batches, never joined.
    """
    chunks = data.parts() if isinstance(data, FileParts) else (data,)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        size = 0
        batch: list[memoryview] = []
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            if not view:
                continue  # writev(2) of nothing but empty buffers returns 0: not an error
            if observe is not None:
                observe(view)
            size += len(view)
            batch.append(view)
            if len(batch) == _IOV_MAX:
                _write_all(descriptor, batch, path)
                batch = []
        _write_all(descriptor, batch, path)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return size


def _write_all(descriptor: int, views: list[memoryview], path: Path) -> None:
    """Write ``views`` in order, resuming after a short write."""
    first = 0
    while first < len(views):
        written = os.writev(descriptor, views[first : first + _IOV_MAX])
        if written == 0:  # pragma: no cover - writev(2) returns 0 only for 0 bytes
            raise OSError(errno.EIO, "write returned 0", str(path))
        while first < len(views) and written >= len(views[first]):
            written -= len(views[first])
            first += 1
        if written:
            views[first] = views[first][written:]


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
            fsync_path(path)
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
