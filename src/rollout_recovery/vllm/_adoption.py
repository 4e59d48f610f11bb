"""Proving that a server listed in ``servers.json`` is one this run launched, then adopting it.

A job that died without a normal end (SIGKILL, a crash) leaves its launched servers
running for ``[vllm] adopt_within_s`` (their guards' lease, ``_guard.py``). The rerun on
the same run directory adopts each listed server only after proving, from what the
kernel says rather than from what the file says:

1. the socket's directory is still this user's and private (0700): nobody else can have
   bound the sockets in it;
2. the process listening on the guard's control socket is the listed guard (its
   ``SO_PEERCRED`` pid is the listed pid, this user's, and it answers ``hello`` as that
   guard while a pidfd opened before the exchange shows it alive): the guard is alive,
   and the listed pid is not a reused one. From here on the server is *ours*, and every
   later signal or request goes to it through that pidfd;
3. the process listening on the server's socket is in the guard's group;
4. the guard runs the very command this job would launch for that socket, with the same
   vLLM environment (``/proc/<guard>/cmdline`` and ``environ``): a changed ``[vllm]`` or
   model is not adopted;
5. the server answers ``/health``.

Then it hands the lease over (``adopt LEASE_S`` on the control socket: the guard now
watches this job). A kill -9 between the proof and the hand-over (crash point
``adopt.before_handover``) leaves the server on the dead job's lease, for the next rerun.

The guard hands a server over only once the job holding it has died (or to that job
itself): a server held by a live job, such as the run whose run directory this one
copied, is refused (``held``) and left alone like one that is not proven ours.

A server that fails 1 or 2 is left alone: nothing proves it is ours, so no signal may be
sent to a pid that may be another process now; its own guard ends it when its lease
lapses. A server that passes 2 but fails a later step is ours but unfit: it is
told to ``end`` at once (it would otherwise hold its memory until its lease lapses), and a
new one is started.

The adopted servers hold weights of the dead job (any version): the pool knows nothing of
a new backend's servers and pushes the restored weights to each before its first call.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

import httpx

from .._crashpoints import crash_point
from .._unix_http import listener_pid, require_private_dir
from ..errors import InvalidStateError
from ._guard import kill_group

__all__ = ["AdoptedGuard", "Claim", "claim", "vllm_environment"]

# How long one exchange with a guard's control socket, or a /health probe, may take.
_EXCHANGE_TIMEOUT_S = 5.0
# The environment variables that shape what a launched server is (the key is checked apart).
_SHAPING = ("VLLM_SERVER_DEV_MODE", "VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE")


def vllm_environment(environment: dict[str, str]) -> dict[str, str | None]:
    """What of a server's environment must match for it to be adopted: the variables
    that shape vLLM, and where its worker imports the weight loader from (the first entry
    of its ``PYTHONPATH``: another install of this package may load weights otherwise)."""
    shaping: dict[str, str | None] = {name: environment.get(name) for name in _SHAPING}
    shaping["extension"] = environment.get("PYTHONPATH", "").split(os.pathsep)[0]
    return shaping


class AdoptedGuard:
    """The guard of an adopted server, through a pidfd (it is not this job's child): a
    signal or a wait through it can never reach a later process that reuses the pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = os.pidfd_open(pid)

    def alive(self) -> bool:
        if self._fd is None:
            return False
        ready, _, _ = select.select([self._fd], [], [], 0)
        return not ready

    def terminate(self) -> None:
        if self._fd is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._fd, signal.SIGTERM)

    def wait(self, timeout: float) -> bool:
        """Whether the guard has exited within ``timeout`` seconds."""
        if self._fd is None:
            return True
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout))
        return bool(ready)

    def kill_group(self) -> None:
        """SIGKILL the group of a guard still alive (so its pid is still its group's id),
        removing the server's shared memory (``_guard.kill_group``: the guard dies too)."""
        if self.alive():
            kill_group(self.pid)
            self.wait(_EXCHANGE_TIMEOUT_S)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(slots=True)
class Claim:
    """A listed server whose guard is proven ours (steps 1 and 2): :meth:`unfit` checks
    the rest, then :meth:`adopt` or :meth:`end`. Each exchange with the guard is a
    connection of its own, proven again to reach the same guard: the guard answers one
    short request at a time, and is not kept waiting while the rest is checked."""

    server_socket: Path
    control: Path
    guard: AdoptedGuard
    #: The guard's environment (the server's: the guard passes it on unchanged).
    environment: dict[str, str]
    #: The command the guard runs (after its ``--``).
    command: list[str]

    def unfit(self, command: list[str], environment: dict[str, str | None]) -> str | None:
        """Why this server may not be adopted by a job that would launch ``command`` with
        ``environment`` (:func:`vllm_environment`), or None (steps 3 to 5)."""
        try:
            listener = listener_pid(self.server_socket)
        except OSError:
            return "nothing listens on its socket"
        if listener is not None and _group_of(listener) != self.guard.pid:
            return f"its socket is listened on by pid {listener}, outside its group"
        if self.command != command:
            return "it runs another command (the [vllm] settings or the model changed)"
        if vllm_environment(self.environment) != environment:
            return (
                "it runs with another vLLM environment ([vllm] kv_cache_gib, or this "
                "package's install, changed)"
            )
        transport = httpx.HTTPTransport(uds=str(self.server_socket))
        try:
            with httpx.Client(transport=transport, timeout=_EXCHANGE_TIMEOUT_S) as client:
                status = client.get("http://localhost/health").status_code
        except httpx.HTTPError as error:
            return f"/health failed: {type(error).__name__}"
        return None if status == 200 else f"/health answered {status}"

    def adopt(self, lease_s: float) -> str | None:
        """Hand the lease over: the guard now watches this process. Why not (it is held
        by a live job, or has ended meanwhile), or None once it is adopted."""
        crash_point("adopt.before_handover")
        answer = self._ask(f"adopt {lease_s!r}")
        return None if answer == ["adopted", str(self.guard.pid)] else _refusal(answer)

    def end(self) -> str | None:
        """Ask the guard to end its group now (it shuts the server down); why it will
        not (it is held by a live job, or has ended), or None."""
        answer = self._ask("end")
        return None if answer == ["ending"] else _refusal(answer)

    def _ask(self, request: str) -> list[str] | None:
        if not self.guard.alive():
            return None  # its pid may be another process's now: not even connected to
        found = _ask(self.control, self.guard.pid, request)
        return None if isinstance(found, str) else found


def _refusal(answer: list[str] | None) -> str:
    if answer == ["held"]:
        return "a live job holds it (a run on a copy of this run directory?)"
    return "it has ended"


def _ask(control: Path, pid: int, request: str) -> list[str] | str:
    """The guard's answer (its words) to ``request`` on ``control``, or why there is none;
    only the process ``pid`` of this user is asked (``SO_PEERCRED``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        try:
            connection.settimeout(_EXCHANGE_TIMEOUT_S)
            connection.connect(str(control))
            raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            peer, uid, _gid = struct.unpack("3i", raw)
            if peer != pid or uid != os.getuid():
                return f"its control socket is held by pid {peer}, not its listed guard {pid}"
            connection.sendall(f"{request}\n".encode())
            return connection.recv(256).decode("ascii", "replace").split()
        except OSError as error:
            return f"its guard does not answer ({type(error).__name__}: it has ended)"


def claim(socket_path: Path, control: Path, pid: int) -> Claim | str | None:
    """The claim on the listed server (``socket_path``, guarded by ``pid`` listening on
    ``control``), why it cannot be proven ours (steps 1 and 2 of the module docstring), or
    None when it is gone (its guard removed its control socket: the job before ended
    normally, or the lease lapsed)."""
    if not os.path.lexists(control):
        return None
    try:
        require_private_dir(socket_path.parent)
        if control.parent != socket_path.parent:
            return "its control socket is outside its socket's directory"
    except (OSError, InvalidStateError) as error:
        return f"its socket directory is not private to this user: {error}"
    try:
        guard = AdoptedGuard(pid)
    except OSError:
        return "its guard has ended"
    # The pidfd's process, alive from before the exchange to after it, is the one that
    # answered as pid: two live processes never share a pid. (Opened after, it could be a
    # process that reused the pid of a guard that had just exited.)
    answer = _ask(control, pid, "hello")
    if isinstance(answer, str) or not guard.alive() or answer != ["guard", str(pid)]:
        guard.release()
        return answer if isinstance(answer, str) else f"pid {pid} does not answer as a guard"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        guard.release()
        return "its guard has ended"
    arguments = [part.decode(errors="surrogateescape") for part in argv]
    command = arguments[arguments.index("--") + 1 :] if "--" in arguments else []
    environment = dict(
        part.decode(errors="surrogateescape").partition("=")[::2] for part in environ if part
    )
    return Claim(socket_path, control, guard, environment, command)


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None

