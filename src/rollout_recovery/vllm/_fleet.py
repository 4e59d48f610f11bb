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

Warm servers survive a controller crash (``[vllm] adopt_within_s``, issue 28): a job that
dies without a normal end leaves its servers to their guards for that lease, and the
rerun on the same run directory adopts every listed server it proves it launched
(``_adoption.py``: the private directory, the guard on its control socket, the listener in
its group, the same command and environment), hands their leases over to itself and
starts only the missing ones. A normal end, a failed run and ``rollout-recovery stop``
(a drain, then a normal end) close the fleet, which ends every server at once, adopted or
not.
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
from collections.abc import Callable, Sequence
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
from ._adoption import AdoptedGuard, claim, vllm_environment
from ._guard import kill_group

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
    #: Its place in the fleet (the ``n`` of ``vllm-<n>``).
    index: int = 0
    #: Whether this job adopted it from the job before (else it started it). Said only:
    #: the pool pushes the restored weights to every server before its first call,
    #: whatever version it names (a new pool believes no server's word on its weights).
    adopted: bool = False

    def listing(self) -> dict[str, object]:
        """Its entry in ``servers.json`` (what a rerun proves before it adopts it)."""
        return {
            "url": self.url,
            "socket": str(self.socket),
            "control": str(_control_socket(self.socket)),
            "index": self.index,
            "pid": self.pid,
            "log": str(self.log),
            "command": self.command,
            "kind": "vllm",
        }


@dataclass(slots=True)
class _Starting:
    index: int
    socket: Path
    process: subprocess.Popen[bytes]
    log: Path
    command: list[str]


class _LaunchedGuard:
    """The guard of a server this job started: its child, so it is reaped here."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.pid = process.pid
        self._process = process

    def terminate(self) -> None:
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> bool:
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill_group(self) -> None:
        # Not reaped yet, so its pid (the group's id) cannot have been reused. The guard
        # dies too, so the server's shared memory is removed here.
        kill_group(self.pid)
        self._process.wait()

    def release(self) -> None:
        pass


class VllmFleet(Resource):
    """Starts ``config.launch`` servers (:meth:`start`, waiting until each answers
    ``/health``), adopting those of the job before that it proves it launched;
    :meth:`close` stops them all. See the module docstring.

    ``api_key`` is what the servers require (a random one by default; the adopted
    servers' own when it is not given); ``parent_pid`` the process whose death ends them
    (this one by default). ``log`` hears how the start goes (the log files, each server
    adopted or ready and when, and every ``progress_every_s`` while it waits, how long and
    what each log says last): vLLM takes about a minute to start on CPU, which must not
    look like a hang.
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
        self._key_given = api_key is not None
        self.api_key = api_key if api_key is not None else secrets.token_urlsafe(32)
        self._parent = parent_pid if parent_pid is not None else os.getpid()
        self._guards: list[_LaunchedGuard | AdoptedGuard] = []
        self._sockets: Path | None = None
        self._guards_listed = False
        self.servers: list[LaunchedServer] = []

    def _command(self, socket: Path) -> list[str]:
        return server_command(
            _expanded(self._config), socket=str(socket), served_model_name=self._name
        )

    def _spawn(self, index: int, sockets: Path) -> _Starting:
        socket = sockets / f"vllm-{index}.sock"
        unix_server_url(socket)  # refuses a path too long for a socket, naming TMPDIR
        log = self._dir / f"vllm-{index}.log"
        config = self._config
        command = self._command(socket)
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
                    "--lease-s",
                    repr(config.adopt_within_s),
                    "--control",
                    str(_control_socket(socket)),
                    "--",
                    *command,
                ],
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the guard leads the server's process group
                env=server_environment(config, self.api_key),
            )
        self._guards.append(_LaunchedGuard(process))
        return _Starting(index, socket, process, log, command)

    def start(self) -> list[str]:
        """Adopt the servers of the job before that this one can prove it launched, start
        the missing ones and wait until each answers; returns their urls. A server that
        fails to start stops all the others and raises."""
        self._config.check_launch_paths()
        self._dir.mkdir(parents=True, exist_ok=True)
        try:
            adopted = self._adopt()
            taken = {server.index for server in adopted}
            missing = [index for index in range(self._config.launch) if index not in taken]
            starting = []
            if missing:
                # Always a fresh directory, never the adopted servers' (nor any other a
                # guard of the job before may still own): a new server at a live one's
                # path would take its place, and that guard remove its sockets later.
                self._sockets = private_socket_dir(_SOCKET_DIR_PREFIX)
                require_private_dir(self._sockets)
            for index in missing:
                assert self._sockets is not None
                starting.append(self._spawn(index, self._sockets))
                # Listed at once: a rerun after a kill during the start knows every guard
                # that may hold a lease (ended at once then, its server not being ready).
                self._write_listing([*adopted, *map(_launched, starting)])
            if starting:
                self._log(
                    f"starting {len(starting)} vLLM server(s) from {self._config.model} "
                    f"(about a minute on CPU); their logs: {self._dir}/vllm-<n>.log"
                )
            started = self._await_ready(starting)
            self.servers = sorted([*adopted, *started], key=lambda server: server.index)
        except BaseException:
            self.close()
            if self._guards_listed:  # all ended now: nothing listed is left to adopt
                self._file.unlink(missing_ok=True)
            raise
        self._write_listing(self.servers)
        return [server.url for server in self.servers]

    def _write_listing(self, servers: list[LaunchedServer]) -> None:
        self._guards_listed = True
        listing = [server.listing() for server in servers]
        atomic_write_bytes(self._file, json.dumps({"servers": listing}, indent=2).encode())

    def _adopt(self) -> list[LaunchedServer]:
        """The servers listed in ``servers.json`` that this job proves it launched and
        adopts (``_adoption.py``); those proven ours but unfit (another command or
        environment, no longer wanted, or adoption off) are ended at once; those not
        proven ours are left to their guards' lease."""
        wanted = self._config.adopt_within_s > 0
        adopted: list[LaunchedServer] = []
        ending: list[AdoptedGuard] = []
        for entry in _listed(self._file):
            socket, index = Path(entry.socket), entry.index
            found = claim(socket, Path(entry.control), entry.pid)
            if found is None:
                continue  # gone
            if isinstance(found, str):
                self._log(f"vLLM server {index} of the job before is not adopted: {found}")
                continue
            environment = server_environment(self._config, self.api_key)
            why = found.unfit(self._command(socket), vllm_environment(environment))
            key = found.environment.get("VLLM_API_KEY")
            if why is None and key is None:
                why = "it has no API key"
            elif why is None and key != self.api_key and (self._key_given or adopted):
                why = "it requires another API key than this job's"
            if why is None and not wanted:
                why = "[vllm] adopt_within_s is 0"
            if why is None and index >= self._config.launch:
                why = f"[vllm] launch is {self._config.launch} now"
            if why is None and any(server.index == index for server in adopted):
                why = f"another adopted server is already server {index}"
            if why is not None:
                refused = found.end()
                if refused is None:
                    self._log(f"ending vLLM server {index} of the job before: {why}")
                    ending.append(found.guard)
                else:
                    found.guard.release()
                    self._log(f"vLLM server {index} of the job before is left alone: {refused}")
                continue
            assert key is not None
            refused = found.adopt(self._config.adopt_within_s)
            if refused is not None:
                found.guard.release()
                self._log(f"vLLM server {index} of the job before is not adopted: {refused}")
                continue
            self.api_key = key
            self._guards.append(found.guard)
            url = unix_server_url(socket)
            adopted.append(
                LaunchedServer(
                    url, found.guard.pid, Path(entry.log), found.command, socket, index, True
                )
            )
            self._log(f"vLLM server {index} adopted from the job before at {url}")
        self._end(ending)
        return adopted

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
                    ready[entry.index] = server = _launched(entry)
                    took = time.monotonic() - started
                    self._log(f"vLLM server {entry.index} ready at {server.url} ({took:.0f} s)")
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
        """SIGTERM every guard, started or adopted (it shuts its server down and ends its
        group); SIGKILL the groups still alive after a grace period. Closing again stops
        nothing."""
        for guard in self._guards:
            guard.terminate()
        self._end(self._guards)
        self._guards.clear()
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None

    @staticmethod
    def _end(guards: Sequence[_LaunchedGuard | AdoptedGuard]) -> None:
        """Wait for ``guards``, already asked to end their groups, for the grace period;
        SIGKILL the groups of those still alive."""
        deadline = time.monotonic() + _STOP_GRACE_S
        for guard in guards:
            # A guard that exits has ended its group itself.
            if not guard.wait(max(0.0, deadline - time.monotonic())):
                guard.kill_group()
            guard.release()


def _launched(entry: _Starting) -> LaunchedServer:
    url = unix_server_url(entry.socket)
    return LaunchedServer(
        url, entry.process.pid, entry.log, entry.command, entry.socket, entry.index
    )


def _control_socket(socket: Path) -> Path:
    """Where the guard of the server on ``socket`` takes requests (``_guard.py``)."""
    return socket.with_suffix(".guard")


class _Listed(msgspec.Struct, frozen=True):
    """One server of ``servers.json``, as a rerun reads it to adopt it."""

    socket: str
    control: str
    index: int
    pid: int
    log: str
    kind: str


class _Listing(msgspec.Struct, frozen=True):
    servers: list[_Listed]


def _listed(servers_file: Path) -> list[_Listed]:
    """The vLLM servers of a ``servers.json`` (none when it is missing or unreadable: a
    fresh start; one written before adoption, without control sockets, is unreadable)."""
    try:
        listing = msgspec.json.decode(servers_file.read_bytes(), type=_Listing)
    except (OSError, msgspec.DecodeError):
        return []
    return [entry for entry in listing.servers if entry.kind == "vllm"]


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
