"""Servers on Unix sockets (``_unix_http``): URLs, the transport, who listens, private dirs."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollout_recovery._unix_http import (
    ServerTransport,
    listener_pid,
    private_socket_dir,
    require_private_dir,
    unix_server_url,
)
from rollout_recovery.errors import InvalidArgumentError, InvalidStateError
from rollout_recovery.serve import PolicyServer, ServeSettings


@pytest.fixture
def sockets() -> Iterator[Path]:
    directory = private_socket_dir("rollout-recovery-test-")
    yield directory
    for entry in directory.iterdir():
        entry.unlink()
    directory.rmdir()


def test_a_server_on_a_socket_is_reached_by_its_url(sockets: Path) -> None:
    path = sockets / "server-0.sock"
    with PolicyServer(ServeSettings(uds=str(path))) as server:
        assert server.url == unix_server_url(path) == f"http+unix://localhost{path}"
        assert server.port == 0
        assert listener_pid(path) == os.getpid()

        async def exchange() -> list[object]:
            async with httpx.AsyncClient(transport=ServerTransport()) as client:
                health = await client.get(f"{server.url}/health")
                info = await client.get(f"{server.url}/weight_info")
                paused = await client.post(f"{server.url}/pause", params={"mode": "keep"}, json={})
                resumed = await client.post(f"{server.url}/resume", json={})
                return [health.status_code, info.json(), paused.json(), resumed.status_code]

        assert asyncio.run(exchange()) == [200, {"weight_version": "0"}, {"status": "paused"}, 200]
    assert not path.exists()  # closing removes its own socket


def test_a_killed_servers_socket_file_is_replaced_but_nothing_live_or_else(sockets: Path) -> None:
    path = sockets / "server-0.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # a socket file nobody listens on, as a SIGKILL leaves it
    with PolicyServer(ServeSettings(uds=str(path))):
        assert listener_pid(path) == os.getpid()
    taken = sockets / "taken.sock"
    taken.write_text("a user's file")
    with pytest.raises(OSError):
        PolicyServer(ServeSettings(uds=str(taken)))
    assert taken.read_text() == "a user's file"
    with PolicyServer(ServeSettings(uds=str(path))) as running:  # a live server's: kept
        with pytest.raises(OSError):
            PolicyServer(ServeSettings(uds=str(path)))
        assert listener_pid(path) == os.getpid()
        assert running.url == unix_server_url(path)


def test_nothing_listening_is_an_os_error(sockets: Path) -> None:
    with pytest.raises(OSError):
        listener_pid(sockets / "nobody.sock")

    async def call() -> None:
        async with httpx.AsyncClient(transport=ServerTransport()) as client:
            await client.get(f"{unix_server_url(sockets / 'nobody.sock')}/health")

    with pytest.raises(httpx.ConnectError):
        asyncio.run(call())


@pytest.mark.parametrize(
    "path",
    ["relative.sock", "/tmp/no-suffix", "/tmp/" + "x" * 120 + ".sock"],
    ids=["relative", "no-suffix", "too-long"],
)
def test_a_path_that_cannot_name_a_server_socket_is_refused(path: str) -> None:
    with pytest.raises(InvalidArgumentError):
        unix_server_url(path)
    with pytest.raises(InvalidArgumentError):
        ServeSettings(uds=path)


def test_a_url_naming_no_socket_is_refused() -> None:
    async def call() -> None:
        async with httpx.AsyncClient(transport=ServerTransport()) as client:
            await client.get("http+unix://localhost/tmp/no-socket-here/health")

    with pytest.raises(httpx.UnsupportedProtocol):
        asyncio.run(call())


def test_only_a_private_directory_of_this_user_passes(tmp_path: Path, sockets: Path) -> None:
    require_private_dir(sockets)
    assert (sockets.stat().st_mode & 0o777) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(InvalidStateError, match="not a private directory"):
        require_private_dir(shared)
    link = tmp_path / "link"
    link.symlink_to(sockets)
    with pytest.raises(InvalidStateError):
        require_private_dir(link)
