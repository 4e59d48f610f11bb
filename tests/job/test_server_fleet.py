"""Launched ``serve`` processes listen where only this user can reach them (issue 24 item 10).

A loopback port is anyone's to bind: once a launched server died, another local user who
bound its port was taken for it (the job's key, its weight pushes, every call). Launched
servers listen on Unix sockets in a directory only this user can enter, and the fleet
takes a server as started only once its ready file and its socket's listener both name
the process it launched.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from process_support import alive, ready_job

from rollout_recovery._unix_http import (
    ServerTransport,
    listener_pid,
    require_private_dir,
    unix_server_url,
)
from rollout_recovery.errors import GenerationError, InvalidArgumentError
from rollout_recovery.job._server_fleet import LAUNCHED_API_KEY_ENV, LocalServerFleet

# How long a server restarted by hand may take to listen: generous, for a loaded machine.
READY_S = 60.0


def _fleet(run: Path, count: int = 2) -> LocalServerFleet:
    run.mkdir(parents=True, exist_ok=True)
    return LocalServerFleet(run, count, seed=0, call_latency_s=0.0, model="m")


def test_launched_servers_listen_on_sockets_only_this_user_can_reach(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path / "run")
    with fleet:
        urls = fleet.start()
        listing = json.loads((tmp_path / "run" / "servers.json").read_text())["servers"]
        sockets = {Path(listed["socket"]).parent for listed in listing}
        assert len(sockets) == 1
        (directory,) = sockets
        info = directory.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
        require_private_dir(directory)
        for url, listed, server in zip(urls, listing, fleet.servers, strict=True):
            assert url == listed["url"] == unix_server_url(listed["socket"])
            assert listener_pid(listed["socket"]) == server.pid == listed["pid"]
            command = listed["restart_command"]
            assert command[command.index("--uds") + 1] == listed["socket"]
            assert "--port" not in command and "--host" not in command

        async def health() -> list[int]:
            key = {"Authorization": f"Bearer {fleet.api_key}"}
            async with httpx.AsyncClient(transport=ServerTransport(), headers=key) as client:
                return [(await client.get(f"{url}/health")).status_code for url in urls]

        assert asyncio.run(health()) == [200, 200]
    assert not directory.exists()  # the sockets go with the fleet


def test_a_server_restarted_by_hand_takes_its_socket_back(tmp_path: Path) -> None:
    """The restart command of ``servers.json`` (an operator's, or a test's) binds the same
    socket, replacing the killed server's socket file."""
    fleet = _fleet(tmp_path / "run", count=1)
    with fleet:
        fleet.start()
        (server,) = fleet.servers
        os.killpg(server.pid, signal.SIGKILL)
        (tmp_path / "run" / "servers" / "server-0.ready").unlink()
        restarted = subprocess.Popen(
            server.restart_command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, LAUNCHED_API_KEY_ENV: fleet.api_key},
        )
        try:
            ready = tmp_path / "run" / "servers" / "server-0.ready"
            # Polling a file: the only signal another process gives without a pipe.
            started = time.monotonic()
            while not ready.exists():
                assert restarted.poll() is None, "the restarted server exited"
                assert time.monotonic() - started < READY_S
                time.sleep(0.02)
            assert listener_pid(server.socket) == restarted.pid
            transport = httpx.HTTPTransport(uds=str(server.socket))
            with httpx.Client(transport=transport) as client:
                key = {"Authorization": f"Bearer {fleet.api_key}"}
                assert client.get("http://localhost/health", headers=key).status_code == 200
        finally:
            os.killpg(restarted.pid, signal.SIGKILL)
            restarted.wait()


def test_a_ready_file_naming_another_process_fails_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken as started only when the ready file and the socket's listener name the
    process the fleet launched."""
    from rollout_recovery.serve import PolicyServer

    real = PolicyServer.read_ready_file

    def forged(path: str | os.PathLike[str]) -> object:
        ready = real(path)
        return type(ready)(url=ready.url, pid=ready.pid + 1)

    monkeypatch.setattr(PolicyServer, "read_ready_file", staticmethod(forged))
    fleet = _fleet(tmp_path / "run", count=1)
    with pytest.raises(GenerationError, match="not the process this job launched"), fleet:
        fleet.start()
    assert not (tmp_path / "run" / "servers.json").exists()


JOB = """
import sys, threading
from pathlib import Path
from rollout_recovery.job._server_fleet import LocalServerFleet
with LocalServerFleet(Path(sys.argv[1]), 2, seed=0, call_latency_s=0.0, model="m") as fleet:
    fleet.start()
    print("ready", flush=True)
    threading.Event().wait()
"""


def test_a_sigkilled_job_leaves_no_server_and_no_socket_directory(tmp_path: Path) -> None:
    """The servers see their job die (``--parent-pid``), stop, remove their sockets, and
    the last one out removes the directory."""
    run = tmp_path / "run"
    run.mkdir()
    with ready_job(JOB, str(run)) as job:
        listing = json.loads((run / "servers.json").read_text())["servers"]
        (sockets,) = {Path(listed["socket"]).parent for listed in listing}
        pids = [int(listed["pid"]) for listed in listing]
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        # Polling the OS's own state: no event to wait on for other processes.
        started = time.monotonic()
        while sockets.exists() or any(alive(pid) for pid in pids):
            assert time.monotonic() - started < READY_S, "servers or sockets left behind"
            time.sleep(0.05)


def test_a_temporary_directory_too_deep_for_a_socket_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket's path holds 107 bytes: a deeper TMPDIR is refused before any server
    starts, saying what to change."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    fleet = _fleet(tmp_path / "run", count=1)
    with pytest.raises(InvalidArgumentError, match="TMPDIR"), fleet:
        fleet.start()
    assert not list(deep.iterdir())  # its socket directory is gone with it
