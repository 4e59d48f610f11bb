"""Checkpoint files given as their parts (``_durable.FileParts``, the snapshot's sidecar):
written one after another, never joined, hashed for the manifest as they are written.

A checkpoint saved from parts is the one saved from the joined bytes, file and manifest
alike (so checkpoints written either way load the same), a damaged one is refused naming
the file, and a save killed while it walks the parts leaves the previous checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_recovery import _durable
from rollout_recovery._crashpoints import CRASH_AT_ENV
from rollout_recovery._durable import FileParts
from rollout_recovery.errors import CheckpointDirectoryError
from rollout_recovery.rundir import CheckpointStore, LoadedCheckpoint

NAME = "rollout_recovery.sidecar"


class Parts:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def parts(self) -> Iterator[bytes]:
        yield from self.chunks


def test_parts_are_file_parts() -> None:
    assert isinstance(Parts([]), FileParts)
    assert not isinstance(b"bytes", FileParts)


def accept(loaded: LoadedCheckpoint) -> int:
    return loaded.step


@settings(max_examples=40, deadline=None)
@given(chunks=st.lists(st.binary(max_size=40), max_size=2100), limit=st.integers(1, 64))
def test_a_file_saved_from_parts_is_the_one_saved_from_its_bytes(
    tmp_path_factory: pytest.TempPathFactory, chunks: list[bytes], limit: int
) -> None:
    """Any parts (empty ones, more than one ``writev`` takes), any short writes: the same
    file and the same ``COMMITTED`` manifest as the joined bytes."""
    root = tmp_path_factory.mktemp("parts")
    whole = CheckpointStore(root / "whole", keep=1)
    parted = CheckpointStore(root / "parted", keep=1)
    real_writev = os.writev

    def short_writev(descriptor: int, buffers: list[memoryview]) -> int:
        # The kernel may write less than asked: at most ``limit`` bytes of the first buffer.
        first = next((buffer for buffer in buffers if len(buffer)), b"")
        return real_writev(descriptor, [first[:limit]])

    whole_dir = whole.save(1, {NAME: b"".join(chunks)})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_durable.os, "writev", short_writev)
        parted_dir = parted.save(1, {NAME: Parts(chunks)})
    assert (parted_dir / NAME).read_bytes() == b"".join(chunks)
    assert (parted_dir / "COMMITTED").read_bytes() == (whole_dir / "COMMITTED").read_bytes()


def test_a_damaged_file_saved_from_parts_is_refused_naming_it(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    store.save(1, {NAME: Parts([b"one", b"-", b"two"])})
    path = store.save(2, {NAME: Parts([b"three", b"-", b"four"])})
    data = bytearray((path / NAME).read_bytes())
    data[3] ^= 0x01
    (path / NAME).write_bytes(bytes(data))
    with pytest.raises(CheckpointDirectoryError, match=f"{NAME}: sha256 mismatch"):
        store.load(store.committed()[0])
    result = store.newest_loadable(accept)
    assert result is not None
    loaded, step, skipped = result
    assert step == 1 and loaded.files[NAME] == b"one-two"
    assert len(skipped) == 1
    assert skipped[0].reason.startswith(f"{NAME}: sha256 mismatch")


KILLED_MID_WRITE = """
import os, signal, sys
from pathlib import Path
from rollout_recovery.rundir import CheckpointStore

class Parts:
    def parts(self):
        for index in range(64):
            if index == 32:
                print("killing", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            yield bytes([index]) * 4096

CheckpointStore(Path(sys.argv[1]), keep=3).save(2, {"rollout_recovery.sidecar": Parts()})
"""


@pytest.mark.slow
def test_a_save_killed_while_writing_parts_leaves_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    store.save(1, {NAME: Parts([b"one"])})
    env = {key: value for key, value in os.environ.items() if key != CRASH_AT_ENV}
    child = subprocess.run(
        [sys.executable, "-c", KILLED_MID_WRITE, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert child.stdout == "killing\n"
    assert [checkpoint.step for checkpoint in store.committed()] == [1]
    result = store.newest_loadable(accept)
    assert result is not None and result[1] == 1 and result[2] == []
    store.save(3, {NAME: Parts([b"three"])})
    assert not [entry.name for entry in store.directory.iterdir() if entry.name.startswith(".")]
