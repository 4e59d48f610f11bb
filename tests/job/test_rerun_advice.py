""" "Rerun the same command to resume" is printed only where a rerun can succeed (issue 15,
items 5 and 6).

A run whose history was truncated, whose SQLite store is corrupt or torn, whose
checkpoints are another job's, or whose checkpoint holds a step that can no longer train
stops with "this run cannot continue", says why and what would let it, and never with the
rerun advice; rerunning indeed fails the same way. Each error class says which kind it is
(``rerun_resumes``), and the command line prints the advice from that alone.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery import errors
from rollout_recovery.control import RunConfig
from rollout_recovery.errors import RunNotResumableError, StepShortfallError
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job

Cli = Callable[..., subprocess.CompletedProcess[str]]
ReadJsonl = Callable[[Path], list[dict[str, Any]]]

ADVICE = "rerun the same command to resume"
STOPPED = "error: the run stopped: RunNotResumableError: this run cannot continue: "


def _truncate_history(out: Path) -> None:
    events = out / "events.jsonl"
    os.truncate(events, events.stat().st_size // 2)


def _garble_store_header(out: Path) -> None:
    store = out / "dataplane.sqlite"
    data = bytearray(store.read_bytes())
    data[:100] = b"\xff" * 100
    store.write_bytes(bytes(data))


def _tear_store(out: Path) -> None:
    os.truncate(out / "dataplane.sqlite", 1000)


def _another_jobs_checkpoints(out: Path) -> None:
    # job.toml edited by hand to another seed: the checkpoints are the old job's.
    job = out / "job.toml"
    text = job.read_text()
    assert "seed = 0\n" in text
    job.write_text(text.replace("seed = 0\n", "seed = 5\n"))


DAMAGE: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "truncated-history": (
        _truncate_history,
        ["events.jsonl is", "shorter than committed checkpoints synced it to"],
    ),
    "corrupt-store": (
        _garble_store_header,
        ["the data plane cannot be opened", "dataplane.sqlite", "Restore the data plane"],
    ),
    "torn-store": (_tear_store, ["the data plane cannot be opened", "malformed"]),
    "another-jobs-checkpoints": (
        _another_jobs_checkpoints,
        ["no checkpoint in", "belongs to another job: $.job.seed: 0 != 5"],
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_run_that_cannot_continue_says_why_without_the_rerun_advice(
    finished_run: tuple[Path, RunConfig], run_cli: Cli, damage: str
) -> None:
    out, _ = finished_run
    break_it, reasons = DAMAGE[damage]
    break_it(out)
    # More steps, so a run that could continue would have work to do.
    args = ["--out", str(out), "--plain"]
    job = out / "job.toml"
    job.write_text(job.read_text().replace("steps = 10\n", "steps = 12\n"))

    outputs = [run_cli(args) for _ in range(2)]

    for result in outputs:
        assert result.returncode == 1, result.stdout
        assert STOPPED in result.stdout, result.stdout
        for reason in reasons:
            assert reason in result.stdout, result.stdout
        assert ADVICE not in result.stdout
        assert "Traceback" not in result.stdout
    # Rerunning did fail the same way: the advice would have been wrong.
    assert outputs[0].stdout == outputs[1].stdout


# -- item 5: a checkpoint whose step can no longer train -----------------------------------


def test_a_restored_step_that_cannot_train_says_what_would_let_it_continue(
    tmp_path: Path,
    fault_config: Callable[..., RunConfig],
    write_config: Callable[..., Path],
    run_cli: Cli,
) -> None:
    """Every attempt fails and no round is retried: prompts are dropped until a step would
    be left with fewer groups than ``job.min_step_fraction`` allows, which is refused
    before that drop is recorded. Three of a step's four prompts are dropped, legally
    under a fraction of 0.25; a rerun that raises the fraction to 0.5 (an operational
    setting) restores a step that can never train: refused, naming the setting and the
    value that lets it continue. With that value the run continues and passes the audit."""
    out = tmp_path / "run"
    failing = {"attempt_failure_rate": 1.0}
    shape = {"job": {"steps": 3, "min_step_fraction": 0.25}, "retry": {"max_rounds": 1}}
    with pytest.raises(StepShortfallError) as caught:
        run_job(out, fault_config(failing, shape))
    # The refused drop was the step's fourth: three are recorded, one group could train.
    assert caught.value.available == 0 and caught.value.required == 1

    raised = {"job": {"steps": 3, "min_step_fraction": 0.5}, "retry": {"max_rounds": 4}}
    args = ["--out", str(out), "--plain", "--config", str(write_config(raised, faults_off=True))]
    refused = [run_cli(args) for _ in range(2)]
    for result in refused:
        assert result.returncode == 1, result.stdout
        assert STOPPED in result.stdout, result.stdout
        assert "with 3 of its 4 prompts dropped" in result.stdout
        assert "Lowering job.min_step_fraction (an operational setting) to 0.25" in result.stdout
        assert ADVICE not in result.stdout
    with pytest.raises(RunNotResumableError) as restored:
        run_job(out, fault_config({}, raised))
    assert "job.min_step_fraction" in restored.value.remedy

    lowered = {"job": {"steps": 3, "min_step_fraction": 0.25}, "retry": {"max_rounds": 4}}
    result = run_job(out, fault_config({}, lowered))
    assert result.restored is not None and result.summary.steps == 3
    report = audit_run(out)
    assert report.ok and report.complete, report.violations
    assert report.counts["dropped"] >= 3


# -- the classes -------------------------------------------------------------------------

#: A rerun of the same command fails the same way: say what to change instead.
RERUN_FAILS = [
    errors.ConfigError,
    errors.JobMismatchError,
    errors.NotARunDirectoryError,
    errors.RunDirectoryLockedError,
    errors.RunNotResumableError,
    errors.StepShortfallError,
    errors.NoValidRowsError,
    errors.TrainingDivergedError,
]
#: Transient: the same command resumes from the last committed checkpoint.
RERUN_RESUMES = [
    errors.LivenessError,
    errors.StorageFullError,
    errors.DataPlaneBusyError,
    errors.GenerationError,
    errors.BarrierTimeoutError,
    errors.FinalizationUnknownError,
    errors.StagingInventoryError,
]


@pytest.mark.parametrize("cls", RERUN_FAILS, ids=lambda cls: cls.__name__)
def test_errors_a_rerun_would_repeat_say_so(cls: type[errors.RolloutRecoveryError]) -> None:
    assert cls.rerun_resumes is False


@pytest.mark.parametrize("cls", RERUN_RESUMES, ids=lambda cls: cls.__name__)
def test_transient_errors_keep_the_rerun_advice(cls: type[errors.RolloutRecoveryError]) -> None:
    assert cls.rerun_resumes is True
