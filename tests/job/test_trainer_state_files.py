"""A trainer whose state is files (``policy.FileStateTrainer``, as the torch trainer's
safetensors and JSON) is checkpointed as those files, each as ``trainer.<name>``, and a
restore hands exactly them back; ``policy.npz`` is for trainers with arrays only.

Runs the fast numpy job with a numpy trainer that also keeps its state as files, so no
torch is needed.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from rollout_recovery.control import RunConfig
from rollout_recovery.control._checkpointing import decode_checkpoint_files
from rollout_recovery.errors import CheckpointDirectoryError, RunNotResumableError
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job
from rollout_recovery.policy import FileStateTrainer, NumpyGRPOTrainer
from rollout_recovery.rundir import CheckpointStore, LoadedCheckpoint

MakeConfig = Callable[..., RunConfig]

FILES = ("arrays.npz", "meta.json")


class FileTrainer(NumpyGRPOTrainer):
    """The numpy trainer with its state as two files; records what a restore loaded."""

    loaded: list[dict[str, bytes]] = []  # noqa: RUF012 - shared by every instance on purpose

    def state_files(self) -> dict[str, bytes]:
        state = self.state()
        buffer = io.BytesIO()
        np.savez(buffer, **{k: v for k, v in state.items() if k != "version"})
        meta = json.dumps({"version": int(state["version"])}).encode()
        return {FILES[0]: buffer.getvalue(), FILES[1]: meta}

    def load_state_files(self, files: Mapping[str, bytes]) -> None:
        FileTrainer.loaded.append(dict(files))
        with np.load(io.BytesIO(files[FILES[0]]), allow_pickle=False) as npz:
            state: dict[str, Any] = {name: npz[name] for name in npz.files}
        state["version"] = np.array(json.loads(files[FILES[1]])["version"], dtype=np.int64)
        self.load_state(state)


@pytest.fixture
def file_trainer(monkeypatch: pytest.MonkeyPatch) -> type[FileTrainer]:
    """The default components build a :class:`FileTrainer` instead of the numpy one."""
    import rollout_recovery.control._backends as backends

    FileTrainer.loaded = []
    monkeypatch.setattr(backends, "NumpyGRPOTrainer", FileTrainer)
    return FileTrainer


def _with_steps(config: RunConfig, steps: int) -> RunConfig:
    return msgspec.structs.replace(config, job=msgspec.structs.replace(config.job, steps=steps))


def test_a_file_state_trainer_is_checkpointed_as_its_files_and_restored_from_them(
    tmp_path: Path, fast_config: MakeConfig, file_trainer: type[FileTrainer]
) -> None:
    assert isinstance(FileTrainer(seed=0), FileStateTrainer)
    assert not isinstance(NumpyGRPOTrainer(seed=0), FileStateTrainer)
    out = tmp_path / "run"
    config = fast_config({"job": {"steps": 4}})
    run_job(out, config)
    store = CheckpointStore(out, keep=1)
    for checkpoint in store.committed():
        names = {path.name for path in checkpoint.directory.iterdir()}
        assert {"trainer.arrays.npz", "trainer.meta.json"} <= names, names
        assert "policy.npz" not in names
    newest = store.committed()[0].directory
    saved = {name: (newest / f"trainer.{name}").read_bytes() for name in FILES}
    assert json.loads(saved["meta.json"])["version"] == 4

    # More steps: the rerun restores the newest checkpoint through load_state_files.
    result = run_job(out, _with_steps(config, 6))
    assert result.restored is not None and result.restored.checkpoint == newest.name
    assert file_trainer.loaded == [saved]
    assert result.summary.steps == 6
    assert audit_run(out).ok


def test_a_checkpoint_of_file_state_is_refused_by_a_trainer_without_files(
    tmp_path: Path,
    fast_config: MakeConfig,
    file_trainer: type[FileTrainer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "run"
    config = fast_config({"job": {"steps": 2}})
    run_job(out, config)
    import rollout_recovery.control._backends as backends

    monkeypatch.setattr(backends, "NumpyGRPOTrainer", NumpyGRPOTrainer)
    with pytest.raises(RunNotResumableError, match="NumpyGRPOTrainer"):
        run_job(out, _with_steps(config, 4))


def test_a_checkpoint_holds_the_trainer_state_one_way_only(
    tmp_path: Path, fast_config: MakeConfig
) -> None:
    out = tmp_path / "run"
    run_job(out, fast_config({"job": {"steps": 2}}))
    checkpoint = CheckpointStore(out, keep=1).committed()[0]
    files = {path.name: path.read_bytes() for path in checkpoint.directory.iterdir()}
    files.pop("COMMITTED")
    assert "policy.npz" in files

    def loaded(changed: dict[str, bytes]) -> LoadedCheckpoint:
        return LoadedCheckpoint(checkpoint.step, checkpoint.name, checkpoint.directory, changed)

    decode_checkpoint_files(loaded(files))  # as written
    both = {**files, "trainer.model.safetensors": b"x"}
    with pytest.raises(CheckpointDirectoryError, match=r"policy\.npz or as trainer\.\*"):
        decode_checkpoint_files(loaded(both))
    neither = {name: data for name, data in files.items() if name != "policy.npz"}
    with pytest.raises(CheckpointDirectoryError, match="found neither"):
        decode_checkpoint_files(loaded(neither))
