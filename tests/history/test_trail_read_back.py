"""AuditTrail reads back the two files it writes: the journal's records, the metrics lines."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from trail_builders import good_history, write_trail

from rollout_recovery.errors import TrailLineError
from rollout_recovery.history import AuditTrail
from rollout_recovery.rundir import RunDirectory


def test_the_history_reads_back_in_order(tmp_path: Path) -> None:
    records = good_history()
    write_trail(tmp_path, records)
    assert AuditTrail.read_history(RunDirectory(tmp_path)) == records


def test_a_torn_last_line_is_not_part_of_the_history(tmp_path: Path) -> None:
    records = good_history()
    events = write_trail(tmp_path, records)
    with open(events, "ab") as handle:
        handle.write(b'{"crc":"00000000","event":"prompt_ta')  # a write a crash tore
    assert AuditTrail.read_history(RunDirectory(tmp_path)) == records


def test_the_metrics_read_back_with_non_finite_numbers_as_null(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    with AuditTrail(run) as trail:
        trail.metrics({"step": 0, "mean_reward": 0.5})
        trail.metrics({"step": 1, "mean_reward": math.nan})
    assert AuditTrail.read_metrics(run) == [
        {"step": 0, "mean_reward": 0.5},
        {"step": 1, "mean_reward": None},
    ]


def test_a_metrics_line_that_is_not_an_object_is_refused_with_its_place(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    run.metrics.write_bytes(b'{"step": 0}\n[1, 2]\n')
    with pytest.raises(TrailLineError, match=r"metrics\.jsonl:2 is not a JSON object"):
        AuditTrail.read_metrics(run)
