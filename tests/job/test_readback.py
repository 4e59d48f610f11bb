"""What a process end reads back (the summary's and the plot's inputs) is streamed: its
memory follows the steps, not the history's bytes (issue 24, item 7).

A long run is made from a finished one by repeating its journal's lines (each is whole
on its own: its checksum covers only itself) and its metrics lines, steps renumbered.
"""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import pytest
from benchmark_support import load_benchmark

from rollout_recovery.control import RunConfig
from rollout_recovery.errors import RunNotResumableError
from rollout_recovery.history import AuditTrail
from rollout_recovery.history.records import CheckpointCommitted
from rollout_recovery.job._readback import RunReadback
from rollout_recovery.rundir import RunDirectory

# The benchmark's long run, built the same way at a smaller scale.
_BENCHMARK = load_benchmark("bench_history_read")


def _lengthened(source: Path, target: Path, times: int) -> RunDirectory:
    return RunDirectory(_BENCHMARK.lengthened(source, target, times))


def _peak_reading(run: RunDirectory) -> tuple[int, RunReadback]:
    tracemalloc.start()
    try:
        found = RunReadback.read(run)
        return tracemalloc.get_traced_memory()[1], found
    finally:
        tracemalloc.stop()


def test_a_process_end_reads_what_the_run_wrote(finished_run: tuple[Path, RunConfig]) -> None:
    out, config = finished_run
    run = RunDirectory(out)
    found = RunReadback.read(run)
    metrics = AuditTrail.read_metrics(run)
    assert found.steps == [m["step"] for m in metrics] == list(range(config.job.steps))
    expected = [-1.0 if m["mean_reward"] is None else m["mean_reward"] for m in metrics]
    assert [-1.0 if math.isnan(r) else r for r in found.mean_rewards] == expected
    assert found.checkpoints == [
        r.step for r in AuditTrail.read_history(run) if isinstance(r, CheckpointCommitted)
    ]
    assert found.checkpoints and found.restarts == []


def test_its_memory_does_not_grow_with_the_history(
    finished_run: tuple[Path, RunConfig], tmp_path: Path
) -> None:
    out, _ = finished_run
    short = _lengthened(out, tmp_path / "short", 1)
    long = _lengthened(out, tmp_path / "long", 40)
    journal = (long.events).stat().st_size
    short_peak, short_found = _peak_reading(short)
    long_peak, long_found = _peak_reading(long)
    assert len(long_found.checkpoints) == 40 * len(short_found.checkpoints)
    assert len(long_found.steps) == 40 * len(short_found.steps)
    # What grows is a float and an int a step; the history (here 40x) is not held.
    assert long_peak < short_peak + 2 * 1024 * 1024, (short_peak, long_peak, journal)
    assert long_peak < journal / 4, (long_peak, journal)


def test_a_history_damaged_while_the_job_ran_stops_without_the_rerun_advice(
    finished_run: tuple[Path, RunConfig],
) -> None:
    out, _ = finished_run
    events = out / "events.jsonl"
    data = bytearray(events.read_bytes())
    data[40] ^= 0x01
    events.write_bytes(bytes(data))
    with pytest.raises(RunNotResumableError) as caught:
        RunReadback.read(RunDirectory(out))
    assert "events.jsonl:1 (byte 0) is damaged" in str(caught.value)
    assert caught.value.rerun_resumes is False
