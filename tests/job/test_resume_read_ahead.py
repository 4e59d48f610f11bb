"""A resuming job reads and checks its newest checkpoint in a thread of its own while it
builds its components (servers, trainer, model), and its restore takes that read: the
files are read and hashed once, off the path to the first step."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.control import RunConfig
from rollout_recovery.dataplane import DataPlane
from rollout_recovery.job import run_job
from rollout_recovery.job._components import JobComponents, default_components
from rollout_recovery.rundir import CheckpointStore
from rollout_recovery.rundir._checkpoint_store import CommittedCheckpoint, LoadedCheckpoint

MakeConfig = Callable[..., RunConfig]


def test_a_resume_reads_its_checkpoint_while_its_components_build(
    tmp_path: Path, fast_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    config = fast_config({"job": {"steps": 3}})
    run_job(out, config)
    newest = CheckpointStore(out, keep=config.checkpoint.keep).committed()[0]
    loads: list[tuple[str, str]] = []
    reading = threading.Event()
    load = CheckpointStore.load

    def spied(
        store: CheckpointStore, checkpoint: CommittedCheckpoint, **kwargs: Any
    ) -> LoadedCheckpoint:
        loads.append((checkpoint.name, threading.current_thread().name))
        reading.set()
        return load(store, checkpoint, **kwargs)

    monkeypatch.setattr(CheckpointStore, "load", spied)

    def components(config: RunConfig, data_plane: DataPlane) -> JobComponents[Any]:
        # The read began before the trainer is built (a bound, not a sleep: it fails).
        assert reading.wait(timeout=60), "the checkpoint was not read ahead of the build"
        return default_components(config, data_plane)

    result = run_job(out, fast_config({"job": {"steps": 4}}), components=components)
    assert result.restored is not None and result.restored.checkpoint == newest.name
    # Read once, in the read-ahead's thread; not again by the restore.
    newest_reads = [thread for name, thread in loads if name == newest.name]
    assert len(newest_reads) == 1 and newest_reads[0] != threading.main_thread().name
