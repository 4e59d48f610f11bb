"""The rerun's side of the warm standby (``[job] standby_within_s``): find it, prove it, hand over.

A rerun (``rollout-recovery run ... --out DIR``) whose run directory has a warm standby
(``_standby.py``: an interpreter that has imported torch, transformers and the job's
rooms, waiting on a Unix socket) does not import them again: it hands its command line,
working directory, environment, umask and its stdin, stdout and stderr (``SCM_RIGHTS``)
(and which signals it ignores) to the standby, which forks a child that runs the same
``run`` command. This module is
what the rerun runs before anything heavy is imported (standard library only), so a run
without a standby pays a ``stat`` for it.

The standby is used only once it is proven this user's and fit, from what the kernel says:

1. its socket's directory (named after the run directory's real path) is a directory of
   this user's that nobody else may enter (0700): nobody else can have bound the socket;
2. the process listening on it is this user's (``SO_PEERCRED``), and a pidfd opened on it
   before the exchange shows it alive after the answer: the answer came from that process;
3. it is fit: the same python, ``sys.path``, package source (:func:`code_digest`, which
   both sides compute) and environment (variables read at import time shape torch and
   transformers; only those in ``_IGNORED_ENV`` may differ). The standby compares, and
   refuses an unfit request without using the descriptors.

Then the child sends a pidfd of itself back: this process relays SIGINT, SIGTERM, SIGHUP
and SIGQUIT to it through that pidfd (never to a later process that reuses its pid) and exits
with its status, re-raising the signal that killed it. The child dies at once when this
process dies (it watches the connection for its end), so a kill -9 of the rerun, or of its
process group, kills the job. Anything that fails: the normal cold start, with one line
on stderr saying why.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

from .._crashpoints import crash_point
from .._private_dir import private_dir_problem

__all__ = [
    "SOCKET_NAME",
    "alive",
    "code_digest",
    "fitness",
    "hand_over",
    "ignored_signals",
    "initial_path",
    "run_out",
    "standby_dir",
]

SOCKET_NAME = "standby.sock"
# Variables that shape nothing a standby imported: the shell's, the terminal's and the
# login session's own (a rerun from another ssh session, tmux pane or prompt differs in
# them; the child takes the rerun's values anyway, only what was read at import time
# matters), and the crash point a test arms in one process (read at first use, in the
# child, from its new environment).
_IGNORED_ENV = frozenset(
    {
        "_", "PWD", "OLDPWD", "SHLVL", "PS1", "PS2", "PS4", "PROMPT_COMMAND",
        "TERM", "TERM_PROGRAM", "TERM_PROGRAM_VERSION", "TERM_SESSION_ID", "COLORTERM",
        "LS_COLORS", "LINES", "COLUMNS", "HISTFILE", "HISTSIZE", "HISTCONTROL", "MAIL",
        "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY", "SSH_AUTH_SOCK", "GPG_TTY",
        "TMUX", "TMUX_PANE", "STY", "WINDOW", "WINDOWID", "DISPLAY", "WAYLAND_DISPLAY",
        "XDG_SESSION_ID", "XDG_SESSION_TYPE", "XDG_SESSION_CLASS", "XDG_VTNR",
        "ROLLOUT_RECOVERY_CRASH_AT",
    }
)  # fmt: skip
# How long the exchange before the hand-over may take: the standby answers at once, but
# a second rerun waits while it serves the first, and 5 s was too short on a loaded
# machine (the reruns then went cold).
_EXCHANGE_TIMEOUT_S = 20.0
# The largest request (the environment and sys.path dominate it).
MAX_MESSAGE = 1 << 20
# SIGQUIT too (Ctrl-\): a cold job dies of it (a core where the limits allow one); the
# child is in the standby's process group, which no terminal signal reaches.
RELAYED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# A terminal's stop signals (Ctrl-Z, background reads and writes) and SIGCONT: the job
# stops and goes on with the rerun, as a job in the rerun's own process would.
_STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
# Read when the command line starts, before a job could add to it.
_INITIAL_PATH = tuple(sys.path)


def standby_dir(out: str | os.PathLike[str]) -> Path:
    """The private directory of the standby of run directory ``out``: in the temporary
    directory (a socket path holds at most 107 bytes), named after the user and a hash of
    the run directory's real path (a copy of the directory has another)."""
    real = os.path.realpath(os.fspath(out))
    key = hashlib.sha256(os.fsencode(real)).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / f"rollout-recovery-standby-{os.getuid()}-{key}"


def _private_dir_problem(directory: Path) -> str | None:
    """Why ``directory`` is not a private directory of this user (or cannot be looked
    at), or None."""
    try:
        problem = private_dir_problem(directory)
    except OSError as error:
        return f"{directory}: {error.strerror}"
    return None if problem is None else f"{directory}: {problem}"


def code_digest() -> str:
    """SHA-256 over this package's source files (their paths and bytes): a standby whose
    imported code differs from what a new process would import is not used."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(os.fsencode(path.relative_to(root)) + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def initial_path() -> list[str]:
    """``sys.path`` as this process started (before a job could add to it)."""
    return list(_INITIAL_PATH)


def fitness(environ: dict[str, str], path: list[str]) -> dict[str, Any]:
    """What a standby and a rerun must share for the standby's imports to be the rerun's:
    the interpreter and its flags (``-O``, ``-X dev``, ``-W error``: they shape what was
    imported and how it runs), where imports come from, this package's code, the
    environment."""
    return {
        "executable": sys.executable,
        "version": sys.version,
        "flags": [
            repr(sys.flags),
            list(sys.warnoptions),
            sorted(map(repr, sys._xoptions.items())),
        ],
        "path": path,
        "code": code_digest(),
        "environment": {k: v for k, v in environ.items() if k not in _IGNORED_ENV},
    }


def run_out(argv: list[str]) -> str | None:
    """The ``--out`` of a ``run`` command line a standby may take, or None (another
    command, no ``--out``, or ``--help``/``--print-config``, which import nothing heavy)."""
    if argv[:1] != ["run"]:
        return None
    out = None
    arguments = iter(argv[1:])
    for argument in arguments:
        if argument in ("-h", "--help", "--print-config"):
            return None
        if argument == "--out":
            out = next(arguments, None)
        elif argument.startswith("--out="):
            out = argument.removeprefix("--out=")
        elif argument in ("--config", "--seed", "--backend"):
            next(arguments, None)  # its value is never the --out
    return out or None


class _NotUsed(Exception):
    """Why the standby is not used (the cold path follows)."""


def hand_over(argv: list[str]) -> int | None:
    """Run ``rollout-recovery ARGV`` through the run directory's warm standby: the job's
    exit code (after it ended), or None when there is no standby to use (run it here)."""
    out = run_out(argv)
    if out is None:
        return None
    path = standby_dir(out) / SOCKET_NAME
    if not os.path.lexists(path):
        return None  # no standby: the common case costs this one stat
    if not hasattr(os, "pidfd_open") or not hasattr(socket, "SO_PEERCRED"):
        _say("it needs Linux (pidfds and SO_PEERCRED)")
        return None
    ignored = ignored_signals()  # before the relay takes some of them over
    relay = _Relay()  # from before the child exists: no stop signal is lost
    try:
        child, connection = _start(path, argv, out, ignored)
    except _NotUsed as why:
        relay.restore()  # a signal that came meanwhile is this process's again
        _say(str(why))
        return None
    relay.to(child)
    crash_point("standby.after_handover")
    return _wait(connection)


class _Relay:
    """SIGINT, SIGTERM, SIGHUP and SIGQUIT to this process go to the child through its
    pidfd; one that comes before the child is known is kept and sent once it is. A stop
    signal (Ctrl-Z) stops the child, then this process; SIGCONT goes on to the child."""

    def __init__(self) -> None:
        self.child: int | None = None
        self.pending: list[int] = []
        self.before = {signum: signal.signal(signum, self._on_signal) for signum in RELAYED_SIGNALS}
        for signum in _STOPS:
            self.before[signum] = signal.signal(signum, self._on_stop)
        self.before[signal.SIGCONT] = signal.signal(signal.SIGCONT, self._on_continue)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.child, signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)

    def _on_continue(self, signum: int, frame: FrameType | None) -> None:
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.child, signal.SIGCONT)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.child is None:
            self.pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.child, signum)

    def to(self, child: int) -> None:
        self.child = child
        for signum in self.pending:
            self._on_signal(signum, None)
        self.pending.clear()

    def restore(self) -> None:
        for signum, handler in self.before.items():
            signal.signal(signum, handler)
        for pending in self.pending:
            os.kill(os.getpid(), pending)
        self.pending.clear()


def _say(why: str) -> None:
    _tell(f"the warm standby is not used ({why}); starting cold")


def _tell(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"rollout-recovery: {line}", file=sys.stderr, flush=True)


def ignored_signals() -> list[int]:
    """The signals this process ignores: inherited from its parent (``nohup`` ignores
    SIGHUP, a script's background job SIGINT) and Python's own (SIGPIPE, SIGXFSZ). A cold
    job keeps them; the child a standby forks takes them (``_standby._take_signals``)."""
    return sorted(int(s) for s in signal.valid_signals() if signal.getsignal(s) is signal.SIG_IGN)


def _start(
    path: Path, argv: list[str], out: str, ignored: list[int]
) -> tuple[int, socket.socket]:
    """Prove the standby at ``path``, hand the command over; the child's pidfd and the
    connection the child watches (closed when this process dies)."""
    problem = _private_dir_problem(path.parent)
    if problem is not None:
        raise _NotUsed(problem)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    standby: int | None = None
    try:
        if connection.fileno() <= 2:
            # A standard descriptor was closed and the connection took its number: sent
            # as the child's stdin/stdout/stderr, the child would hold this end open and
            # never see this process die.
            raise _NotUsed("this process's stdin, stdout or stderr is closed")
        connection.settimeout(_EXCHANGE_TIMEOUT_S)
        try:
            inode = os.lstat(path).st_ino
            try:
                connection.connect(str(path))
            except ConnectionRefusedError:
                raise _NotUsed(_remove_leftover(path, inode)) from None
            raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            pid, uid, _gid = struct.unpack("3i", raw)
            if uid != os.getuid():
                raise _NotUsed(f"its socket is held by uid {uid}, not this user")
            standby = os.pidfd_open(pid)
            request = {
                "fitness": fitness(dict(os.environ), initial_path()),
                "argv": argv,
                "cwd": os.getcwd(),
                "environment": dict(os.environ),
                "umask": _umask(),
                "ignored": ignored,
            }
            socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
            answer, fds, _flags, _address = socket.recv_fds(connection, 4096, 1)
        except (OSError, ValueError) as error:
            if standby is not None and not alive(standby):
                raise _NotUsed(_remove_leftover(path, inode)) from None
            raise _NotUsed(f"the exchange failed: {type(error).__name__}: {error}") from None
        if not answer:
            # A standby answers every request: one that hung up unanswered is dying.
            select.select([standby], [], [], _EXCHANGE_TIMEOUT_S)
        if not alive(standby):
            for fd in fds:
                os.close(fd)
            raise _NotUsed(_remove_leftover(path, inode))
        words = answer.split()
        if words[:1] != [b"child"] or len(words) != 2 or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            reason = answer.decode("utf-8", "replace").removeprefix("refused ")
            raise _NotUsed(reason or "it closed the connection")
        connection.settimeout(None)
        _tell(f"running in the warm standby of {out} (job pid {int(words[1])}), its imports done")
        return fds[0], connection
    except BaseException:
        connection.close()
        raise
    finally:
        if standby is not None:
            os.close(standby)


def _remove_leftover(path: Path, inode: int) -> str:
    """A socket nobody listens on, or whose listener died in the exchange, is a dead
    standby's (a standby links its socket into place only once it listens): removed if it
    is still the one found (``inode``), with its directory once empty."""
    with contextlib.suppress(OSError):
        if os.lstat(path).st_ino == inode:
            path.unlink()
    with contextlib.suppress(OSError):
        path.parent.rmdir()
    return "its standby had died (its socket is removed)"


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def alive(pidfd: int) -> bool:
    """Whether the process ``pidfd`` names has not exited (no wait)."""
    ready, _, _ = select.select([pidfd], [], [], 0)
    return not ready


def _wait(connection: socket.socket) -> int:
    """Wait (the stop signals relayed) until the standby reports the child's status; the
    exit code (a signal that killed the child is raised on this process). The child
    tells its own exit code as it exits (``code N``): what counts when the standby died
    before it could reap the child (an OOM kill, a stray kill -9)."""
    status: int | None = None
    told: int | None = None
    while True:
        message = connection.recv(256)  # a signal is relayed and the wait goes on (PEP 475)
        if not message:
            break
        with contextlib.suppress(ValueError, IndexError):
            if message.startswith(b"code "):
                told = int(message.split()[1])
            elif message.startswith(b"exit "):
                status = int(message.split()[1])
                break
    if status is None:
        if told is not None:
            return told
        # Neither said how the child ended (killed before it could tell, its standby too).
        _tell("the job's exit status was lost (its standby ended before it)")
        return 1
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have none
            signal.signal(-code, signal.SIG_DFL)
        # A signal that dumps core (SIGQUIT, SIGSEGV, SIGABRT) dumped the job's in the
        # child, where the limits allow one; this process's would be a second, of the
        # relay, for whoever opens it to take for the job's.
        with contextlib.suppress(OSError, ValueError):
            _soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
            resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
        os.kill(os.getpid(), -code)
        return 128 - code
    return code
