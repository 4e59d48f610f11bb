"""The Ray worker is built from the job's own config sections by the job's own builders
(issue 16: "one build(config) serves the job and the Ray worker, no restated worker
spec"). Needs no Ray."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from rollout_recovery._settings import Section
from rollout_recovery.cluster._worker import WorkerSpec
from rollout_recovery.control import load_config
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.policy import NumpyGRPOTrainer, TaskSet
from rollout_recovery.rollout import DigitTask, FaultsConfig, SimulatedAgentBackend

# The directory's conftest starts a Ray cluster for the module.
pytestmark = pytest.mark.slow

# What a worker needs that is not a config section: which backend, where it stages, the
# job's seed, the episodes the job's task built (shipped, so a worker runs any task), and
# what the job resolves (the trainer's vocabulary, the servers' key).
NOT_SECTIONS = {"kind", "shards", "seed", "episodes", "vocab_size", "api_key"}


def test_the_worker_spec_holds_config_sections_not_copies_of_their_fields() -> None:
    hints = typing.get_type_hints(WorkerSpec)
    for field in dataclasses.fields(WorkerSpec):
        if field.name in NOT_SECTIONS:
            continue
        assert isinstance(hints[field.name], type) and issubclass(hints[field.name], Section), (
            f"WorkerSpec.{field.name} restates a config field: hold its section instead"
        )


def test_a_simulated_worker_runs_the_episodes_the_job_built() -> None:
    config = load_config(None)
    episodes = DigitTask(TaskSet.from_config(config.task, seed=config.job.seed), config.task)
    built = SimulatedAgentBackend(
        config.generation,
        faults=FaultsConfig.only(),
        episodes=episodes,
        seed=config.job.seed,
        initial_weights=NumpyGRPOTrainer(seed=0).weights(),
        data_plane=MemoryDataPlane(),
        workers=1,
    )
    assert built._task is episodes
    assert len(built.worker_status()) == 1
