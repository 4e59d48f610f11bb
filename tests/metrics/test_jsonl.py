"""metrics.jsonl: strict JSON, one line per step, cut back to the resume step on open."""

from __future__ import annotations

import math
from pathlib import Path

from rollout_recovery.metrics._jsonl import JsonlSink


def _steps(path: Path) -> bytes:
    return path.read_bytes()


def test_non_finite_values_are_null_and_markers_are_not_lines(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, resume_step=0)
    sink.log_step(0, {"loss": math.nan, "gain": math.inf, "n": 3})
    sink.log_marker(0, "restored", {"tokens_lost": 1})
    sink.close()
    assert (tmp_path / "metrics.jsonl").read_bytes() == (
        b'{"step":0,"loss":null,"gain":null,"n":3}\n'
    )


def test_open_cuts_at_the_first_line_at_or_past_the_resume_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step":0}\n{"step":1}\n{"step":2}\n{"step":3}\n')
    JsonlSink(tmp_path, resume_step=2).close()
    assert path.read_bytes() == b'{"step":0}\n{"step":1}\n'
    JsonlSink(tmp_path, resume_step=5).close()  # nothing at or past 5: kept whole
    assert path.read_bytes() == b'{"step":0}\n{"step":1}\n'


def test_open_cuts_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step":0}\n{"step":1')
    sink = JsonlSink(tmp_path, resume_step=3)
    sink.log_step(3, {"x": 1})
    sink.close()
    assert path.read_bytes() == b'{"step":0}\n{"step":3,"x":1}\n'
