"""Keeps a server's process group from outliving the job that holds it for long.

Run by path (standard library only, so it starts in milliseconds and needs nothing of the
project): ``python _guard.py --parent-pid PID [--lease-s S --control PATH] -- COMMAND...``.
The job starts it as the leader of a new session; it runs COMMAND in its own process group
and ends the group when one of these happens:

- COMMAND exits (a crashed server);
- the guard gets SIGTERM, SIGINT or SIGHUP (the job stopping its servers), or ``end`` on
  its control socket (a job that adopts it but may not use it);
- the job that holds it (PID, or the job it was handed over to) dies, SIGKILL included,
  and no job adopts it within ``--lease-s`` seconds (at once with a lease of 0).

While its lease runs, a rerun of the job may adopt it: it connects to the control socket
``--control`` (in the same private 0700 directory as the server's socket, so only this
user can connect) and sends ``adopt LEASE_S``. The guard takes the connecting process
(its ``SO_PEERCRED`` pid, checked to be this user's) as the job it now watches, only once
the job before has died or if it is that job (a live job's server is no other process's
to take, nor to ``end``: it answers ``held``), through a pidfd opened while that
process waits for the answer: a pidfd names one process, never a later one that reuses
its pid, so a dead job's recycled pid cannot keep the server alive.
A control socket rather than a pid the guard polls: the guard learns the new job from the
kernel (who connected) instead of trusting a number written in a file, and it wakes at
once instead of on a poll. How the lease moves is :class:`Lease`, a state machine on an
injected clock.

To end the group it sends COMMAND SIGTERM (vLLM shuts its engine down and removes its
shared-memory segments; a SIGKILL would leave them in ``/dev/shm``), waits up to
``--grace-s``, and SIGKILLs whatever is left of the group (vLLM's ``EngineCore`` and worker
processes, which a killed API server leaves orphaned). Then it removes the ``psm_``
segments the group's processes mapped (read before the SIGTERM, when the API server still
maps them too): once no process of the group is left, each whose path still names the
same file and that no live process maps (:func:`remove_segments`). The job does the same
when it SIGKILLs a guard's group that outlived its own grace (:func:`kill_group`).
With ``--socket PATH`` it then removes the server's Unix socket (and its control
socket), each only if it is still the one its group bound (never a later server's at the
same path), and the socket's directory once it is empty (the last guard of a fleet removes
it): a job that was SIGKILLed leaves no socket directory behind. It exits with COMMAND's
status.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import math
import os
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

__all__ = [
    "MAX_LEASE_S",
    "Lease",
    "LeaseState",
    "Segment",
    "group_segments",
    "kill_group",
    "main",
    "remove_segments",
    "segments_in_maps",
    "segments_to_remove",
]

#: The longest lease a guard takes (``--lease-s``, ``adopt``; ``[vllm] adopt_within_s``):
#: a day. Any wait of the guard stays far below what ``select`` can take.
MAX_LEASE_S = 86400.0
# The longest single wait of the guard's loop (it then checks again).
_MAX_WAIT_S = 3600.0

# How long a wait between checks lasts where pidfds are missing (not Linux): the pidfds
# and the signal pipe wake the guard at once otherwise.
_FALLBACK_POLL_S = 1.0
# How long an adopting job may take to send its one-line request.
_CONTROL_TIMEOUT_S = 5.0


class LeaseState(enum.Enum):
    #: A live job holds the server.
    HELD = "held"
    #: The job died; a rerun may adopt the server until the deadline.
    ORPHANED = "orphaned"
    #: The group is to end (the lease lapsed, the job stopped it, or the server exited).
    ENDED = "ended"


class Lease:
    """Who holds a guarded server, and until when it may wait for a new holder::

        held --the job dies--> orphaned --adopted--> held
        held --the job dies, lease 0--> ended
        orphaned --deadline passes--> ended
        any --ended (stopped, or the server exits)--> ended

    ``now`` is the clock (seconds, monotonic): the guard's is ``time.monotonic``, a
    test's its own.
    """

    def __init__(self, lease_s: float, now: Callable[[], float] = time.monotonic) -> None:
        self.lease_s = lease_s
        self._now = now
        self.state = LeaseState.HELD
        self.deadline: float | None = None

    def job_died(self) -> None:
        if self.state is not LeaseState.HELD:
            return
        if self.lease_s <= 0:
            self.state = LeaseState.ENDED
            return
        self.state = LeaseState.ORPHANED
        self.deadline = self._now() + self.lease_s

    def claimable(self, by_holder: bool) -> bool:
        """Whether a job may adopt or end the server: only once its holder died (an
        orphan), or the holder itself (``by_holder``). A live job's servers are never
        another job's to take, such as a run started on a copy of its run directory."""
        self.wait_s()  # a deadline passed while the request waited ends the lease now
        if self.state is LeaseState.ORPHANED:
            return True
        return self.state is LeaseState.HELD and by_holder

    def adopted(self, lease_s: float, by_holder: bool = False) -> bool:
        """A new job holds the server (with its own lease); False once it has ended, or
        while another job holds it (:meth:`claimable`)."""
        if not self.claimable(by_holder):
            return False
        self.state, self.lease_s, self.deadline = LeaseState.HELD, lease_s, None
        return True

    def end(self) -> None:
        """Stopped by the job, or the server exited: end the group now."""
        self.state = LeaseState.ENDED

    def wait_s(self) -> float | None:
        """How long the guard may sleep before the deadline (None: no deadline); ends the
        lease when the deadline has passed."""
        if self.state is not LeaseState.ORPHANED or self.deadline is None:
            return None
        left = self.deadline - self._now()
        if left <= 0:
            self.state = LeaseState.ENDED
            return 0.0
        return left

    @property
    def ended(self) -> bool:
        return self.state is LeaseState.ENDED


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


# Python's ``multiprocessing.shared_memory`` segments (``psm_`` and random hex), which
# vLLM's shm_broadcast message queues use (~200 MB each): a SIGKILLed creator never unlinks
# them, nor does its resource tracker when the same killpg ends it too. Nothing else in
# /dev/shm is removed: another program's file is not the guard's to judge.
_SEGMENT_PREFIX = "/dev/shm/psm_"
# How long a SIGKILLed group may take to exit (and unmap) before its segments are left be.
# A cap, not a delay: ``_group_gone`` waits on the members' pidfds and returns as each
# exits (milliseconds, or the time to tear down a large mapping); the whole 10 s only
# passes for a process stuck in the kernel (uninterruptible sleep), whose segments must
# stay anyway. Who waits is already waiting for the group to end, off any path that runs
# work: the guard itself, as it ends (its grace of 20 s plus this fits in the job's 30 s,
# ``_fleet._STOP_GRACE_S``), and the job's ``VllmFleet`` where it SIGKILLs a guard that
# outlived that grace: at its close, after its backend, trail and data plane have closed,
# or while a rerun starts, before anything runs, ending a server it may not adopt (whose
# memory must be freed before its own servers start). Nothing of the job runs meanwhile.
_EXIT_WAIT_S = 10.0

#: A mapped shared-memory segment: its path and its file's (st_dev, st_ino), which proves
#: a path still names the file the server mapped (a later segment may reuse a name).
Segment = tuple[str, int, int]


def segments_in_maps(maps: str) -> set[Segment]:
    """The ``psm_`` segments in the text of a ``/proc/PID/maps``. One the kernel marks
    ``(deleted)`` is left out: already unlinked, its name may be another segment's now."""
    found: set[Segment] = set()
    for line in maps.splitlines():
        # address perms offset dev inode path (the path may hold spaces)
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith(_SEGMENT_PREFIX):
            continue
        path = fields[5]
        if path.endswith(" (deleted)") or "/" in path[len(_SEGMENT_PREFIX) :]:
            continue
        major, _, minor = fields[3].partition(":")
        with contextlib.suppress(ValueError):
            found.add((path, os.makedev(int(major, 16), int(minor, 16)), int(fields[4])))
    return found


def segments_to_remove(
    owned: set[Segment], still_mapped: set[Segment], present: dict[str, tuple[int, int]]
) -> list[str]:
    """Of the segments a server's processes mapped (``owned``), the paths to unlink: those
    still naming the same file (``present``: path to (st_dev, st_ino) now) and mapped by
    no live process (``still_mapped``, read after the server's processes were gone)."""
    mapped = {(device, inode) for _, device, inode in still_mapped}
    return sorted(
        path
        for path, device, inode in owned
        if present.get(path) == (device, inode) and (device, inode) not in mapped
    )


def _segments_of(pids: list[int]) -> set[Segment]:
    found: set[Segment] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            found |= segments_in_maps(Path(f"/proc/{pid}/maps").read_text())
    return found


def group_segments(pgid: int) -> set[Segment]:
    """The ``psm_`` segments the live processes of group ``pgid`` map now (Linux)."""
    return _segments_of(_group_members(pgid)) if Path("/proc").is_dir() else set()


def remove_segments(owned: set[Segment], pgid: int) -> list[str]:
    """Unlink the segments of ``owned`` (read from group ``pgid`` before it was killed)
    that no live process maps, once nothing of the group is left; the paths removed.
    Nothing is removed while the group lives on past the wait (its processes map them)."""
    if not owned or not _group_gone(pgid, _EXIT_WAIT_S):
        return []
    everyone = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    present: dict[str, tuple[int, int]] = {}
    for path, _, _ in owned:
        with contextlib.suppress(OSError):
            found = os.stat(path)
            present[path] = (found.st_dev, found.st_ino)
    removed = []
    for path in segments_to_remove(owned, _segments_of(everyone), present):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path)
    return removed


def kill_group(pgid: int) -> list[str]:
    """SIGKILL process group ``pgid`` (a guard and its server, which ended too slowly) and
    remove the ``psm_`` segments its processes mapped that no live process maps once it is
    gone; the paths removed. ``pgid`` must still be the group's: its leader not reaped."""
    segments = group_segments(pgid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    return remove_segments(segments, pgid)


def _group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until group ``pgid`` has no live process (already SIGKILLed: they die at once,
    but exiting a process with gigabytes mapped takes a moment); whether it is gone."""
    pidfds = [fd for fd in map(_pidfd, _group_members(pgid)) if fd is not None]
    try:
        if pidfds:
            deadline = time.monotonic() + timeout_s
            pending = list(pidfds)
            while pending and (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select(pending, [], [], left)
                pending = [fd for fd in pending if fd not in ready]
    finally:
        for fd in pidfds:
            os.close(fd)
    return not _group_members(pgid)


def _kill_the_rest(owned: set[Segment]) -> None:
    """SIGKILL what is left of the group, then remove the shared memory its processes had
    mapped (``owned``, read before the group was asked to end, and whatever the survivors
    map): a killed process cannot unlink its segments, which would stay in /dev/shm."""
    pgid = os.getpgrp()
    if not Path("/proc").is_dir():
        os.killpg(pgid, signal.SIGKILL)  # this one included: nothing else can be named
        return
    members = _group_members(pgid)
    owned = owned | _segments_of(members)
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    remove_segments(owned, pgid)


_Inode = tuple[int, int]


def _inode(path: Path) -> _Inode | None:
    """The (st_dev, st_ino) of the socket file at ``path``, or None (none there)."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino) if stat.S_ISSOCK(found.st_mode) else None


def _servers_inode(path: Path) -> _Inode | None:
    """The server socket's inode if it is this group's: listened on by a process of the
    group, or by nothing (this server's leftover, whose removal harms no server). The
    server binds it, not the guard, so it is asked before the group ends."""
    inode = _inode(path)
    if inode is None:
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(_CONTROL_TIMEOUT_S)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            return inode
        except OSError:
            return None
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(_peer(probe)[0]) == os.getpgrp():
                return inode
    return None


def _remove_sockets(*sockets: tuple[Path, _Inode | None]) -> None:
    """The guard's sockets, each only if it is still the inode found as this guard's
    (never a later server's at the same path), and their directory if it is empty."""
    for path, inode in sockets:
        if inode is not None and _inode(path) == inode:
            path.unlink(missing_ok=True)
    for path, _ in sockets:
        with contextlib.suppress(OSError):  # another server's socket is still there
            path.parent.rmdir()


def _peer(connection: socket.socket) -> tuple[int, int]:
    """The pid and uid of the process at the other end of ``connection``."""
    raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


class _Control:
    """The control socket: one request per connection, ``hello`` (answered ``guard PID``),
    ``adopt LEASE_S`` or ``end``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Never unlinks what is there first: each server has a fresh directory, so that
        # would be a live guard's socket (binding fails, and this guard with it).
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.inode = _inode(path)
        self.listener.listen(4)

    def serve(self, lease: Lease, holder: int) -> tuple[int, int] | None:
        """Answer one request; returns the pidfd and pid of a job that adopted the server.
        ``holder`` is the pid of the job the guard watches: ``adopt`` and ``end`` from
        any other process are refused while that job lives (:meth:`Lease.claimable`)."""
        try:
            connection, _ = self.listener.accept()
        except OSError:  # the caller gave up already, or no file descriptor is left
            return None
        with connection:
            connection.settimeout(_CONTROL_TIMEOUT_S)
            try:
                pid, uid = _peer(connection)
                words = connection.recv(256).decode("ascii", "replace").split()
            except (OSError, ValueError):
                return None
            if uid != os.getuid():
                return None  # the directory is private; this is belt and braces
            if words == ["hello"]:  # a rerun proving this guard is the listed pid
                with contextlib.suppress(OSError):
                    connection.sendall(f"guard {os.getpid()}\n".encode())
                return None
            if words[:1] in (["end"], ["adopt"]) and not lease.claimable(pid == holder):
                with contextlib.suppress(OSError):
                    connection.sendall(b"held\n")  # by a live job, not the caller
                return None
            if words == ["end"]:
                lease.end()
                with contextlib.suppress(OSError):
                    connection.sendall(b"ending\n")
                return None
            if len(words) != 2 or words[0] != "adopt":
                return None
            try:
                lease_s = float(words[1])
            except ValueError:
                lease_s = math.nan
            if not 0.0 <= lease_s <= MAX_LEASE_S:  # nan included
                with contextlib.suppress(OSError):
                    connection.sendall(b"refused lease\n")
                return None
            # Opened while the job waits for our answer, so the pid is still the job's.
            job = _pidfd(pid)
            if job is None or not lease.adopted(lease_s, pid == holder):
                return None
            try:
                connection.sendall(f"adopted {os.getpid()}\n".encode())
            except OSError:  # it died before it heard: as if it died holding the lease
                lease.job_died()
            return job, pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--grace-s", type=float, default=20.0)
    parser.add_argument("--socket", type=Path, default=None)
    parser.add_argument("--lease-s", type=float, default=0.0)
    parser.add_argument("--control", type=Path, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command: list[str] = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command to run is required after --")
    if not 0.0 <= args.lease_s <= MAX_LEASE_S:
        parser.error(f"--lease-s must be from 0 to {MAX_LEASE_S:.0f} seconds")
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
    lease = Lease(args.lease_s)
    control = _Control(args.control) if args.control is not None and lease.lease_s > 0 else None
    job_fd = _pidfd(parent)
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    child_fd = _pidfd(child.pid)
    pidfds = job_fd is not None and child_fd is not None
    # The first job is the guard's parent: a reparented guard has lost it even where the
    # pidfd could not be opened (the job died first).
    first_job, holder = True, parent

    def holder_died() -> bool:
        return (first_job and os.getppid() != parent) or _dead(job_fd)

    try:
        while not lease.ended:
            if child.poll() is not None or stop_signals:
                lease.end()
                break
            if lease.state is LeaseState.HELD and holder_died():
                lease.job_died()
            if lease.state is not LeaseState.HELD and job_fd is not None:
                os.close(job_fd)
                job_fd = None
            wait = lease.wait_s()
            if lease.ended:
                break
            if not pidfds and (wait is None or wait > _FALLBACK_POLL_S):
                wait = _FALLBACK_POLL_S
            if wait is not None:
                wait = min(wait, _MAX_WAIT_S)
            watched = [fd for fd in (job_fd, child_fd, wake_read) if fd is not None]
            if control is not None:
                watched.append(control.listener.fileno())
            ready, _, _ = select.select(watched, [], [], wait)
            if control is not None and control.listener.fileno() in ready:
                # The holder may have died as the request came: it is an orphan's then.
                if lease.state is LeaseState.HELD and holder_died():
                    lease.job_died()
                adopter = control.serve(lease, holder)
                if adopter is not None:
                    if job_fd is not None:
                        os.close(job_fd)
                    (job_fd, holder), first_job = adopter, False
    finally:
        # Whatever ended the loop, an error included: the group never outlives its guard.
        if control is not None:
            control.listener.close()
        _end_group(child, args.grace_s, args.socket, control)
    code = child.wait()
    return code if code >= 0 else 128 - code


def _end_group(
    child: subprocess.Popen[bytes], grace_s: float, server: Path | None, control: _Control | None
) -> None:
    """SIGTERM the server, SIGKILL what is left of the group after ``grace_s``, and remove
    the sockets that are still the group's own."""
    server_inode = None
    if server is not None:
        with contextlib.suppress(Exception):  # unproven: the socket is left where it is
            server_inode = _servers_inode(server)
    # Before the SIGTERM: a server's API process may be gone after it, its engine's
    # processes too, and with them the proof of which segments were theirs.
    segments = group_segments(os.getpgrp())
    if child.poll() is None:
        child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=grace_s)
    _kill_the_rest(segments)
    if server is not None:
        owned = [(server, server_inode)]
        if control is not None:
            owned.append((control.path, control.inode))
        _remove_sockets(*owned)


def _dead(pidfd: int | None) -> bool:
    """Whether the process of ``pidfd`` has exited (its pidfd turned readable)."""
    if pidfd is None:
        return False
    ready, _, _ = select.select([pidfd], [], [], 0)
    return bool(ready)


if __name__ == "__main__":
    sys.exit(main())
