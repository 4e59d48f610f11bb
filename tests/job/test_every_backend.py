"""Every backend of the registry runs the default job (issue 25, item 3), and every
pairing of a trainer and a task it serves runs too.

The job is built from the registry alone (``control.BACKENDS``: the learner of the
backend's pairing and the backend's own builder), so a backend that is registered but
cannot be built, or that cannot run the job it pairs with, fails here. Each backend gets a
small, fast config (``FAST_BY_BACKEND``); a backend added to the registry without one
fails ``test_every_registered_backend_has_a_fast_config``. The HTTP job launches its own
``rollout-recovery serve`` process; Ray's starts a local cluster (the ``ray`` marker, and
skipped without the ``[ray]`` extra); the transformers job trains the tiny Llama (skipped
without the ``[llm]`` extra). A pairing beyond a backend's default config gets its own
(``OTHER_PAIRINGS``, or where it runs instead: ``ELSEWHERE``); a pairing added to the
registry without either fails ``test_every_registered_pairing_is_run``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import FAST, merge_sections

from rollout_recovery.control import BACKENDS, RunConfig
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
#: Pairings (backend, trainer, task) besides the backends' defaults above, and their configs.
OTHER_PAIRINGS: Mapping[tuple[str, str, str], dict[str, dict[str, Any]]] = {
    # A dataset of the user's and a reward function of theirs (issue 27): written by the
    # test into its directory (``_with_user_files``).
    ("transformers", "torch", "dataset"): merge_sections(
        FAST_BY_BACKEND["transformers"],
        {"task": {"kind": "dataset", "max_tokens": 2}},
    ),
}
#: Pairings not run here: they need what a unit test does not start, and run there.
ELSEWHERE: Mapping[tuple[str, str, str], str] = {
    ("http", "torch", "emit_token"): "vLLM servers: tests/integration/llm/test_vllm_llm_job.py",
}
#: What a backend's job needs installed, and what marks its test.
NEEDS: Mapping[str, tuple[str | None, list[pytest.MarkDecorator]]] = {
    "ray": ("ray", [pytest.mark.ray, pytest.mark.slow]),
    "transformers": ("transformers", []),
}


def test_every_registered_backend_has_a_fast_config() -> None:
    assert set(FAST_BY_BACKEND) == set(BACKENDS)


def _kinds(sections: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """The trainer and task kinds of ``sections`` (the defaults where they name none)."""
    defaults = RunConfig()
    trainer = sections.get("trainer", {}).get("kind", defaults.trainer.kind)
    return trainer, sections.get("task", {}).get("kind", defaults.task.kind)


def test_every_registered_pairing_is_run() -> None:
    registered = {
        (name, pairing.trainer, pairing.task)
        for name, entry in BACKENDS.items()
        for pairing in entry.pairs
    }
    defaults = {(name, *_kinds(sections)) for name, sections in FAST_BY_BACKEND.items()}
    assert defaults.isdisjoint(OTHER_PAIRINGS) and set(OTHER_PAIRINGS).isdisjoint(ELSEWHERE)
    assert registered == defaults | set(OTHER_PAIRINGS) | set(ELSEWHERE)


def _cases() -> list[Any]:
    cases = []
    for name, sections in FAST_BY_BACKEND.items():
        _, marks = NEEDS.get(name, (None, []))
        cases.append(pytest.param(name, sections, marks=marks, id=name))
    for (name, trainer, task), sections in OTHER_PAIRINGS.items():
        _, marks = NEEDS.get(name, (None, []))
        cases.append(pytest.param(name, sections, marks=marks, id=f"{name}-{trainer}-{task}"))
    return cases


def _with_user_files(sections: dict[str, Any], directory: Path) -> dict[str, Any]:
    """A dataset task's sections with a small dataset and a reward file of the user's."""
    if sections.get("task", {}).get("kind") != "dataset":
        return sections
    pytest.importorskip("datasets")
    from dataset_support import write_dataset, write_reward  # tests/llm's helpers

    data = write_dataset(directory, "jsonl")
    reward = write_reward(directory)
    user = {"task": {"path": str(data)}, "reward": {"function": f"{reward}:score"}}
    return merge_sections(sections, user)


@pytest.mark.parametrize(("backend", "own"), _cases())
def test_every_registered_backend_runs_the_default_job(
    backend: str,
    own: dict[str, dict[str, Any]],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    extra, _ = NEEDS.get(backend, (None, []))
    if extra is not None and importlib.util.find_spec(extra) is None:
        pytest.skip(f"the {backend} backend needs {extra}")
    sections = _with_user_files(merge_sections(FAST, SMALL, own), tmp_path)
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
