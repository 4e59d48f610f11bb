"""One run directory, one live job: an exclusive ``flock`` held for the whole job.

Two jobs on one directory each train rows the other will train again, and one dies on a
row the other deleted. So a job takes ``DIR/.lock`` (``LOCK_EX | LOCK_NB``) before it
writes anything else, keeps the descriptor open until it exits, and writes its pid into
the file for the next one to name. The kernel drops the lock when the process dies,
however it dies (SIGKILL included), so a stale lock cannot outlive its holder and a pid
left in the file by a dead job means nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from .._durable import PRIVATE_FILE_MODE
from ..errors import RunDirectoryLockedError

if TYPE_CHECKING:  # _layout imports this module to give RunDirectory its lock methods
    from ._layout import RunDirectory

__all__ = ["is_locked", "lock_holder", "run_directory_lock", "wait_unlocked"]


def lock_holder(run: RunDirectory) -> int | None:
    """The pid a live job wrote into the lock file, or None if unknown."""
    try:
        text = run.lock_file.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdecimal() else None


@contextlib.contextmanager
def run_directory_lock(run: RunDirectory) -> Iterator[None]:
    """Hold ``run``'s lock for the ``with`` block; refuse at once if another job holds it.

    Creates the directory (and its parents) if needed. Raises
    :class:`~rollout_recovery.errors.RunDirectoryLockedError` naming the holder's pid.
    """
    run.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(run.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = lock_holder(run)
            raise RunDirectoryLockedError(
                f"{run.root} is in use by another rollout-recovery job"
                + (f" (pid {holder})" if holder is not None else "")
                + "; wait for it to end or stop it (rollout-recovery stop), then rerun",
                pid=holder,
                directory=str(run.root),
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        yield
    finally:
        # Closing the descriptor releases the lock; the file stays (its pid is then stale,
        # which lock_holder's readers only ever print next to a held lock).
        os.close(fd)


def is_locked(path: Path) -> bool:
    """Whether a live job holds the run directory lock at ``path`` (read-only probe)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def wait_unlocked(path: Path, *, timeout: float | None = None, poll_s: float = 0.1) -> bool:
    """Wait until no live job holds the run directory lock at ``path``; False if
    ``timeout`` seconds passed first (``None``: wait as long as it takes).

    Without a timeout it blocks in ``flock`` itself (a shared lock is granted the moment
    the job's exclusive one is released, however the job ends); with one it probes.
    """
    if timeout is None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        return True
    deadline = time.monotonic() + timeout
    while is_locked(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True
