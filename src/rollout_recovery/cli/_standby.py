"""A warm standby interpreter for a run directory's rerun (``[job] standby_within_s``).

A rerun after a kill -9 used to pay a new Python's imports before anything of the resume
ran: torch and transformers' model classes alone take seconds, more than a step of a small
model. A job with ``standby_within_s > 0`` starts a standby beside it (in a session of its
own, like a vLLM server's guard): an interpreter that imports what the job's run path
imports, then waits on a Unix socket in a private (0700) directory named after the run
directory (``_standby_link.standby_dir``). A rerun hands its command to it
(``_standby_link.py``: the proof, the fitness, the descriptors) and the standby forks a
child that runs the same ``run`` command with the rerun's arguments, working directory,
environment, umask, ignored signals, stdin, stdout and stderr: the imports are already done.

The standby has a lease, as a guard does (:class:`Lease`):

- the job holding it is watched through a pidfd: first the job that started it, then each
  child it forked for a rerun (the lease moves to it);
- that job ending by itself (finished, drained by ``rollout-recovery stop`` or a signal,
  failed with an error: a forked child's exit status says so, the first job SIGTERMs its
  standby) ends the standby;
- that job dying without a normal end (SIGKILL, a crash: a child killed by a signal)
  leaves the standby waiting ``standby_within_s`` for a rerun, after which it exits.

It forks only while it is single-threaded (nothing of torch computes in it: no thread
pools yet) and only once every child it forked before has been reaped: an orphan could
still hold the run directory's lock. A child dies at once when the rerun that asked for it
dies (a thread reads the rerun's connection; its end SIGKILLs the child, and the standby,
which watches it too, SIGKILLs a child too stopped to do so), so a kill -9 of the rerun
kills the job, as it would a cold one. Linux only (pidfds): elsewhere the job
says so and starts none.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from .._crashpoints import crash_point, reset_crash_points_for_tests
from .._private_dir import private_dir_problem
from ._standby_link import (
    MAX_MESSAGE,
    RELAYED_SIGNALS,
    SOCKET_NAME,
    alive,
    fitness,
    initial_path,
    standby_dir,
)

__all__ = ["MAX_STANDBY_S", "Lease", "LeaseState", "held_by_standby", "serve", "standby_for"]

#: The longest lease (``[job] standby_within_s``): a day.
MAX_STANDBY_S = 86400.0
# How long a rerun may take to send its request once connected.
_REQUEST_TIMEOUT_S = 5.0
# Exit codes of a child that did not run the job: a refused command (usage, a config or
# run directory that does not fit: 2) or a hand-over that failed (70). The run directory's
# job is still the dead one: the standby keeps waiting for the rerun that fixes it.
_NOT_RUN = frozenset({2, 70})
# How long a job waits for its standby to exit after asking it to.
_END_WAIT_S = 5.0
# The signals a rerun relays to its child (the standby's own, ``serve``'s, are among
# them). Blocked from before the fork until the child starts the rerun's command
# (``run_forked_command``): one that reaches the child before it has the rerun's
# dispositions (``_leave``, ``_take_signals``) stays pending, where it once ran the
# standby's handler in the child (a SIGTERM or Ctrl-C lost: the job ran on) or raised
# KeyboardInterrupt in the hand-over (a relayed Ctrl-C: exit 70 and no word why).
_HELD_SIGNALS = frozenset(RELAYED_SIGNALS)
# The modules a torch job's run path imports (Backend.build, the trainer, the model's
# class): the slow part of a new process, done once here.
_TORCH_IMPORTS = (
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "rollout_recovery.llm._trainer",
    "rollout_recovery.llm._backend",
    "rollout_recovery.llm._model_files",
    "rollout_recovery.llm._parts",
    "rollout_recovery.llm._generate",
    "rollout_recovery.llm._tensor_views",
    "rollout_recovery.llm._staging",
)
# Started with the job's own sys.path, so the child imports from where a rerun would.
# In a forked child ``serve`` returns None, the rerun's command line in ``sys.argv``.
_BOOT = (
    "import json, os, sys; started_with = dict(os.environ); "
    "sys.path[:] = json.loads(sys.argv[1]); "
    "from rollout_recovery.cli._standby import run_forked_command, serve; "
    "from rollout_recovery.cli._main import cli; "
    "code = serve(sys.argv[2:], started_with); "
    "sys.exit(code) if code is not None else run_forked_command(cli.main)"
)


class LeaseState(enum.Enum):
    #: A live job holds the standby.
    HELD = "held"
    #: The job died without a normal end; a rerun may take the standby until the deadline.
    ORPHANED = "orphaned"
    #: The standby is to exit (the lease lapsed, or the job ended normally).
    ENDED = "ended"


class Lease:
    """Who holds the standby, and until when it waits for a rerun::

        held --the job dies--> orphaned --a rerun takes it--> held
        held --the job ends normally (or lease 0 and it dies)--> ended
        orphaned --deadline passes--> ended

    ``now`` is the clock (monotonic seconds): the standby's ``time.monotonic``, a test's
    its own.
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
        self.state, self.deadline = LeaseState.ORPHANED, self._now() + self.lease_s

    def job_ended(self) -> None:
        self.state = LeaseState.ENDED

    def take(self) -> bool:
        """A rerun takes the standby: only once its holder died, within the lease."""
        if self.wait_s() is None or self.state is not LeaseState.ORPHANED:
            return False
        self.state, self.deadline = LeaseState.HELD, None
        return True

    def wait_s(self) -> float | None:
        """How long the standby may wait before the deadline (None: no deadline); ends
        the lease when the deadline has passed."""
        if self.state is not LeaseState.ORPHANED or self.deadline is None:
            return None
        left = self.deadline - self._now()
        if left <= 0:
            self.state = LeaseState.ENDED
            return None
        return left


@dataclass(slots=True)
class _Child:
    """A job the standby forked: its pidfd, the rerun's connection (the exit status goes
    there) and the child's own link (``lease S``)."""

    pid: int
    pidfd: int
    connection: socket.socket
    link: socket.socket
    # Its rerun died and it was sent SIGKILL: its connection (at its end, so always
    # readable) is no longer watched while it dies.
    abandoned: bool = False


@dataclass(slots=True)
class _ForkedJob:
    """What the child runs once forked: the rerun's request, the link to its standby."""

    request: dict[str, Any]
    link: socket.socket
    added_by_imports: dict[str, str]


@dataclass
class _Standby:
    listener: socket.socket
    lease: Lease
    holder: int | None  # the pidfd of the job holding the standby
    fit: dict[str, Any]
    added_by_imports: dict[str, str]
    owner: int = field(default_factory=os.getpid)
    children: dict[int, _Child] = field(default_factory=dict)
    signals: list[int] = field(default_factory=list)

    def loop(self, wake: int) -> _ForkedJob | None:
        """Serve until the lease ends; in a forked child, what it is to run."""
        while True:
            self._refresh()
            wait = self.lease.wait_s()
            if self.lease.state is LeaseState.ENDED and not self.children:
                return None
            watched = [wake, self.listener.fileno()]
            watched += [fd for fd in (self.holder,) if fd is not None]
            for child in self.children.values():
                watched += [child.pidfd, child.link.fileno()]
                watched += [] if child.abandoned else [child.connection.fileno()]
            ready, _, _ = select.select(watched, [], [], wait)
            if wake in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake, 64)
            for child in list(self.children.values()):
                if child.link.fileno() in ready:
                    self._heard(child)
                if child.connection.fileno() in ready:
                    _kill_if_abandoned(child)
            if self.listener.fileno() in ready:
                forked = self._serve()
                if forked is not None:
                    return forked

    def _refresh(self) -> None:
        """Reap the children that exited, and see whether the holder has died."""
        for child in list(self.children.values()):
            self._reap(child)
        if self.signals:
            self.lease.job_ended()
        if self.holder is not None and not alive(self.holder) and self._holder_unforked():
            self._release_holder()
            self.lease.job_died()

    def _abandoned_children_end(self) -> None:
        """Wait for the children whose rerun has died (its connection ended): each kills
        itself as it sees that, within moments. A child whose rerun lives is left."""
        for child in list(self.children.values()):
            if _kill_if_abandoned(child):
                select.select([child.pidfd], [], [], _REQUEST_TIMEOUT_S)
        self._refresh()

    def _holder_unforked(self) -> bool:
        """The holder is not one of the children, whose exit status says how it ended."""
        return not any(child.pidfd == self.holder for child in self.children.values())

    def _release_holder(self) -> None:
        if self.holder is not None and self._holder_unforked():
            os.close(self.holder)
        self.holder = None

    def _heard(self, child: _Child) -> None:
        with contextlib.suppress(OSError, ValueError):
            words = child.link.recv(256).decode().split()
            if words[:1] == ["lease"] and child.pidfd == self.holder:
                self.lease.lease_s = min(max(float(words[1]), 0.0), MAX_STANDBY_S)

    def _reap(self, child: _Child) -> None:
        """A child that has exited: its status to its rerun; how it ended moves the lease."""
        try:
            pid, status = os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = child.pid, 0
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            # Never blocking (a stopped rerun), and no mode change on the shared socket.
            child.connection.send(f"exit {status}".encode(), socket.MSG_DONTWAIT)
        child.connection.close()
        child.link.close()
        os.close(child.pidfd)
        del self.children[child.pid]
        if self.holder == child.pidfd:
            self.holder = None
            if os.WIFSIGNALED(status) or os.waitstatus_to_exitcode(status) in _NOT_RUN:
                self.lease.job_died()  # killed, or refused before it ran: a rerun may come
            else:
                self.lease.job_ended()  # it ended by itself: finished, drained, failed

    def _serve(self) -> _ForkedJob | None:
        try:
            connection, _ = self.listener.accept()
        except OSError:
            return None
        fds: list[int] = []
        try:
            connection.settimeout(_REQUEST_TIMEOUT_S)
            raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            _pid, uid, _gid = struct.unpack("3i", raw)
            if uid != os.getuid():
                return None  # the directory is private; this is belt and braces
            message, fds, _flags, _address = socket.recv_fds(connection, MAX_MESSAGE, 3)
            request = json.loads(message)
            why = self._refusal(request, fds)
            if why is not None:
                with contextlib.suppress(OSError):
                    connection.send(f"refused {why}".encode())
                return None
            crash_point("standby.before_fork")
            forked = self._fork(connection, request, fds)
            if forked is not None:
                fds = []  # the child's now
            return forked
        except (OSError, ValueError, KeyError, TypeError):
            return None
        finally:
            if os.getpid() == self.owner:
                for fd in fds:
                    os.close(fd)
                connection.close()

    def _refusal(self, request: dict[str, Any], fds: list[int]) -> str | None:
        if len(fds) != 3:
            return "the rerun's stdin, stdout and stderr did not arrive"
        ignored = request.get("ignored")
        if not isinstance(ignored, list) or not all(type(s) is int for s in ignored):
            return "the request's ignored is not a list of signal numbers"
        self._abandoned_children_end()
        unfit = _unfit(self.fit, request["fitness"])
        if unfit is not None:
            if self.lease.state is LeaseState.ORPHANED:
                self.lease.job_ended()  # the rerun goes cold and starts its own
            return unfit
        if self.children:
            return "a job it started earlier is still running"
        if not self.lease.take():
            if self.lease.state is LeaseState.HELD:
                return "a live job holds it"
            return "its lease has ended"
        threads = _thread_count()
        if threads != 1:
            self.lease.job_died()  # not forkable now, but still the rerun's to wait for
            return f"it runs {threads} threads (a fork could copy a held lock)"
        return None

    def _fork(
        self, connection: socket.socket, request: dict[str, Any], fds: list[int]
    ) -> _ForkedJob | None:
        # The connection's O_NONBLOCK lives in the open file description, which the
        # child's copy shares with ours: a timeout set on either (``dup`` copies one)
        # would make the other's blocking ``recv`` fail at once. So it is made blocking,
        # and our copy taken, before the fork, and no copy's mode changes after it.
        connection.settimeout(None)
        kept = connection.dup()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
        try:
            pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for end in (kept, ours, theirs):
                end.close()
            raise
        if pid == 0:  # the child: the rerun's job from here on
            global _mask_to_restore
            _mask_to_restore = mask  # the signals stay held until the command starts
            try:
                ours.close()
                kept.close()
                self._leave()
                _take_over(request, fds, connection)
            except BaseException:
                # Never back into the standby's loop (a rerun that died before it heard).
                os._exit(70)
            return _ForkedJob(request, theirs, self.added_by_imports)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one held meanwhile is ours now
        theirs.close()
        pidfd = os.pidfd_open(pid)  # our unreaped child: the pid cannot be reused yet
        self.children[pid] = _Child(pid, pidfd, kept, ours)
        self._release_holder()
        self.holder = pidfd
        return None

    def _leave(self) -> None:
        """In the child: drop what is the standby's (its socket, pidfds, signals)."""
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.listener.close()
        if self.holder is not None and self._holder_unforked():
            os.close(self.holder)
        for child in self.children.values():
            os.close(child.pidfd)
            child.connection.close()
            child.link.close()
        self.children.clear()


def _unfit(mine: dict[str, Any], theirs: Any) -> str | None:
    """Why a rerun with fitness ``theirs`` may not use a standby with ``mine``, or None."""
    if not isinstance(theirs, dict):
        return "the request is malformed"
    for key, what in (
        ("executable", "another python"),
        ("version", "another python"),
        ("flags", "other Python flags (-O, -X, -W)"),
        ("path", "another sys.path"),
        ("code", "the package's source changed since it started"),
    ):
        if theirs.get(key) != mine[key]:
            return what
    environment = theirs.get("environment")
    if not isinstance(environment, dict) or environment != mine["environment"]:
        names = sorted(
            name
            for name in set(mine["environment"]) | set(environment or {})
            if mine["environment"].get(name) != (environment or {}).get(name)
        )
        return "another environment: " + ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
    return None


def _thread_count() -> int:
    """This process's Python threads. Native ones are left out: OpenBLAS starts its pool
    when numpy is imported, and hands it over a fork itself (``pthread_atfork``); a
    Python thread could hold a lock the child would wait on for ever."""
    return threading.active_count()


def _kill_if_abandoned(child: _Child) -> bool:
    """SIGKILL ``child`` if its rerun has died (True). The child kills itself when it sees
    that, but a stopped child (Ctrl-Z, then ``kill -9`` of the rerun's group) runs none of
    its threads: it would stay stopped for ever, holding the run directory."""
    if not child.abandoned:
        if not _peer_gone(child.connection):
            return False
        child.abandoned = True
        with contextlib.suppress(OSError):  # it has exited: our unreaped child, no other
            signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
    return True


def _peer_gone(connection: socket.socket) -> bool:
    """Whether the rerun at the other end of ``connection`` has closed it (it died). A
    message is read, not peeked: the rerun sends none after the hand-over, and one left
    queued would wake the standby's ``select`` without end."""
    try:
        return connection.recv(256, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _take_over(request: dict[str, Any], fds: list[int], connection: socket.socket) -> None:
    """In the child: become the rerun's process (its descriptors, directory, umask and
    environment), tell it our pidfd, and die with it."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    # Python chose stdout's buffering for the standby's /dev/null: a terminal's is by line.
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=os.isatty(1))  # type: ignore[union-attr]
    os.chdir(request["cwd"])
    os.umask(int(request["umask"]))
    # Before the rerun learns our pidfd, so a signal it relays meets the rerun's own
    # disposition: under ``nohup`` the job ignores a hang-up, as a cold one would.
    _take_signals(set(request["ignored"]))
    me = os.pidfd_open(os.getpid())
    try:
        socket.send_fds(connection, [f"child {os.getpid()}".encode()], [me])
    finally:
        os.close(me)
    global _rerun
    _rerun = connection
    # Started with the held signals blocked (``_HELD_SIGNALS``), which it keeps: they go
    # to the main thread, the job's.
    threading.Thread(target=_die_with, args=(connection,), daemon=True).start()


def _take_signals(ignored: set[int]) -> None:
    """In the child: ignore the signals the rerun ignores, and only those. A cold job
    inherits its parent's ignored signals (``nohup``: SIGHUP), the standby had the first
    job's. A handler an import set (a cold job's imports set it too) is left."""
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        # What a new Python starts with for a signal its parent did not ignore.
        startup = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        if signal.getsignal(signum) not in (startup, signal.SIG_IGN):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, signal.SIG_IGN if signum in ignored else startup)


def run_forked_command(main: Callable[[list[str], str], object]) -> None:
    """In a forked child: run the rerun's command (click's ``main``, which exits), and
    tell the rerun its exit code as it exits, so a standby that dies before it can reap
    the child does not take the job's status with it."""
    code = 1
    try:
        _release_held_signals()
        main(sys.argv[1:], "rollout-recovery")
        code = 0
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
        raise
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
        raise
    finally:
        if _rerun is not None:
            with contextlib.suppress(OSError):
                _rerun.send(f"code {code}".encode())


def _release_held_signals() -> None:
    """In a forked child, as the command starts: the signal mask from before the fork. A
    signal held since (``_HELD_SIGNALS``) now meets the rerun's dispositions, as it would
    a cold job's: a SIGTERM kills the job, a SIGHUP the rerun ignores was discarded when
    the child took that on."""
    if _mask_to_restore is None:
        return
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, _mask_to_restore)
    except KeyboardInterrupt:
        # A Ctrl-C before anything of the job ran. Said so, then the child dies of it, as
        # a cold job Ctrl-C'd in its imports does (the rerun dies of it too: a shell's
        # 130, its script stops) but without a traceback of the standby's; killed, it
        # leaves the standby waiting for the next rerun.
        with contextlib.suppress(OSError, ValueError):
            print(
                "rollout-recovery: interrupted (Ctrl-C) as the warm standby handed the job "
                "over, before it started; rerun the same command to run it",
                file=sys.stderr,
                flush=True,
            )
        if _rerun is not None:
            with contextlib.suppress(OSError):
                _rerun.send(f"code {128 + signal.SIGINT}".encode())
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        sys.exit(128 + signal.SIGINT)  # not reached: SIGINT is unblocked, its default kills


def _exit_code(code: object) -> int:
    """The status ``sys.exit(code)`` exits with (None: 0; a message: 1)."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _die_with(connection: socket.socket) -> None:
    """The rerun's connection ends only when the rerun's process does: so does the job."""
    _until_closed(connection)
    os.kill(os.getpid(), signal.SIGKILL)


def _until_closed(connection: socket.socket) -> None:
    """Return once the peer of ``connection`` has closed it (or it failed).

    A read that finds nothing is not the end: the socket's blocking mode is shared with
    every copy of its descriptor (the standby's among them), so this waits in ``select``
    and reads without blocking rather than trusting the mode. Taking a "no data yet" for
    the rerun's death once SIGKILLed healthy jobs right after a hand-over."""
    while True:
        select.select([connection], [], [])
        try:
            if not connection.recv(256, socket.MSG_DONTWAIT):
                return
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            return


# The child's link to its standby (None in a job no standby forked).
_link: socket.socket | None = None
# The child's connection to its rerun (None in a job no standby forked).
_rerun: socket.socket | None = None
# The child's signal mask from before the fork (None in a job no standby forked).
_mask_to_restore: set[int] | None = None


def held_by_standby() -> bool:
    """Whether this process is a job a standby forked (it holds that standby)."""
    return _link is not None


def _run_forked(job: _ForkedJob) -> None:
    global _link
    _link = job.link
    os.environ.clear()
    os.environ.update({**job.request["environment"], **job.added_by_imports})
    # A forked child is a new process for the crash points: armed by its own environment.
    reset_crash_points_for_tests()
    crash_point("standby.child_started")
    sys.argv = ["rollout-recovery", *job.request["argv"]]


def serve(argv: list[str], started_with: dict[str, str]) -> int | None:
    """The standby's main (``_BOOT``): import, bind, serve until the lease ends (its exit
    code); in a forked child None, the rerun's process set up to run its command."""
    parser = argparse.ArgumentParser(description="a warm standby of a run directory")
    parser.add_argument("--holder", type=int, required=True)
    parser.add_argument("--lease-s", type=float, required=True)
    parser.add_argument("--directory", type=Path, required=True)
    parser.add_argument("--torch", action="store_true")
    args = parser.parse_args(argv)
    holder = _open_holder(args.holder)
    lease = Lease(args.lease_s)
    if holder is None:
        lease.job_died()  # the job died before this standby could watch it
    stop: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    # What the rerun's code is compared with, read before the imports: a file changed
    # while they run then differs from the digest (the rerun goes cold), where a digest
    # read after them (once the socket listens) could take in a change made after the
    # imports and pass a standby that runs the code from before it.
    fit = fitness(started_with, initial_path())
    _import_the_run_path(args.torch)
    if stop:
        return 0
    added = {k: v for k, v in os.environ.items() if started_with.get(k) != v}
    with _listening(args.directory) as listener:
        if listener is None:
            return 0
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        os.set_blocking(wake_read, False)
        signal.set_wakeup_fd(wake_write)
        standby = _Standby(listener, lease, holder, fit, added, signals=stop)
        forked = standby.loop(wake_read)
        if forked is None:
            return 0
        os.close(wake_read)
        os.close(wake_write)
    _run_forked(forked)
    return None


def _open_holder(pid: int) -> int | None:
    """A pidfd of the job that started this standby (None: it has died already)."""
    if os.getppid() != pid:
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _import_the_run_path(with_torch: bool) -> None:
    """What a torch job imports besides the command line and the job's rooms (``_BOOT``
    imported those)."""
    if with_torch:
        for name in _TORCH_IMPORTS:
            importlib.import_module(name)


@contextlib.contextmanager
def _listening(directory: Path) -> Iterator[socket.socket | None]:
    """The standby's socket in ``directory`` (made 0700), removed at the end if it is
    still this one's; None when another standby listens there.

    It is bound under a name of its own and linked into place only once it listens
    (``link`` never replaces a file): a socket at the standby's path that refuses a
    connection is then always a dead standby's, which a rerun may remove."""
    owner = os.getpid()
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    try:
        private = private_dir_problem(directory) is None
    except OSError:
        private = False
    if not private:
        yield None
        return
    path, own = directory / SOCKET_NAME, directory / f"{SOCKET_NAME}.{owner}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    placed = False
    try:
        own.unlink(missing_ok=True)
        listener.bind(str(own))
        listener.listen(8)
        for _attempt in range(2):
            try:
                os.link(own, path)
                placed = True
                break
            except FileExistsError:
                if _someone_listens(path):
                    break
                path.unlink(missing_ok=True)  # a SIGKILLed standby's leftover
        own.unlink()
        inode = os.lstat(path).st_ino if placed else None
        yield listener if placed else None
    finally:
        listener.close()
        if os.getpid() == owner:
            with contextlib.suppress(OSError):
                own.unlink()
            with contextlib.suppress(OSError):
                if placed and os.lstat(path).st_ino == inode:
                    path.unlink()
            with contextlib.suppress(OSError):
                directory.rmdir()


def _someone_listens(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def standby_for(
    out: Path, lease_s: float, *, with_torch: bool, log: Callable[[str], None]
) -> Iterator[None]:
    """While a ``run`` command runs: a job a standby forked tells it its lease (0: end
    with this job); any other job with ``lease_s > 0`` starts a standby, and ends it when
    it ends by itself (a SIGKILL leaves it for a rerun)."""
    if _link is not None:
        with contextlib.suppress(OSError):
            _link.send(f"lease {lease_s!r}".encode())
        yield
        return
    if lease_s <= 0:
        yield
        return
    if not hasattr(os, "pidfd_open"):
        log("[job] standby_within_s: no warm standby on this system (it needs Linux pidfds)")
        yield
        return
    command = [
        sys.executable,
        "-c",
        _BOOT,
        json.dumps(initial_path()),
        "--holder",
        str(os.getpid()),
        "--lease-s",
        repr(min(lease_s, MAX_STANDBY_S)),
        "--directory",
        str(standby_dir(out)),
    ] + (["--torch"] if with_torch else [])
    # Its own session: a Ctrl-C or a kill of the job's group leaves it to its lease. No
    # descriptor of the job's: a reader of the job's output sees its end when it ends.
    standby = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield
    finally:
        standby.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            standby.wait(timeout=_END_WAIT_S)
        if standby.poll() is None:
            standby.kill()
            standby.wait()
