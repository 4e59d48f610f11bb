"""``TorchWeights.write_safetensors``: the file a vLLM server loads, cast straight into a
mapped file, is the file ``safetensors_bytes`` builds in memory (what safetensors reads
back: names, dtypes, shapes, values, the version)."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load

from rollout_recovery.errors import InvalidArgumentError
from rollout_recovery.llm._weights import TorchWeights

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def written(weights: TorchWeights, dtype: str | None) -> bytes:
    with tempfile.TemporaryFile() as file:
        weights.write_safetensors(file, dtype)
        file.seek(0)
        return file.read()


shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3)


@settings(max_examples=25, deadline=None)
@given(
    tensors=st.dictionaries(
        st.from_regex(r"[a-z]{1,3}(\.[a-z0-9]{1,3}){0,2}", fullmatch=True),
        st.tuples(shapes, st.sampled_from(DTYPES)),
        max_size=6,
    ),
    dtype=st.sampled_from([None, "float32", "bfloat16", "float16"]),
    version=st.integers(0, 10**9),
)
def test_the_mapped_file_is_the_in_memory_one(
    tensors: dict[str, tuple[list[int], torch.dtype]], dtype: str | None, version: int
) -> None:
    generator = torch.Generator().manual_seed(0)
    weights = TorchWeights(
        version,
        {n: torch.randn(s, generator=generator).to(kind) for n, (s, kind) in tensors.items()},
    )
    data, reference = written(weights, dtype), weights.safetensors_bytes(dtype)
    ours, theirs = load(data), load(reference)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype
        assert torch.equal(ours[name], theirs[name])
    assert TorchWeights.from_safetensors_bytes(data).version == version


def test_a_file_reads_back_through_safe_open_as_the_worker_reads_it(tmp_path: Path) -> None:
    weights = TorchWeights(3, {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)})
    path = tmp_path / "w.safetensors"
    with path.open("w+b") as file:
        weights.write_safetensors(file, "bfloat16")
    with safe_open(str(path), framework="pt") as handle:
        assert handle.metadata() == {"weight_version": "3"}
        assert handle.get_tensor("w").dtype == torch.bfloat16
        assert torch.equal(handle.get_tensor("w").float(), weights.tensors["w"])


def test_a_dtype_it_cannot_write_is_refused_before_the_file_is_touched() -> None:
    weights = TorchWeights(0, {"i": torch.arange(3)})
    with tempfile.TemporaryFile() as file:
        with pytest.raises(InvalidArgumentError, match="'i'"):
            weights.write_safetensors(file)
        assert file.tell() == 0 and not file.read()
    with pytest.raises(InvalidArgumentError, match="dtype must be"):
        written(TorchWeights(0, {}), "int8")


def test_no_room_for_the_file_is_an_oserror_before_the_mapping_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full tmpfs: the reservation fails (a failed push), nothing faults on the map."""

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    monkeypatch.setattr(mmap, "mmap", None)  # reaching it would be the bug
    with pytest.raises(OSError) as error:
        written(TorchWeights(1, {"w": torch.zeros(4, 4)}), None)
    assert error.value.errno == errno.ENOSPC


_ON_SMALL_TMPFS = """
import errno, sys, torch
from rollout_recovery.llm._weights import TorchWeights
try:
    with open(sys.argv[1] + "/w.safetensors", "w+b") as file:
        TorchWeights(1, {"w": torch.zeros(1024, 1024)}).write_safetensors(file)
except OSError as error:
    sys.exit(0 if error.errno == errno.ENOSPC else 3)
sys.exit(4)
"""


@pytest.mark.skipif(
    shutil.which("unshare") is None
    or subprocess.run(
        ["unshare", "-rm", "mount", "-t", "tmpfs", "none", tempfile.gettempdir()],
        capture_output=True,
    ).returncode
    != 0,
    reason="no tmpfs of its own in a user and mount namespace here",
)
def test_a_file_larger_than_a_real_tmpfs_fails_with_enospc_not_sigbus(tmp_path: Path) -> None:
    """4 MB into a 1 MB tmpfs (in a mount namespace of its own): without the reservation
    the process dies of SIGBUS writing the mapping."""
    script = f'mount -t tmpfs -o size=1m none "$1" && exec "{sys.executable}" -c "$2" "$1"'
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", str(tmp_path), _ON_SMALL_TMPFS],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr.decode()[-2000:])


@settings(max_examples=25, deadline=None)
@given(
    shape=shapes,
    dtype=st.sampled_from([None, "float32", "bfloat16"]),
    leftover=st.binary(max_size=2048),
)
def test_a_file_holding_an_older_files_bytes_is_written_whole(
    shape: list[int], dtype: str | None, leftover: bytes
) -> None:
    """The vLLM sync writes a version into the superseded version's file (its pages
    reused): whatever it held, longer or shorter, the result is the file alone."""
    weights = TorchWeights(7, {"w": torch.randn(shape), "b": torch.ones(3)})
    with tempfile.TemporaryFile() as file:
        file.write(leftover)
        file.seek(0)
        weights.write_safetensors(file, dtype)
        file.seek(0)
        assert file.read() == written(weights, dtype)


@pytest.mark.skipif(not hasattr(mmap, "MAP_POPULATE"), reason="Linux only")
def test_the_mapping_faults_its_pages_in_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """One page fault per 4 KB as the cast reaches it was most of a SmolLM2 file's write
    on a loaded machine; the mapping asks for all its pages up front."""
    flags: list[int] = []
    real = mmap.mmap

    def recording(fileno: int, length: int, **kwargs: int) -> mmap.mmap:
        flags.append(kwargs.get("flags", mmap.MAP_SHARED))
        return real(fileno, length, **kwargs)

    monkeypatch.setattr(mmap, "mmap", recording)
    written(TorchWeights(1, {"w": torch.zeros(64, 64)}), "bfloat16")
    assert flags and all(f & mmap.MAP_POPULATE and f & mmap.MAP_SHARED for f in flags)


class _Files:
    """A ``SnapshotFiles`` of one directory: each version's file written in place, what
    holds its pages kept weakly (as the vLLM sync keeps it)."""

    def __init__(self, directory: Path, dtype: str = "float32", fail: bool = False) -> None:
        self.directory, self.dtype, self.fail = directory, dtype, fail
        self.holders: dict[int, weakref.ref[object]] = {}

    def path(self, version: int) -> Path:
        return self.directory / f"v{version}.safetensors"

    def place(self, version: int, write: Callable[[BinaryIO], object]) -> None:
        if self.fail:
            raise OSError(errno.ENOSPC, "No space left on device")
        with self.path(version).open("w+b") as file:
            self.holders[version] = weakref.ref(write(file))


@settings(max_examples=25, deadline=None)
@given(
    tensors=st.dictionaries(
        st.from_regex(r"[a-z]{1,3}(\.[a-z0-9]{1,3}){0,2}", fullmatch=True), shapes, max_size=6
    ),
    version=st.integers(0, 10**9),
)
def test_a_snapshot_captured_into_its_file_is_that_file_and_training_does_not_reach_it(
    tensors: dict[str, list[int]], version: int
) -> None:
    generator = torch.Generator().manual_seed(0)
    live = {name: torch.randn(shape, generator=generator) for name, shape in tensors.items()}
    with tempfile.TemporaryDirectory() as directory:
        files = _Files(Path(directory))
        weights = TorchWeights.capture_into(files, version, live.items())
        assert weights.version == version
        data = files.path(version).read_bytes()
        assert data == written(TorchWeights(version, live), None)  # the file, byte for byte
        kept = {name: t.clone() for name, t in live.items()}
        for tensor in live.values():
            tensor.add_(1.0)  # training goes on in place
        assert weights.tensors.keys() == kept.keys()
        assert all(torch.equal(t, kept[name]) for name, t in weights.tensors.items())
        # Views of the file, not copies.
        assert {t.untyped_storage().nbytes() for t in weights.tensors.values()} <= {len(data)}
        # What holds the file's pages lives exactly as long as a view of it does.
        held = [t.view(-1)[:1] for t in weights.tensors.values()]
        del weights
        if held:
            assert files.holders[version]() is not None
        del held
        assert files.holders[version]() is None


_WRITE_INTO_A_SNAPSHOT = """
import sys, tempfile, torch
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from test_weights_file import _Files
from rollout_recovery.llm._weights import TorchWeights
with tempfile.TemporaryDirectory() as directory:
    weights = TorchWeights.capture_into(_Files(Path(directory)), 1, {"w": torch.ones(8)}.items())
    weights.tensors["w"].add_(1.0)
sys.exit(3)
"""


def test_a_write_into_a_snapshot_that_is_its_file_kills_the_writer_not_the_snapshot() -> None:
    """The snapshot's views map the file read-only: a bug writing into one is a crash
    (the job's recovery takes over), never a server or checkpoint given other weights."""
    done = subprocess.run(
        [sys.executable, "-c", _WRITE_INTO_A_SNAPSHOT, str(Path(__file__).parent)],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGSEGV, (done.returncode, done.stderr.decode()[-2000:])


def test_a_cast_file_or_one_without_room_leaves_the_snapshot_a_copy(tmp_path: Path) -> None:
    """A bf16 server's file is a cast, not the fp32 snapshot; a file that cannot be
    written is the push's failure, not the snapshot's: both are ``capture``'s copies."""
    live = {"w": torch.randn(4, 4)}
    cast = _Files(tmp_path, dtype="bfloat16")
    full = _Files(tmp_path, fail=True)
    for files in (cast, full):
        weights = TorchWeights.capture_into(files, 2, live.items())
        assert torch.equal(weights.tensors["w"], live["w"])
        assert weights.tensors["w"].data_ptr() != live["w"].data_ptr()
        assert weights.tensors["w"].untyped_storage().nbytes() == 64  # its own copy
    assert not list(tmp_path.iterdir())  # the push writes the cast file


def test_an_uncast_file_is_written_without_a_mapping_and_a_reused_one_without_a_reservation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tensors written in their own dtype go straight from their memory into the file:
    no mapping faulted in and torn down; a file that has its pages (a superseded
    version's, rewritten) is not reserved again."""
    weights = TorchWeights(4, {"w": torch.randn(64, 64), "b": torch.ones(3)})
    reserved: list[int] = []
    real = os.posix_fallocate

    def counting(fd: int, offset: int, length: int) -> None:
        reserved.append(length)
        real(fd, offset, length)

    with tempfile.TemporaryFile() as file:
        weights.write_safetensors(file, "bfloat16")  # a cast: through a mapping
        monkeypatch.setattr(os, "posix_fallocate", counting)
        monkeypatch.setattr(mmap, "mmap", None)  # reaching it would be the bug
        weights.write_safetensors(file, "float32")  # larger than the file: reserved
        weights.write_safetensors(file, None)  # its pages are there: not reserved
        file.seek(0)
        assert file.read() == weights.safetensors_bytes()
    assert len(reserved) == 1
