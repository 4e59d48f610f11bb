"""A restore refuses a checkpoint written under other reward settings than the
controller's (``CaptureRewardSettings.require_compatible``, called by
``ControllerCheckpoints.verify``): the rows finalized after the resume would be rewarded otherwise
than the rows of the same run before it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_recovery.control import Controller, RunConfig
from rollout_recovery.dataplane import SqliteDataPlane
from rollout_recovery.errors import JobMismatchError
from rollout_recovery.history import AuditTrail
from rollout_recovery.job._components import default_components
from rollout_recovery.rewards import CaptureRewardSettings
from rollout_recovery.rundir import CheckpointStore, LoadedCheckpoint, RunDirectory


@pytest.fixture
def resumed(
    finished_run: tuple[Path, RunConfig],
) -> Iterator[tuple[RunConfig, LoadedCheckpoint, dict[str, Controller]]]:
    """The newest checkpoint of a finished run (written under the default settings), and a
    controller over the run per reward settings: ``default`` and ``penalized``."""
    out, config = finished_run
    run = RunDirectory(out)
    plane = SqliteDataPlane(run.data_plane_file)
    trail = AuditTrail(run)
    parts = default_components(config, plane)
    penalized = CaptureRewardSettings.from_configs(
        penalties={"penalize_duplicated_reasoning": True}
    )
    store = CheckpointStore(out, keep=config.checkpoint.keep)
    controllers = {
        name: Controller(
            config=config,
            dataset=parts.dataset,
            backend=parts.backend,
            trainer=parts.trainer,
            data_plane=plane,
            history=trail,
            checkpoint_store=store,
            reward_settings=settings,
        )
        for name, settings in (("default", None), ("penalized", penalized))
    }
    loaded = store.load(store.committed()[0])
    try:
        yield config, loaded, controllers
    finally:
        asyncio.run(parts.backend.aclose())
        trail.close()
        plane.close()


def test_a_checkpoint_of_other_reward_settings_is_refused_naming_them(
    resumed: tuple[RunConfig, LoadedCheckpoint, dict[str, Controller]],
) -> None:
    _, loaded, controllers = resumed
    with pytest.raises(JobMismatchError) as caught:
        controllers["penalized"].checkpoints.verify(loaded)
    assert caught.value.differences == ["penalties.penalize_duplicated_reasoning"]
    assert str(loaded.directory) in str(caught.value)
    assert "capture reward settings differ from" in str(caught.value)


def test_the_same_reward_settings_verify(
    resumed: tuple[RunConfig, LoadedCheckpoint, dict[str, Controller]],
) -> None:
    _, loaded, controllers = resumed
    verified = controllers["default"].checkpoints.verify(loaded)
    assert verified.name == loaded.directory.name
