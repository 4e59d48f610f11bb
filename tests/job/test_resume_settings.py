"""Operational settings may change when a run resumes; the job's identity may not (issue
15, item 3).

Identity is what changes the training (group size, prompts per step, dataset, seed,
rewards, policy); operational settings are server addresses, timeouts, liveness,
checkpoint cadence, output, and how many steps to run. A resume with other operational
settings goes on, records each change in ``run_log.jsonl`` (and the history's
``run_started``), prints it and makes ``job.toml`` say what the run now runs with. A
rerun with another identity is refused naming the field, and nothing changes.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from serve_process import running_serve

from rollout_recovery.control import RunConfig, load_config
from rollout_recovery.errors import JobMismatchError
from rollout_recovery.history import audit_run
from rollout_recovery.history._trail_reader import read_records
from rollout_recovery.history.records import RunStarted
from rollout_recovery.job import run_job

Cli = Callable[..., subprocess.CompletedProcess[str]]
ReadJsonl = Callable[[Path], list[dict[str, Any]]]
Snapshot = Callable[[Path], dict[str, Any]]


def _step_of(line: str) -> int | None:
    if line.startswith("step ") and "/" in line:
        return int(line.split("(", 1)[1].split("/")[0])
    return None


def _run_started(out: Path) -> list[RunStarted]:
    return [r for _, r in read_records(out / "events.jsonl") if isinstance(r, RunStarted)]


@pytest.mark.slow
def test_a_killed_run_resumes_with_more_steps_and_raised_timeouts_and_says_so(
    tmp_path: Path,
    write_config: Callable[..., Path],
    run_cli_until: Cli,
    run_cli: Cli,
    read_jsonl: ReadJsonl,
) -> None:
    out = tmp_path / "run"
    first = write_config({"job": {"steps": 12}})
    killed = run_cli_until(
        ["--out", str(out), "--config", str(first), "--plain"],
        stop=lambda line, lines: (_step_of(line) or 0) >= 3,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout

    second = write_config(
        {
            "job": {"steps": 15},
            "generation": {"attempt_deadline_s": 7.5},
            "liveness": {"step_timeout_s": 90.0, "train_step_timeout_s": 45.0},
        }
    )
    resumed = run_cli(["--out", str(out), "--config", str(second), "--plain"])

    assert resumed.returncode == 0, resumed.stdout
    changes = [
        "$.job.steps: 12 != 15",
        "$.generation.attempt_deadline_s: 2.0 != 7.5",
        "$.liveness.step_timeout_s: 60.0 != 90.0",
        "$.liveness.train_step_timeout_s: 60.0 != 45.0",
    ]
    for change in changes:
        assert f"config changed on resume: {change}" in resumed.stdout
    assert "of 15 steps left" in resumed.stdout
    runs = read_jsonl(out / "run_log.jsonl")
    assert [run["event"] for run in runs] == ["start", "resume"]
    assert runs[-1]["config_changes"] == changes
    assert _run_started(out)[-1].config_changes == changes
    # job.toml says what the run now runs with: the same command resumes it from now on.
    assert load_config(out / "job.toml") == load_config(second)
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == list(range(15))
    report = audit_run(out)
    assert report.ok and report.complete, report.violations
    assert report.audited_through_step == 15


def test_extending_job_steps_continues_a_finished_run(
    tmp_path: Path, fast_config: Callable[..., RunConfig], read_jsonl: ReadJsonl
) -> None:
    out = tmp_path / "run"
    done = run_job(out, fast_config({"job": {"steps": 4}}))
    assert done.summary.steps == 4 and done.restored is None

    extended = run_job(out, fast_config({"job": {"steps": 7}}))

    assert extended.restored is not None and extended.restored.step == 4
    assert extended.summary.steps == 7
    assert extended.config_changes == ["$.job.steps: 4 != 7"]
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == list(range(7))
    runs = read_jsonl(out / "run_log.jsonl")
    assert [(run["event"], run["step"]) for run in runs] == [("start", 0), ("resume", 4)]
    report = audit_run(out)
    assert report.ok and report.complete, report.violations
    assert report.counts["prompts_taken"] == 7 * 4


# A value of each kind of identity field that differs from the fast job's.
IDENTITY_CHANGES = [
    ("job", "generations_per_prompt", 3),
    ("job", "prompts_per_step", 5),
    ("job", "staleness_window", 1),
    ("task", "dataset_size", 512),
    ("policy", "learning_rate", 0.05),
    ("http", "model", "another-model"),
]


@pytest.mark.parametrize(
    ("section", "field", "value"),
    IDENTITY_CHANGES,
    ids=[f"{s}.{f}" for s, f, _ in IDENTITY_CHANGES],
)
def test_an_identity_change_is_refused_naming_the_field_and_nothing_changes(
    finished_run: tuple[Path, RunConfig],
    fast_config: Callable[..., RunConfig],
    dir_snapshot: Snapshot,
    section: str,
    field: str,
    value: object,
) -> None:
    out, _ = finished_run
    before = dir_snapshot(out)
    # An operational change beside it does not make it acceptable.
    other = fast_config({section: {field: value}, "liveness": {"step_timeout_s": 99.0}})

    with pytest.raises(JobMismatchError) as caught:
        run_job(out, other)

    (difference,) = caught.value.differences
    assert difference.startswith(f"$.{section}.{field}: ")
    assert f"$.{section}.{field}" in str(caught.value)
    assert "liveness" not in str(caught.value)
    assert caught.value.rerun_resumes is False
    assert dir_snapshot(out) == before


# -- an HTTP run whose server comes back on another address --------------------------------


@contextlib.contextmanager
def _server(log: Path) -> Iterator[str]:
    """A ``rollout-recovery serve`` on a free port, in its own process group; its URL."""
    with running_serve(log) as url:
        yield url


@pytest.mark.slow
def test_an_http_run_resumes_against_its_server_on_a_new_address(
    tmp_path: Path,
    write_config: Callable[..., Path],
    run_cli_until: Cli,
    run_cli: Cli,
    read_jsonl: ReadJsonl,
) -> None:
    out = tmp_path / "run"
    job = {
        "job": {"steps": 12},
        "generation": {"backend": "http", "call_latency_s": 0.0, "attempt_deadline_s": 10.0},
        "http": {"probe_interval_s": 0.1},
    }

    def config(url: str, **http: Any) -> Path:
        return write_config(
            {**job, "http": {**job["http"], "servers": [url], **http}}, faults_off=True
        )

    with _server(tmp_path / "old.log") as old:
        killed = run_cli_until(
            ["--out", str(out), "--config", str(config(old)), "--plain"],
            stop=lambda line, lines: (_step_of(line) or 0) >= 3,
        )
    assert killed.returncode == -signal.SIGKILL, killed.stdout

    # The old address is gone for good; the server came back on a new one, and is slower
    # to answer, so the call timeout is raised too.
    with _server(tmp_path / "new.log") as new:
        assert new != old
        resumed = run_cli(
            ["--out", str(out), "--config", str(config(new, request_timeout_s=20.0)), "--plain"]
        )

    assert resumed.returncode == 0, resumed.stdout
    changes = [
        f"$.http.servers: ('{old}',) != ('{new}',)",
        "$.http.request_timeout_s: 10.0 != 20.0",
    ]
    for change in changes:
        assert f"config changed on resume: {change}" in resumed.stdout
    runs = read_jsonl(out / "run_log.jsonl")
    assert [run["event"] for run in runs] == ["start", "resume"]
    assert runs[-1]["config_changes"] == changes
    assert load_config(out / "job.toml").http.servers == (new,)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(12))
    # The resumed steps were generated by the new server.
    assert metrics[-1]["backend"]["servers"][new]["calls"] > 0
    report = audit_run(out)
    assert report.ok and report.complete, report.violations
