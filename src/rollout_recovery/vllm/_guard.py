"""Keeps a server's process group from outliving the job that started it.

Run by path (standard library only, so it starts in milliseconds and needs nothing of the
project): ``python _guard.py --parent-pid PID -- COMMAND...``. The job starts it as the
leader of a new session; it runs COMMAND in its own process group and waits until one of:

- the job (PID) dies, SIGKILL included: the guard is reparented and PID's pidfd turns
  readable;
- COMMAND exits (a crashed server);
- the guard gets SIGTERM, SIGINT or SIGHUP (the job stopping its servers).

Then it sends COMMAND SIGTERM (vLLM shuts its engine down and removes its shared-memory
segments; a SIGKILL would leave them in ``/dev/shm``), waits up to ``--grace-s``, and
SIGKILLs whatever is left of the group (vLLM's ``EngineCore`` and worker processes, which
a killed API server leaves orphaned), removing the shared memory they had mapped. With
``--socket PATH`` it then removes the server's Unix socket, and the socket's directory once
it is empty (the last guard of a fleet removes it): a job that was SIGKILLed leaves no
socket directory behind. It exits with COMMAND's status.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

__all__ = ["main"]

# How long a wait between checks lasts where pidfds are missing (not Linux): the pidfds
# and the signal pipe wake the guard at once otherwise.
_FALLBACK_POLL_S = 1.0


def _pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(pid)
    except OSError:  # gone already, or no pidfd support
        return None
    return fd


def _group_members(pgid: int) -> list[int]:
    """Live processes of group ``pgid`` other than this one (Linux ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _shared_memory(pids: list[int]) -> set[Path]:
    """The /dev/shm files the processes ``pids`` have mapped."""
    found: set[Path] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                    found.add(Path(parts[5].removesuffix(" (deleted)")))
    return found


def _kill_the_rest() -> None:
    """SIGKILL what is left of the group, then remove the shared memory it had mapped
    (a killed process cannot unlink its segments, which would stay in /dev/shm)."""
    pgid = os.getpgrp()
    if not Path("/proc").is_dir():
        os.killpg(pgid, signal.SIGKILL)  # this one included: nothing else can be named
        return
    members = _group_members(pgid)
    segments = _shared_memory(members)
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for segment in segments:
        segment.unlink(missing_ok=True)


def _remove_socket(socket: Path) -> None:
    """The server's socket, and its directory if nothing else is left in it."""
    socket.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # another server's socket is still there, or gone
        socket.parent.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--grace-s", type=float, default=20.0)
    parser.add_argument("--socket", type=Path, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command: list[str] = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command to run is required after --")
    parent: int = args.parent_pid
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # lead a group, so the server's processes are ours to end

    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    stop_signals: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_signals.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    parent_fd = _pidfd(parent)
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    child_fd = _pidfd(child.pid)
    watched = [fd for fd in (parent_fd, child_fd, wake_read) if fd is not None]
    poll = None if parent_fd is not None and child_fd is not None else _FALLBACK_POLL_S
    while child.poll() is None and os.getppid() == parent and not stop_signals:
        select.select(watched, [], [], poll)
    if child.poll() is None:
        child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=args.grace_s)
    _kill_the_rest()
    if args.socket is not None:
        _remove_socket(args.socket)
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
