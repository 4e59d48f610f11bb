"""Graceful drain: what asks a running job to drain, and ``rollout-recovery stop``.

Three things ask the controller to drain (``Controller.request_drain``, once):

- SIGTERM: a scheduler's preemption warning, a spot notice handler, ``kill``;
- SIGINT: Ctrl-C in a terminal. A SIGINT while a drain is under way (a second Ctrl-C)
  interrupts the job at once instead: its main task is cancelled, no final checkpoint is
  taken, and :func:`~rollout_recovery.job.run_job` raises ``KeyboardInterrupt``. Every
  seal acknowledged before is in the journal, so the rerun still loses only the attempts
  in flight;
- the drain file (``[job] drain_file``, relative to the run directory or absolute)
  appearing. The job removes it when it acts on it; one present when a job starts is a
  stale request (a ``stop`` that raced the end of the previous job) and is removed too.

``rollout-recovery stop DIR`` writes the drain file rather than signalling the pid in
``DIR/.lock``: a pid means nothing in another pid namespace (a container) and signalling
needs the job's user or root, while writing into the run directory needs only what using
the run needs, wherever the directory is mounted. Whether a live job holds the directory
is the lock itself (``flock``, released by the kernel however the job ends), so ``stop``
never leaves a request behind for a directory no job holds.

Signals are handled with ``loop.add_signal_handler`` (the main thread only: Python
delivers signals there), and the handlers the process had before are put back when the
job's event loop ends. The drain file is polled on the loop every ``poll_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from .._durable import atomic_write_bytes
from ..control import Controller, RunConfig, load_config
from ..errors import ConfigError, NotARunDirectoryError
from ..rundir import RunDirectory

__all__ = [
    "DrainTriggers",
    "StopRequest",
    "drain_file_of",
    "remove_stale_drain_request",
    "request_stop",
]

#: How much of a drain file's first line is quoted in the drain's reason.
_DETAIL_BYTES = 200

_SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def drain_file_of(run: RunDirectory, config: RunConfig) -> Path:
    """The drain file ``config`` names for ``run``."""
    return run.resolve(config.job.drain_file)


def remove_stale_drain_request(path: Path) -> bool:
    """Remove a drain file present before the job began; True if there was one."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


class DrainTriggers:
    """SIGTERM, SIGINT and the drain file, wired to one controller while its job runs.

    ``install`` inside the job's event loop (in its main task), ``uninstall`` before the
    loop ends. ``interrupted`` says a second SIGINT cancelled the main task. With
    ``signals=False`` only the drain file is watched.
    """

    def __init__(
        self,
        controller: Controller[Any],
        *,
        drain_file: Path,
        log: Callable[[str], None],
        signals: bool = True,
        poll_s: float = 0.25,
    ) -> None:
        self.controller = controller
        self.signals = signals
        self.drain_file = drain_file
        self.interrupted = False
        self._log = log
        self._poll_s = poll_s
        self._main: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._previous: dict[signal.Signals, _SignalHandler] = {}

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        if self.signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.getsignal(sig)
                loop.add_signal_handler(sig, self._on_signal, sig)
        self._watcher = loop.create_task(self._watch(), name="drain-file-watch")

    def uninstall(self) -> None:
        for sig in list(self._previous):
            self._release(sig)
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    def _release(self, sig: signal.Signals) -> None:
        """Give ``sig`` back the handler the process had before the job."""
        previous = self._previous.pop(sig, None)
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            asyncio.get_running_loop().remove_signal_handler(sig)
        if previous is not None:  # None: a handler not installed from Python; leave it
            signal.signal(sig, previous)

    def _on_signal(self, sig: signal.Signals) -> None:
        if sig is signal.SIGINT and self.controller.draining:
            self.interrupted = True
            self._log(
                "interrupted: the second Ctrl-C stops the job now, without its final "
                "checkpoint; rerun the same command to resume (every sealed attempt is in "
                "the journal, only attempts in flight are lost)"
            )
            # A third Ctrl-C raises KeyboardInterrupt wherever the clean-up is.
            self._release(signal.SIGINT)
            if self._main is not None:
                self._main.cancel()
            return
        self._ask("SIGTERM" if sig is signal.SIGTERM else "SIGINT (Ctrl-C)")

    def _ask(self, reason: str) -> None:
        controller = self.controller
        if not controller.request_drain(reason):
            self._log(f"{reason}: already draining")
            return
        grace = controller.config.job.drain_grace_s
        self._log(
            f"draining ({reason}): admission stopped; {controller.in_flight} attempts in "
            f"flight get up to {grace:g} s to finish, then a checkpoint; Ctrl-C again "
            "stops at once"
        )

    async def _watch(self) -> None:
        while not self.controller.draining:
            if os.path.exists(self.drain_file):
                detail = _first_line(self.drain_file)
                try:
                    self.drain_file.unlink()
                except FileNotFoundError:
                    pass
                except OSError as error:
                    self._log(f"could not remove the drain file {self.drain_file}: {error}")
                self._ask(f"drain file {self.drain_file}" + (f": {detail}" if detail else ""))
                return
            await asyncio.sleep(self._poll_s)


def _first_line(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            head = handle.read(_DETAIL_BYTES)
    except OSError:
        return ""
    line = head.split(b"\n", 1)[0].decode("utf-8", "replace")
    return "".join(c if c.isprintable() else "?" for c in line).strip()


@dataclass(frozen=True, slots=True)
class StopRequest:
    """What ``request_stop`` did: the drain file written, the live job's pid."""

    drain_file: Path
    pid: int | None
    grace_s: float


def request_stop(out: os.PathLike[str] | str) -> StopRequest | None:
    """Ask the job running in ``out`` to drain by writing its drain file.

    Returns None, writing nothing, when no live job holds ``out``'s lock. Raises
    :class:`~rollout_recovery.errors.NotARunDirectoryError` for a directory that is not
    a run (no ``job.toml``, or one that does not load).
    """
    run = RunDirectory(Path(out))
    if not run.job_file.is_file():
        raise NotARunDirectoryError(
            f"{run.root} is not a rollout-recovery run directory (no {run.job_file.name})"
        )
    try:
        # The running job's own settings: a resume rewrites job.toml with its changes.
        config = load_config(run.job_file)
    except ConfigError as error:
        raise NotARunDirectoryError(f"{run.job_file} is not a valid job file: {error}") from None
    if not run.is_locked():
        return None
    path = drain_file_of(run, config)
    note = f"rollout-recovery stop (pid {os.getpid()}, user {_user()}, host {socket.gethostname()})"
    atomic_write_bytes(path, (note + "\n").encode())
    return StopRequest(drain_file=path, pid=run.lock_holder(), grace_s=config.job.drain_grace_s)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
