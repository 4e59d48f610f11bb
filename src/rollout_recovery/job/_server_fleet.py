"""Local generation servers a job starts and stops itself (``[http] servers = []``).

Each server is ``python -m rollout_recovery serve`` on a Unix socket in a directory the
fleet makes for it, which only this user can enter (0700, ``_unix_http``), in its own
process group (so a kill of the group ends everything it started), told to exit when the
job that started it dies (``--parent-pid``: a SIGKILLed job leaves no server behind).
``servers.json`` in the run directory lists them (url, socket, pid, log file, and the
command that restarts one on the same socket), so an operator or a test can kill or
restart a single server while the job runs.

A loopback port would be anyone's: when a server died, another local user could bind its
port and be taken for it (the job's key, its weight pushes, every call). The socket can
be bound only by this user (a server restarted by hand included, which replaces the
killed one's socket file), and a server is taken as started only once its ready file and
the socket's listener (``SO_PEERCRED``) both name the process the fleet launched. A
server that dies is found by the pool's probes (its socket refuses), and nobody else can
answer in its place.

Every server requires the fleet's API key (``Authorization: Bearer``), so nothing else on
the machine (another user, a web page) can generate from them or replace their weights.
The key is random per job unless the job names one (``[http] api_key_env``); it reaches
each server in an environment variable, never in argv (which every user sees in ``ps``)
nor in ``servers.json``. A restart command names the variable (``--api-key-env``), so a
server restarted by hand needs the key in it: the job's own key when the job names one,
else the key in a live server's environment (``/proc/PID/environ``, readable by its user
only).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .._durable import atomic_write_bytes
from .._lifecycle import Resource
from .._outcomes import FailureReason
from .._unix_http import listener_pid, private_socket_dir, require_private_dir, unix_server_url
from ..errors import GenerationError
from ..rundir import RunDirectory
from ..serve import PolicyServer

__all__ = ["LAUNCHED_API_KEY_ENV", "LocalServer", "LocalServerFleet"]

#: The variable a launched server reads its random key from.
LAUNCHED_API_KEY_ENV = "ROLLOUT_RECOVERY_SERVE_API_KEY"

_READY_TIMEOUT_S = 60.0
_STOP_GRACE_S = 5.0
_SOCKET_DIR_PREFIX = "rollout-recovery-serve-"


@dataclass(frozen=True, slots=True)
class LocalServer:
    url: str
    pid: int
    log: Path
    restart_command: list[str]
    socket: Path


class LocalServerFleet(Resource):
    """Starts ``count`` servers (:meth:`start`); :meth:`close` stops them all."""

    def __init__(
        self,
        run_dir: Path,
        count: int,
        *,
        seed: int,
        call_latency_s: float,
        model: str,
        token_latency_s: float = 0.0,
        api_key: str | None = None,
        api_key_env: str | None = None,
        python: str = sys.executable,
    ) -> None:
        run = RunDirectory(run_dir)
        self._dir = run.servers_dir
        self._file = run.servers_file
        self._count = count
        self._seed = seed
        self._latency = call_latency_s
        self._token_latency = token_latency_s
        self._model = model
        self._python = python
        #: What every server requires (``api_key`` if given, else a random one).
        self.api_key = api_key if api_key is not None else secrets.token_urlsafe(32)
        self._key_env = api_key_env or LAUNCHED_API_KEY_ENV
        self._processes: list[subprocess.Popen[bytes]] = []
        self._sockets: Path | None = None
        self.servers: list[LocalServer] = []

    def _command(self, socket: Path, ready: Path) -> list[str]:
        return [
            self._python,
            "-m",
            "rollout_recovery",
            "serve",
            "--uds",
            str(socket),
            # A job SIGKILLed leaves no socket directory: the last server out removes it.
            "--remove-socket-dir",
            "--ready-file",
            str(ready),
            "--seed",
            str(self._seed),
            "--call-latency-s",
            repr(self._latency),
            "--token-latency-s",
            repr(self._token_latency),
            "--model-name",
            self._model,
            # This process, named: a server that read its parent only after the job died
            # would watch the wrong one.
            "--parent-pid",
            str(os.getpid()),
            # The key's name only: its value is in the environment (see _spawn).
            "--api-key-env",
            self._key_env,
        ]

    def start(self) -> list[str]:
        """Start the servers and wait until each is ready; returns their urls. A server
        that fails to start stops the ones already started and raises."""
        self._dir.mkdir(parents=True, exist_ok=True)
        try:
            self._sockets = private_socket_dir(_SOCKET_DIR_PREFIX)
            require_private_dir(self._sockets)
            started = [self._spawn(index, self._sockets) for index in range(self._count)]
            self.servers = [self._await_ready(*entry) for entry in started]
        except BaseException:
            self.close()
            raise
        listing = [
            {
                "url": s.url,
                "socket": str(s.socket),
                "pid": s.pid,
                "log": str(s.log),
                "restart_command": s.restart_command,
            }
            for s in self.servers
        ]
        atomic_write_bytes(self._file, json.dumps({"servers": listing}, indent=2).encode())
        return [server.url for server in self.servers]

    def _spawn(
        self, index: int, sockets: Path
    ) -> tuple[int, Path, Path, Path, subprocess.Popen[bytes]]:
        ready = self._dir / f"server-{index}.ready"
        log = self._dir / f"server-{index}.log"
        socket = sockets / f"server-{index}.sock"
        unix_server_url(socket)  # refuses a path too long for a socket, naming TMPDIR
        ready.unlink(missing_ok=True)  # a previous run's file must not pass for ours
        with open(log, "ab") as handle:
            process = subprocess.Popen(
                self._command(socket, ready),
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, self._key_env: self.api_key},
            )
        self._processes.append(process)
        return index, ready, log, socket, process

    def _await_ready(
        self, index: int, ready: Path, log: Path, socket: Path, process: subprocess.Popen[bytes]
    ) -> LocalServer:
        # The child writes the file atomically once it listens; polling a file is the
        # only signal a separate process gives without a pipe protocol.
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not ready.exists():
            if process.poll() is not None:
                raise GenerationError(
                    FailureReason.SERVER_START_FAILED,
                    f"local server {index} exited with {process.returncode} before it was "
                    f"ready; its log ({log}) ends: {_tail(log)}",
                )
            if time.monotonic() > deadline:
                raise GenerationError(
                    FailureReason.SERVER_START_FAILED,
                    f"local server {index} not ready after {_READY_TIMEOUT_S:.0f} s; "
                    f"its log ({log}) ends: {_tail(log)}",
                )
            time.sleep(0.02)
        announced = PolicyServer.read_ready_file(ready)
        try:
            listener = listener_pid(socket)
        except OSError:
            listener = -1
        if announced.pid != process.pid or listener not in (process.pid, None):
            raise GenerationError(
                FailureReason.SERVER_START_FAILED,
                f"local server {index} is not the process this job launched (pid "
                f"{process.pid}): its ready file names pid {announced.pid}, its socket "
                f"{socket} is listened on by {listener}",
            )
        return LocalServer(announced.url, process.pid, log, self._command(socket, ready), socket)

    def close(self) -> None:
        """SIGTERM every server's group, then SIGKILL what is left after a grace period;
        closing again (or a fleet never started) stops nothing."""
        for process in self._processes:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        for process in self._processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        self._processes.clear()
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def _tail(log: Path, lines: int = 5) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(unreadable)"
