"""``rollout-recovery serve`` as a process: ready file, stdout line, health, clean signals.

The child is read line by line (its ``serving on`` line is the synchronization point) and
runs in its own process group, which a watchdog kills if the test overruns.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serve_support import WAIT_S

from rollout_recovery.errors import InvalidArgumentError, InvalidStateError
from rollout_recovery.serve import ServeSettings
from rollout_recovery.serve._ready import read_ready_file


def _command() -> list[str]:
    script = Path(sys.executable).with_name("rollout-recovery")
    return [str(script)] if script.exists() else [sys.executable, "-m", "rollout_recovery"]


@contextlib.contextmanager
def _serve(*args: str) -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen(
        [*_command(), "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    watchdog = threading.Timer(WAIT_S, lambda: os.killpg(child.pid, signal.SIGKILL))
    watchdog.start()
    try:
        yield child
    finally:
        watchdog.cancel()
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_announces_itself_answers_and_stops_on_a_signal(
    tmp_path: Path, sig: signal.Signals
) -> None:
    ready_file = tmp_path / "ready.json"
    with _serve("--port", "0", "--ready-file", str(ready_file), "--seed", "2") as child:
        assert child.stdout is not None and child.stderr is not None
        line = child.stdout.readline()
        assert line.startswith("serving on http://127.0.0.1:"), child.stderr.read()
        ready = read_ready_file(ready_file)
        assert ready.url == line.removeprefix("serving on ").strip()
        assert ready.pid == child.pid
        assert not ready.url.endswith(":0")
        assert httpx.get(ready.url + "/health", timeout=WAIT_S).status_code == 200
        info = httpx.get(ready.url + "/weight_info", timeout=WAIT_S).json()
        assert info == {"weight_version": "0"}
        child.send_signal(sig)
        assert child.wait(WAIT_S) == 0
        assert child.stderr.read() == ""
    # The ready file leaves with the server: a parent never reads a dead server's URL.
    assert not ready_file.exists()


def test_exit_with_parent_stops_the_server_when_its_parent_is_killed(tmp_path: Path) -> None:
    ready_file = tmp_path / "ready.json"
    serve = [*_command(), "serve", "--port", "0", "--ready-file", str(ready_file)]
    # A parent that starts the server (sharing its stdout pipe with it) and is then killed.
    parent_code = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen({[*serve, '--exit-with-parent']!r})\n"
        "print('child', child.pid, flush=True)\n"
        "child.wait()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    watchdog = threading.Timer(WAIT_S, lambda: os.killpg(parent.pid, signal.SIGKILL))
    watchdog.start()
    try:
        assert parent.stdout is not None
        lines = [parent.stdout.readline(), parent.stdout.readline()]
        (child_line,) = [line for line in lines if line.startswith("child ")]
        assert any(line.startswith("serving on http://") for line in lines)
        assert read_ready_file(ready_file).pid == int(child_line.split()[1])
        parent.kill()
        parent.wait()
        # The pipe reaches its end once the orphaned server has exited too.
        assert parent.stdout.read() == ""
        assert not ready_file.exists()  # removed by a clean shutdown, not a kill
    finally:
        watchdog.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_serve_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with _serve("--port", str(port), "--ready-file", str(tmp_path / "r.json")) as child:
            assert child.wait(WAIT_S) == 1
            assert child.stderr is not None and child.stdout is not None
            assert f"cannot listen on 127.0.0.1:{port}" in child.stderr.read()
            assert child.stdout.read() == ""
    assert not (tmp_path / "r.json").exists()


def test_a_ready_file_that_is_not_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ready.json"
    path.write_text('{"url": "http://127.0.0.1:1"}')
    with pytest.raises(InvalidStateError) as refused:
        read_ready_file(path)
    assert refused.value.file == str(path)
    path.write_text("garbage")
    with pytest.raises(InvalidStateError):
        read_ready_file(path)


@pytest.mark.parametrize(
    "fields",
    [
        {"port": -1},
        {"port": 70000},
        {"port": True},
        {"host": ""},
        {"model_name": ""},
        {"seed": -1},
        {"call_latency_s": -0.1},
        {"call_latency_s": float("nan")},
        {"max_model_len": 1},
        {"max_body_bytes": -5},
        {"max_body_bytes": 10, "max_inflight_body_bytes": 9},
        {"max_connections": 0},
        {"keep_alive_timeout_s": 0.0},
        {"read_timeout_s": -1.0},
        {"write_timeout_s": float("inf")},
        {"api_key": ""},
        {"allowed_hosts": ["localhost"]},
        {"allowed_hosts": ("a/b",)},
    ],
)
def test_bad_settings_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        ServeSettings(**fields)  # type: ignore[arg-type]


def test_parent_pid_stops_the_server_when_that_process_dies_even_if_not_its_parent(
    tmp_path: Path,
) -> None:
    # The "job" is not the server's parent here: as when an operator restarts a server.
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        ready_file = tmp_path / "ready.json"
        with _serve(
            "--port", "0", "--ready-file", str(ready_file), "--parent-pid", str(job.pid)
        ) as child:
            assert child.stdout is not None
            assert child.stdout.readline().startswith("serving on http://")
            assert child.poll() is None  # the job lives: so does the server
            job.kill()
            job.wait()
            assert child.wait(WAIT_S) == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_parent_pid_of_a_job_already_gone_stops_the_server(tmp_path: Path) -> None:
    # The job died before the server could look at its parent.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with _serve("--port", "0", "--parent-pid", str(gone.pid)) as child:
        assert child.wait(WAIT_S) == 0
