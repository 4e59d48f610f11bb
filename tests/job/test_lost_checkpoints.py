"""A run directory that lost its checkpoints is refused, not silently restarted (issue 15,
item 2).

Any trace of an earlier run (checkpoint records in the history, trained steps in
``metrics.jsonl``, a resume in ``run_log.jsonl``, rows in the data plane) without a usable
checkpoint stops ``run`` with what was found; the directory is left byte for byte as it
was (only the lock file names the refused process).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery._settings import config_to_toml
from rollout_recovery.control import RunConfig
from rollout_recovery.errors import RunNotResumableError
from rollout_recovery.job import run_job
from rollout_recovery.rundir import RunDirectory

Cli = Callable[..., subprocess.CompletedProcess[str]]
Snapshot = Callable[[Path], dict[str, Any]]

# What each kind of evidence keeps (everything else of the finished run is removed), and
# how the refusal names it.
EVIDENCE: dict[str, tuple[set[str], str]] = {
    "everything": (
        {"events.jsonl", "metrics.jsonl", "dataplane.sqlite", "run_log.jsonl"},
        "found: events.jsonl (",
    ),
    "history": ({"events.jsonl"}, "found: events.jsonl ("),
    "metrics": ({"metrics.jsonl"}, "found: metrics.jsonl (trained steps)"),
    "data-plane": ({"dataplane.sqlite"}, "found: the data plane ("),
    "run-log": ({"run_log.jsonl"}, "found: run_log.jsonl (resumes)"),
}
# A finished run's files a fresh start would also leave or make (not evidence).
KEPT_ANYWAY = {"job.toml", ".lock", ".checkpoints.lock", "reward.png"}


def _without_checkpoints(out: Path, keep: set[str]) -> None:
    for path in sorted(out.rglob("*"), reverse=True):
        relative = path.relative_to(out)
        if relative.parts[0] == "checkpoints":
            path.rmdir() if path.is_dir() else path.unlink()
        elif path.is_file() and path.name not in keep | KEPT_ANYWAY:
            path.unlink()
    if "run_log.jsonl" in keep:
        # An earlier restart: the log only ever gains lines (the finished run has a start).
        RunDirectory(out).append_run_log("resume", step=4, checkpoint="step_000004")


def _without_lock(snapshot: dict[str, Any]) -> dict[str, Any]:
    # The refused job took the directory's lock (and wrote its pid there) first.
    return {name: value for name, value in snapshot.items() if name != ".lock"}


@pytest.mark.parametrize("evidence", list(EVIDENCE))
def test_a_run_without_its_checkpoints_is_refused_with_what_was_found_and_nothing_changes(
    finished_run: tuple[Path, RunConfig], dir_snapshot: Snapshot, evidence: str
) -> None:
    out, config = finished_run
    keep, named = EVIDENCE[evidence]
    _without_checkpoints(out, keep)
    before = dir_snapshot(out)

    with pytest.raises(RunNotResumableError) as caught:
        run_job(out, config)

    error = caught.value
    assert "holds an earlier run but no usable checkpoint" in str(error)
    assert named in str(error)
    assert "Nothing was deleted" in error.remedy
    assert error.rerun_resumes is False
    assert _without_lock(dir_snapshot(out)) == _without_lock(before)


def test_the_cli_refuses_it_without_the_rerun_advice(
    finished_run: tuple[Path, RunConfig], run_cli: Cli, dir_snapshot: Snapshot
) -> None:
    out, _ = finished_run
    _without_checkpoints(out, EVIDENCE["everything"][0])
    before = dir_snapshot(out)

    result = run_cli(["--out", str(out), "--plain"])

    assert result.returncode == 1, result.stdout
    assert "RunNotResumableError: this run cannot continue" in result.stdout
    assert "found: events.jsonl" in result.stdout
    assert "starting" not in result.stdout  # never "starting a new run"
    assert "rerun the same command" not in result.stdout
    assert "Traceback" not in result.stdout
    assert _without_lock(dir_snapshot(out)) == _without_lock(before)


def test_a_directory_whose_first_start_was_killed_before_its_first_checkpoint_starts_fresh(
    tmp_path: Path, fast_config: Callable[..., RunConfig]
) -> None:
    """The refusal is for evidence of work: a start killed before the bootstrap checkpoint
    (its job.toml and start record written, nothing else) is no earlier run."""
    config = fast_config({"job": {"steps": 2}})
    out = tmp_path / "run"
    out.mkdir()
    (out / "job.toml").write_text(config_to_toml(config))
    RunDirectory(out).append_run_log("start", step=0)

    result = run_job(out, config)
    assert result.restored is None and result.summary.steps == 2
