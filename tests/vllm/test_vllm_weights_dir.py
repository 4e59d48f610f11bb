"""Where the job puts the weight files of ``[http] weight_sync = "vllm"`` when ``[vllm]
weights_dir`` is empty: shared memory for launched servers (on this machine: a push
touches no disk), the run directory for listed ones (they may read it elsewhere, on a
shared filesystem); a configured directory is kept."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from rollout_recovery.control._config import RunConfig, config_from_builtins
from rollout_recovery.job._components import _vllm_weights_dir
from rollout_recovery.rundir import RunDirectory
from rollout_recovery.vllm._sync import SHARED_MEMORY, run_key


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
