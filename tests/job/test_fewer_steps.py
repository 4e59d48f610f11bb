"""A run resumed with fewer ``job.steps`` than it has taken prompts for is refused at once,
naming the number to use, and changes nothing (issue 24, item 5).

``job.steps`` is operational (a resume may raise it). Lowered below the steps whose
prompts were already taken, the rerun used to wait ``4 x [liveness] step_timeout_s`` for
groups of a step it would never train, then advise a rerun that waited again; the audit
failed on prompts taken and never trained. Every prompt taken is trained, so the job
refuses the lower value before the restore, with the smallest value that works.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery._crashpoints import CRASH_AT_ENV
from rollout_recovery.capture import CaptureWriter
from rollout_recovery.dataplane import ReplayIndex, SqliteDataPlane
from rollout_recovery.history import audit_run
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.history.records import PromptTaken

Cli = Callable[..., subprocess.CompletedProcess[str]]
Snapshot = Callable[[Path], dict[str, Any]]

JOB: dict[str, dict[str, Any]] = {"job": {"steps": 10, "staleness_window": 2}}


def _files(snapshot: dict[str, Any]) -> dict[str, Any]:
    return {
        name: value
        for name, value in snapshot.items()
        if name != ".lock" and not name.startswith("dataplane.sqlite")
    }


def _rows(out: Path) -> dict[str, list[str]]:
    with SqliteDataPlane(out / "dataplane.sqlite") as store:
        return {
            partition: store.keys(partition)
            for partition in (CaptureWriter.staging_partition, ReplayIndex.canonical_partition)
        }


@pytest.mark.slow
def test_fewer_steps_than_taken_are_refused_at_once_with_the_number_to_use(
    tmp_path: Path,
    write_config: Callable[..., Path],
    run_cli: Cli,
    dir_snapshot: Snapshot,
) -> None:
    out = tmp_path / "run"
    first = ["--out", str(out), "--config", str(write_config(JOB)), "--plain"]
    # In step 4's training, not on an output line (a late reader kills anywhere after it).
    killed = run_cli(first, env={CRASH_AT_ENV: "train.before_clear:5"})
    assert killed.returncode == -9, killed.stdout
    batches = {
        e.record.batch
        for e in read_entries(out / "events.jsonl")
        if isinstance(e.record, PromptTaken)
    }
    taken = max(batches) + 1
    assert taken >= 5, batches  # the window let it take prompts ahead of training
    # With the old behaviour this waited 4 x 10 s, then advised a rerun.
    lower = write_config(
        {**JOB, "job": {**JOB["job"], "steps": 3}, "liveness": {"step_timeout_s": 10.0}}
    )
    # What a save killed mid-way leaves (the kill may land in a background write too): a
    # refused rerun must leave it, an accepted one removes it.
    leftover = out / "checkpoints" / ".tmp-step_000009-0123abcd"
    leftover.mkdir()
    (leftover / "COMMITTED.tmp").write_text("{}")
    before, rows_before = dir_snapshot(out), _rows(out)

    refused = run_cli(["--out", str(out), "--config", str(lower), "--plain"])

    assert refused.returncode == 2, refused.stdout
    assert f"error: $.job.steps: this run has taken the prompts of {taken} steps" in refused.stdout
    assert f"Rerun with job.steps = {taken} or more" in refused.stdout
    assert "rerun the same command" not in refused.stdout
    assert "Traceback" not in refused.stdout
    # Byte for byte but the lock and SQLite's own files: opening the store after a kill
    # checkpoints its write-ahead log into the database (the rows are compared instead).
    assert _files(dir_snapshot(out)) == _files(before)
    assert _rows(out) == rows_before

    number = re.search(r"job\.steps = (\d+) or more", refused.stdout)
    assert number is not None
    enough = write_config({**JOB, "job": {**JOB["job"], "steps": int(number.group(1))}})
    finished = run_cli(["--out", str(out), "--config", str(enough), "--plain"])
    assert finished.returncode == 0, finished.stdout
    assert not leftover.exists()
    report = audit_run(out)
    assert report.ok and report.complete, report.violations
