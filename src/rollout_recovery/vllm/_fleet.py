"""Local vLLM servers a job starts, supervises and stops itself (``[vllm] launch = N``).

Each server is vLLM's OpenAI API server (``python -m vllm.entrypoints.openai.api_server``,
run by the ``[vllm] python`` of its own venv) under a guard (``_guard.py``) that leads the
server's own process group: the guard ends the whole group (API server, ``EngineCore``,
worker) when the job dies, SIGKILL included, or when the job stops it, so no server
outlives the job. ``servers.json`` in the run directory lists them (url, socket, the
guard's pid, which is the group id, the log file, the server's command line).

Each listens on a Unix socket (``--uds``) in a directory the fleet makes for it, which
only this user can enter (0700), never on a TCP port: a port is anyone's to bind first,
and another local user who bound the one the job had picked answered ``/health`` and was
taken as the server (``_unix_http``). A server is ready once the process listening on its
socket is in the group the job launched (``SO_PEERCRED``) and answers ``/health``; one
that exits before that fails the start with its log.

Every server runs in vLLM's dev mode (the weight routes, ``VLLM_SERVER_DEV_MODE=1``) with
this package's worker extension on its ``PYTHONPATH``, and requires the job's API key on
its generation routes (``VLLM_API_KEY``, passed in the environment, never in argv). vLLM
does not guard the dev routes (``/pause``, ``/collective_rpc``) with the key: the private
socket is what keeps them the job's.

A controller that comes back after a crash (issue 28) can prove that a server listed in
``servers.json`` is one this job launched before it adopts it: the socket's directory is
still this user's and private (:func:`require_private_dir`), and the process listening on
the socket is in the listed group (:func:`listener_pid`, ``os.getpgid``), exactly the
check :meth:`VllmFleet.start` makes (:func:`launched_by`).
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import msgspec

from .._durable import atomic_write_bytes
from .._lifecycle import Resource
from .._outcomes import FailureReason
from .._unix_http import listener_pid, private_socket_dir, require_private_dir, unix_server_url
from ..errors import GenerationError, InvalidArgumentError

if TYPE_CHECKING:  # [vllm] builds its fleet here: the section's type, for the type checker
    from ._config import VllmConfig

__all__ = [
    "EXTENSION_CLASS",
    "EXTENSION_DIR",
    "LaunchedServer",
    "VllmFleet",
    "launched_by",
    "server_command",
    "server_environment",
]

#: The directory vLLM's worker imports the extension from (put on its ``PYTHONPATH``).
EXTENSION_DIR = Path(__file__).resolve().parent / "_extension"
EXTENSION_CLASS = "rollout_recovery_vllm_extension.WeightLoader"
_GUARD = Path(__file__).resolve().parent / "_guard.py"
# How long the job waits for a guard to end its group after SIGTERM (the guard itself
# gives vLLM 20 s to shut down cleanly) before it SIGKILLs the group.
_STOP_GRACE_S = 30.0
# How often a starting server's socket and /health are tried.
_READY_POLL_S = 1.0
# How long one readiness probe may take.
_PROBE_TIMEOUT_S = 5.0
_SOCKET_DIR_PREFIX = "rollout-recovery-vllm-"


def server_command(
    config: VllmConfig,
    *,
    served_model_name: str,
    socket: str | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
) -> list[str]:
    """The vLLM launch line of one server (the guard's command), listening on the Unix
    ``socket`` (what the job launches) or on ``host:port`` (a test's own server).

    ``--enable-scale-out`` registers ``/inference/v1/generate`` (the ``vllm-generate``
    dialect); the worker extension is the weight loader of ``_sync.py``.
    """
    if (socket is None) == (port is None):
        raise InvalidArgumentError("a vLLM server listens on a socket or on a port: give one")
    where = ["--uds", socket] if socket is not None else ["--host", host, "--port", str(port)]
    command = [
        config.python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        config.model,
        "--served-model-name",
        served_model_name,
        *where,
        "--dtype",
        config.dtype,
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--enable-scale-out",
        "--worker-extension-cls",
        EXTENSION_CLASS,
    ]
    if config.max_model_len:
        command += ["--max-model-len", str(config.max_model_len)]
    return [*command, *config.extra_args]


def server_environment(config: VllmConfig, api_key: str) -> dict[str, str]:
    """The server's environment: ours, plus what vLLM needs here.

    The model comes from a local directory; anything that would try a model hub fails fast
    instead of hanging on the network.
    """
    path = os.pathsep.join(p for p in (str(EXTENSION_DIR), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gib),
        "VLLM_API_KEY": api_key,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def launched_by(socket: Path, pgid: int) -> bool:
    """Whether the process listening on ``socket`` is in process group ``pgid`` (the
    group the job launched); False when nothing listens there. Where the system does not
    name the listener, the socket's private directory is the only proof."""
    try:
        pid = listener_pid(socket)
    except OSError:
        return False
    return pid is None or _group_of(pid) == pgid


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@dataclass(frozen=True, slots=True)
class LaunchedServer:
    url: str
    #: The guard's pid: the id of the server's process group.
    pid: int
    log: Path
    command: list[str]
    socket: Path


@dataclass(slots=True)
class _Starting:
    index: int
    socket: Path
    process: subprocess.Popen[bytes]
    log: Path
    command: list[str]


class VllmFleet(Resource):
    """Starts ``config.launch`` servers (:meth:`start`, waiting until each answers
    ``/health``); :meth:`close` stops them all. See the module docstring.

    ``api_key`` is what the servers require (a random one by default); ``parent_pid`` the
    process whose death ends them (this one by default). ``log`` hears how the start goes
    (the log files, each server ready and when, and every ``progress_every_s`` while it
    waits, how long and what each log says last): vLLM takes about a minute to start on
    CPU, which must not look like a hang.
    """

    def __init__(
        self,
        servers_dir: Path,
        servers_file: Path,
        config: VllmConfig,
        *,
        served_model_name: str,
        api_key: str | None = None,
        parent_pid: int | None = None,
        log: Callable[[str], None] = lambda _: None,
        progress_every_s: float = 10.0,
    ) -> None:
        self._log = log
        self._progress_every_s = progress_every_s
        self._dir = Path(servers_dir)
        self._file = Path(servers_file)
        self._config = config
        self._name = served_model_name
        self.api_key = api_key if api_key is not None else secrets.token_urlsafe(32)
        self._parent = parent_pid if parent_pid is not None else os.getpid()
        self._processes: list[subprocess.Popen[bytes]] = []
        self._sockets: Path | None = None
        self.servers: list[LaunchedServer] = []

    def _spawn(self, index: int, sockets: Path) -> _Starting:
        socket = sockets / f"vllm-{index}.sock"
        unix_server_url(socket)  # refuses a path too long for a socket, naming TMPDIR
        log = self._dir / f"vllm-{index}.log"
        config = self._config
        command = server_command(
            _expanded(config), socket=str(socket), served_model_name=self._name
        )
        with open(log, "ab") as handle:
            handle.write(f"--- starting on {socket}: {' '.join(command)}\n".encode())
            handle.flush()
            process = subprocess.Popen(
                [
                    sys.executable,
                    str(_GUARD),
                    "--parent-pid",
                    str(self._parent),
                    "--socket",
                    str(socket),
                    "--",
                    *command,
                ],
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the guard leads the server's process group
                env=server_environment(config, self.api_key),
            )
        self._processes.append(process)
        return _Starting(index, socket, process, log, command)

    def start(self) -> list[str]:
        """Start the servers and wait until each answers; returns their urls. A server
        that fails to start stops the ones already started and raises."""
        self._config.check_launch_paths()
        self._dir.mkdir(parents=True, exist_ok=True)
        try:
            self._sockets = private_socket_dir(_SOCKET_DIR_PREFIX)
            require_private_dir(self._sockets)
            starting = [self._spawn(index, self._sockets) for index in range(self._config.launch)]
            self._log(
                f"starting {len(starting)} vLLM server(s) from {self._config.model} (about a "
                f"minute on CPU); their logs: {self._dir}/vllm-<n>.log"
            )
            self.servers = self._await_ready(starting)
        except BaseException:
            self.close()
            raise
        listing = [
            {
                "url": s.url,
                "socket": str(s.socket),
                "pid": s.pid,
                "log": str(s.log),
                "command": s.command,
                "kind": "vllm",
            }
            for s in self.servers
        ]
        atomic_write_bytes(self._file, json.dumps({"servers": listing}, indent=2).encode())
        return [server.url for server in self.servers]

    def _await_ready(self, starting: list[_Starting]) -> list[LaunchedServer]:
        """Wait until each server's socket is listened on by a process of its group and
        answers ``/health``; one that exits first, or misses the deadline, fails the job.
        Says when each is ready, and every ``progress_every_s`` how the start goes."""
        started = time.monotonic()
        deadline = started + self._config.startup_timeout_s
        said = started  # when progress was last logged
        ready: dict[int, LaunchedServer] = {}
        while len(ready) < len(starting):
            for entry in starting:
                if entry.index in ready:
                    continue
                code = entry.process.poll()
                if code is not None:
                    raise GenerationError(
                        FailureReason.SERVER_START_FAILED,
                        f"vLLM server {entry.index} exited with {code} before it was "
                        f"ready; its log ({entry.log}) ends: {_tail(entry.log)}",
                    )
                if _answers(entry):
                    url = unix_server_url(entry.socket)
                    ready[entry.index] = LaunchedServer(
                        url, entry.process.pid, entry.log, entry.command, entry.socket
                    )
                    took = time.monotonic() - started
                    self._log(f"vLLM server {entry.index} ready at {url} ({took:.0f} s)")
            if len(ready) == len(starting):
                break
            if time.monotonic() - said >= self._progress_every_s:
                said = time.monotonic()
                self._log(self._waiting(starting, ready, said - started))
            if time.monotonic() > deadline:
                raise GenerationError(
                    FailureReason.SERVER_START_FAILED,
                    f"vLLM servers not ready after {self._config.startup_timeout_s:.0f} s "
                    f"(see {self._dir})",
                )
            time.sleep(_READY_POLL_S)
        return [ready[index] for index in sorted(ready)]

    def _waiting(
        self, starting: list[_Starting], ready: dict[int, LaunchedServer], elapsed: float
    ) -> str:
        pending = next(entry for entry in starting if entry.index not in ready)
        return (
            f"waiting for vLLM: {len(ready)}/{len(starting)} ready after {elapsed:.0f} s "
            f"(of {self._config.startup_timeout_s:.0f}); {pending.log} ends: "
            f"{_tail(pending.log, lines=1)[-120:]}"
        )

    def close(self) -> None:
        """SIGTERM every guard (it shuts its server down and ends its group); SIGKILL the
        groups still alive after a grace period. Closing again stops nothing."""
        for process in self._processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        for process in self._processes:
            try:
                # A guard that exits has ended its group itself.
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # Not reaped yet, so its pid (the group's id) cannot have been reused.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._processes.clear()
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None


def _answers(entry: _Starting) -> bool:
    """Whether the process listening on ``entry``'s socket is of its group and answers
    ``/health`` (its body is never read). A listener of another group fails the start:
    only this user can bind in the socket's directory, so it is a bug or an intruder."""
    try:
        pid = listener_pid(entry.socket)
    except OSError:
        return False  # nothing listens yet
    if pid is not None and _group_of(pid) != entry.process.pid:
        raise GenerationError(
            FailureReason.SERVER_START_FAILED,
            f"vLLM server {entry.index}'s socket {entry.socket} is listened on by pid {pid}, "
            "not a process this job launched",
        )
    transport = httpx.HTTPTransport(uds=str(entry.socket))
    with (
        contextlib.suppress(httpx.HTTPError),
        httpx.Client(transport=transport, timeout=_PROBE_TIMEOUT_S) as client,
        client.stream("GET", "http://localhost/health") as response,
    ):
        return response.status_code == 200
    return False


def _expanded(config: VllmConfig) -> VllmConfig:
    """``config`` with ``~`` expanded in its paths (vLLM takes them literally)."""
    return msgspec.structs.replace(
        config,
        python=str(Path(config.python).expanduser()),
        model=str(Path(config.model).expanduser()),
    )


def _tail(log: Path, lines: int = 8) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(unreadable)"
