"""Every backend of the registry runs the default job (issue 25, item 3).

The job is built from the registry alone (``control.BACKENDS``: the learner of the
backend's pairing and the backend's own builder), so a backend that is registered but
cannot be built, or that cannot run the job it pairs with, fails here. Each backend gets a
small, fast config (``FAST_BY_BACKEND``); a backend added to the registry without one
fails ``test_every_registered_backend_has_a_fast_config``. The HTTP job launches its own
``rollout-recovery serve`` process; Ray's starts a local cluster (the ``ray`` marker, and
skipped without the ``[ray]`` extra); the transformers job trains the tiny Llama (skipped
without the ``[llm]`` extra).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import FAST, merge_sections

from rollout_recovery.control import BACKENDS
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job

STEPS = 2
#: The shape every backend's job shares: a few steps of a few small groups.
SMALL: dict[str, dict[str, Any]] = {
    "job": {"steps": STEPS, "prompts_per_step": 2, "generations_per_prompt": 2},
    "checkpoint": {"every_steps": 1},
}
#: What each backend needs on top of ``SMALL`` (``FAST``'s job, its own pairing).
FAST_BY_BACKEND: Mapping[str, dict[str, dict[str, Any]]] = {
    "simulated": {},
    "http": {
        "generation": {"backend": "http", "attempt_deadline_s": 10.0},
        "http": {"launch_servers": 1, "probe_interval_s": 0.05},
    },
    "ray": {
        "generation": {"backend": "ray", "attempt_deadline_s": 10.0},
        "ray": {
            "actors_per_node": 1,
            "cpus_per_actor": 0.01,
            "data_shards": 1,
            "cpus_per_shard": 0.01,
            # A live actor slow to answer on a loaded machine is not a death.
            "ping_timeout_s": 30.0,
        },
        # Starting Ray workers is slow on a loaded 2-core machine.
        "liveness": {"step_timeout_s": 300.0},
    },
    "transformers": {
        "generation": {"backend": "transformers", "attempt_deadline_s": 30.0},
        "trainer": {"kind": "torch", "threads": 1},
        "task": {"kind": "emit_token", "dataset_size": 16, "max_tokens": 2},
    },
}
#: What a backend's job needs installed, and what marks its test.
NEEDS: Mapping[str, tuple[str | None, list[pytest.MarkDecorator]]] = {
    "ray": ("ray", [pytest.mark.ray]),
    "transformers": ("transformers", []),
}


def test_every_registered_backend_has_a_fast_config() -> None:
    assert set(FAST_BY_BACKEND) == set(BACKENDS)


def _cases() -> list[Any]:
    cases = []
    for name in FAST_BY_BACKEND:
        _, marks = NEEDS.get(name, (None, []))
        cases.append(pytest.param(name, marks=marks, id=name))
    return cases


@pytest.mark.parametrize("backend", _cases())
def test_every_registered_backend_runs_the_default_job(
    backend: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    extra, _ = NEEDS.get(backend, (None, []))
    if extra is not None and importlib.util.find_spec(extra) is None:
        pytest.skip(f"the {backend} backend needs {extra}")
    sections = merge_sections(FAST, SMALL, FAST_BY_BACKEND[backend])
    if backend == "transformers":
        # The tiny Llama, built once for the session outside the user's cache.
        cache = tmp_path_factory.getbasetemp() / "models"
        sections = merge_sections(sections, {"model": {"cache_dir": str(cache)}})
    config = config_from_builtins(sections)
    assert config.generation.backend == backend
    result = run_job(tmp_path / "run", config)
    assert result.summary.steps == STEPS
    report = audit_run(tmp_path / "run")
    assert report.ok, report
