"""The ``/dev/shm/psm_*`` segments of a server our code SIGKILLs are removed, and only those.

vLLM's shm_broadcast queues are ``multiprocessing.shared_memory`` segments (~200 MB each)
unlinked by their creator on a clean exit; a SIGKILL of the server's group (the guard
after its grace, the job's fleet after its own) leaves them mapped by no one. The guard
reads which segments the group maps before it asks the server to end (the API process may
be gone after that, and with it the proof), and after the kill unlinks those that still
name the same file and that no live process maps. The real-vLLM check is in
``tests/integration/test_vllm_server.py``; here the parsing, the choice, and the guard's end
with a stand-in server that maps a segment and dies without unlinking it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_recovery.vllm import _guard
from rollout_recovery.vllm._adoption import AdoptedGuard
from rollout_recovery.vllm._fleet import _LaunchedGuard
from rollout_recovery.vllm._guard import (
    group_segments,
    remove_segments,
    segments_in_maps,
    segments_to_remove,
)

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(
    not SHM.is_dir() or not Path("/proc/self/maps").exists(), reason="Linux /dev/shm and /proc"
)

MAPS = """\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f000c000000 rw-s 00000000 00:1a 1234                       /dev/shm/psm_8dcb4b8c
7f000c000000-7f0010000000 rw-s 00000000 00:1a 1234                       /dev/shm/psm_8dcb4b8c
7f0010000000-7f0011000000 rw-s 00000000 00:1a 99                         /dev/shm/psm_0ld (deleted)
7f0011000000-7f0011001000 rw-s 00000000 00:1a 77                         /dev/shm/sem.mp-48gpkc7d
7f0011001000-7f0012000000 r--s 00000000 00:1a 78                         /dev/shm/w-v1.safetensors
7f0012000000-7f0012001000 rw-s 00000000 00:1a 79                         /dev/shm/psm_x/nested
7f0012001000-7f0013000000 r-xp 00000000 fd:01 4242                       /usr/lib/libc.so.6
7f0013000000-7f0014000000 rw-s 00000000 103:0a 5                         /dev/shm/psm_c30069ec
"""


def test_the_maps_give_the_psm_segments_with_their_device_and_inode() -> None:
    """Only ``psm_`` segments directly in /dev/shm, each once; an unlinked one (its name
    may be another segment's by now) and another program's files are left out."""
    assert segments_in_maps(MAPS) == {
        ("/dev/shm/psm_8dcb4b8c", os.makedev(0, 0x1A), 1234),
        ("/dev/shm/psm_c30069ec", os.makedev(0x103, 0x0A), 5),
    }
    assert segments_in_maps("") == set()
    assert segments_in_maps("garbage\n7f00-7f01 rw-s 0 zz:zz x /dev/shm/psm_a\n") == set()


def test_only_segments_still_the_same_file_and_mapped_by_no_one_are_chosen() -> None:
    owned = {
        ("/dev/shm/psm_free", 1, 10),  # ours, unmapped: removed
        ("/dev/shm/psm_shared", 1, 11),  # another live process maps it: kept
        ("/dev/shm/psm_reused", 1, 12),  # the name is another file's now: kept
        ("/dev/shm/psm_gone", 1, 13),  # unlinked already (vLLM's clean exit)
    }
    present = {"/dev/shm/psm_free": (1, 10), "/dev/shm/psm_shared": (1, 11)}
    present["/dev/shm/psm_reused"] = (1, 99)
    still_mapped = {("/dev/shm/psm_shared", 1, 11)}
    assert segments_to_remove(owned, still_mapped, present) == ["/dev/shm/psm_free"]
    # Mapped under a path that no longer names it is still mapped: the file is what counts.
    only_free_mapped = {("/dev/shm/psm_x", 1, 10)}
    assert segments_to_remove(owned, only_free_mapped, present) == ["/dev/shm/psm_shared"]


# A stand-in server: maps two fresh segments (as vLLM's EngineCore does), says their
# names, and dies of SIGTERM without unlinking them, as a killed engine does.
_SERVER = """
import mmap, os, signal, sys
names = sys.argv[1:]
maps = []
for name in names:
    fd = os.open("/dev/shm/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 4096)
    maps.append(mmap.mmap(fd, 4096))
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
print("mapped", flush=True)
while True:
    signal.pause()
"""


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Two segment names of this test's own, removed whatever happens."""
    chosen = [f"psm_rrtest{secrets.token_hex(4)}" for _ in range(2)]
    yield chosen
    for name in chosen:
        (SHM / name).unlink(missing_ok=True)


def _server(names: list[str]) -> subprocess.Popen[str]:
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, *names],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert server.stdout is not None and server.stdout.readline() == "mapped\n"
    return server


def test_a_killed_groups_segments_are_removed_but_not_one_another_process_maps(
    names: list[str],
) -> None:
    server = _server(names)
    try:
        owned = group_segments(server.pid)
        assert {path for path, _, _ in owned} == {f"/dev/shm/{name}" for name in names}
        # This process maps the second one too: it is not the server's to remove.
        with open(SHM / names[1], "r+b") as handle:
            kept = mmap.mmap(handle.fileno(), 4096)
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            assert remove_segments(owned, server.pid) == [f"/dev/shm/{names[0]}"]
            kept.close()
        assert not (SHM / names[0]).exists()
        assert (SHM / names[1]).exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_nothing_is_removed_while_the_group_lives(
    names: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_guard, "_EXIT_WAIT_S", 0.0)
    server = _server(names)
    try:
        assert remove_segments(group_segments(server.pid), server.pid) == []
        assert all((SHM / name).exists() for name in names)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_the_guard_removes_the_segments_of_a_server_that_exits_on_sigterm_without_them(
    names: list[str],
) -> None:
    """The server's process is gone after the SIGTERM, so the guard must have read its
    segments before: a guard that looks only at the survivors finds none."""
    guard = subprocess.Popen(
        [
            sys.executable,
            _guard.__file__,
            *("--parent-pid", str(os.getpid()), "--grace-s", "30"),
            "--",
            *(sys.executable, "-c", _SERVER, *names),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert guard.stdout is not None and guard.stdout.readline() == "mapped\n"
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(timeout=60) == 0
        assert [name for name in names if (SHM / name).exists()] == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(guard.pid, signal.SIGKILL)
        guard.wait()


@pytest.mark.parametrize("kind", ["launched", "adopted"])
def test_a_group_the_job_sigkills_after_its_grace_leaves_no_segments(
    names: list[str], kind: str
) -> None:
    """The fleet SIGKILLs a guard's group that did not end in time: the guard dies with
    it, so the fleet removes the server's segments (the stand-in plays guard and server)."""
    server = _server(names)
    guard = _LaunchedGuard(server) if kind == "launched" else AdoptedGuard(server.pid)
    try:
        guard.kill_group()
        assert [name for name in names if (SHM / name).exists()] == []
    finally:
        guard.release()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
