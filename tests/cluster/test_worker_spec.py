"""The Ray worker is built from the job's own config sections by the job's own builders
(issue 16: "one build(config) serves the job and the Ray worker, no restated worker
spec"). Needs no Ray."""

from __future__ import annotations

import dataclasses
import typing

from rollout_recovery._settings import Section
from rollout_recovery.cluster._worker import WorkerSpec
from rollout_recovery.control import load_config
from rollout_recovery.policy import NumpyGRPOTrainer, TaskSet
from rollout_recovery.rollout import SimulatedAgentBackend
from rollout_recovery.rollout._faults import FaultSettings

# What a worker needs that is not a config section: which backend, where it stages, the
# job's seed, and what the job resolves (the trainer's vocabulary, the servers' key).
NOT_SECTIONS = {"kind", "shards", "seed", "vocab_size", "api_key"}


def test_the_worker_spec_holds_config_sections_not_copies_of_their_fields() -> None:
    hints = typing.get_type_hints(WorkerSpec)
    for field in dataclasses.fields(WorkerSpec):
        if field.name in NOT_SECTIONS:
            continue
        assert isinstance(hints[field.name], type) and issubclass(hints[field.name], Section), (
            f"WorkerSpec.{field.name} restates a config field: hold its section instead"
        )


def test_the_job_and_a_worker_build_the_same_task_set_and_episode() -> None:
    config = load_config(None)
    snapshot = NumpyGRPOTrainer(seed=0).weights()
    built = SimulatedAgentBackend.from_config(
        seed=config.job.seed,
        task=config.task,
        generation=config.generation,
        faults=FaultSettings(),
        initial_weights=snapshot,
        data_plane=None,
        workers=1,
    )
    tasks = TaskSet.from_config(config.task, seed=config.job.seed)
    assert [tasks[i] for i in range(8)] == [built._task.task_set[i] for i in range(8)]
    assert built._task.thinking_calls == config.task.thinking_calls
