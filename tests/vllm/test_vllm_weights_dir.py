"""Where the job puts the weight files of ``[http] weight_sync = "vllm"`` when ``[vllm]
weights_dir`` is empty: shared memory for launched servers (on this machine: a push
touches no disk), the run directory for listed ones (they may read it elsewhere, on a
shared filesystem); a configured directory is kept."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import msgspec
import pytest

from rollout_recovery.control._config import RunConfig, config_from_builtins
from rollout_recovery.job._components import _vllm_weights_dir
from rollout_recovery.rundir import RunDirectory
from rollout_recovery.vllm._sync import SHARED_MEMORY, run_key, weights_bytes


def _config(*, launch: int, servers: tuple[str, ...] = (), weights_dir: str = "") -> RunConfig:
    config = config_from_builtins({})
    return msgspec.structs.replace(
        config,
        http=msgspec.structs.replace(config.http, weight_sync="vllm", servers=servers),
        vllm=msgspec.structs.replace(config.vllm, launch=launch, weights_dir=weights_dir),
    )


@pytest.mark.skipif(not SHARED_MEMORY.is_dir(), reason="no /dev/shm")
def test_launched_servers_get_the_runs_shared_memory_removed_when_the_job_ends(
    tmp_path: Path,
) -> None:
    run = RunDirectory(tmp_path / "run")
    expected = SHARED_MEMORY / f"rollout-recovery-{os.getuid()}" / run_key(run.root)
    with _vllm_weights_dir(run, _config(launch=1)) as config:
        assert Path(config.vllm.weights_dir) == expected
        assert expected.is_dir() and (expected.stat().st_mode & 0o777) == 0o700
        (expected / "weights-v0000000001.safetensors").write_bytes(b"w")
    assert not expected.exists()
    assert not run.servers_dir.exists()  # nothing of the weights in the run directory


def test_listed_servers_read_the_run_directory_and_a_configured_directory_is_kept(
    tmp_path: Path,
) -> None:
    run = RunDirectory(tmp_path / "run")
    listed = _config(launch=0, servers=("http://vllm0:8000",))
    with _vllm_weights_dir(run, listed) as config:
        assert config.vllm.weights_dir == str(run.servers_dir / "weights")
    chosen = str(tmp_path / "mine")
    with _vllm_weights_dir(run, _config(launch=1, weights_dir=chosen)) as config:
        assert config.vllm.weights_dir == chosen


@pytest.mark.skipif(not SHARED_MEMORY.is_dir(), reason="no /dev/shm")
def test_a_model_shared_memory_has_no_room_for_writes_to_the_run_directory_and_says_why(
    tmp_path: Path,
) -> None:
    """Two files of the model must fit (Docker's /dev/shm is 64 MB): a full tmpfs would
    fail every push. The model here is a header claiming 2**40 parameters."""
    model = tmp_path / "model"
    model.mkdir()
    header = json.dumps({"w": {"dtype": "F32", "shape": [2**20, 2**20], "data_offsets": [0, 0]}})
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())
    run = RunDirectory(tmp_path / "run")
    config = _config(launch=1)
    config = msgspec.structs.replace(
        config, vllm=msgspec.structs.replace(config.vllm, model=str(model))
    )
    notices: list[str] = []
    with _vllm_weights_dir(run, config, notices.append) as resolved:
        assert resolved.vllm.weights_dir == str(run.servers_dir / "weights")
    assert len(notices) == 1 and "MB free" in notices[0]
    assert not (SHARED_MEMORY / f"rollout-recovery-{os.getuid()}" / run_key(run.root)).exists()


def test_a_models_weights_file_is_sized_from_its_headers_in_the_push_dtype(
    tmp_path: Path,
) -> None:
    header = json.dumps(
        {
            "__metadata__": {"format": "pt"},
            "a": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
            "b": {"dtype": "F32", "shape": [5], "data_offsets": [48, 68]},
        }
    )
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())
    assert weights_bytes(tmp_path, "bfloat16") == 17 * 2
    assert weights_bytes(tmp_path, "float32") == 17 * 4
    assert weights_bytes(tmp_path / "none", "bfloat16") == 0
