"""``bench_resume_adopt.py`` says what each rerun restored and can kill after a commit.

Issue 28: the benchmark killed the job once ``metrics.jsonl`` had a step, which can land
before that step's background checkpoint committed, so the rerun restored the one before
and retrained steps, and its "resume" held them unseen. It now reads both from the
journal: the newest committed checkpoint (``--kill-after-commit`` waits for it) and each
rerun's ``restored`` record.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from benchmark_support import load_benchmark

from rollout_recovery.history.records import CheckpointCommitted, Restored

_BENCHMARK = load_benchmark("bench_resume_adopt")


def _line(record: object) -> bytes:
    return msgspec.json.encode(record) + b"\n"


def _restored(checkpoint: str, step: int, rolled_back: list[int]) -> Restored:
    return Restored(
        checkpoint=checkpoint,
        step=step,
        snapshot_position=0,
        replayed_records=0,
        rolled_back_steps=rolled_back,
        groups_in_ledger=0,
        sealed_siblings_kept=0,
        canonical_groups=0,
    )


def test_the_committed_checkpoints_are_read_from_whole_lines(tmp_path: Path) -> None:
    journal = tmp_path / "events.jsonl"
    assert _BENCHMARK.committed_steps(tmp_path) == []
    journal.write_bytes(_line(CheckpointCommitted(step=5, name="step_000005", position=9)))
    half = _line(CheckpointCommitted(step=10, name="step_000010", position=99))
    with journal.open("ab") as handle:
        handle.write(half[:20])  # the job is writing it
    assert _BENCHMARK.committed_steps(tmp_path) == [5]


def test_a_rerun_reports_the_checkpoint_it_restored_not_an_earlier_runs(tmp_path: Path) -> None:
    journal = tmp_path / "events.jsonl"
    journal.write_bytes(_line(_restored("step_000000", 0, [])))
    offset = journal.stat().st_size
    assert _BENCHMARK.restored_since(tmp_path, offset) is None
    with journal.open("ab") as handle:
        handle.write(_line(_restored("step_000005", 5, [5])))
    assert _BENCHMARK.restored_since(tmp_path, offset) == {
        "checkpoint": "step_000005",
        "step": 5,
        "rolled_back_steps": [5],
    }


def test_the_first_step_is_the_first_the_rerun_wrote_not_the_line_past_the_killed_runs() -> None:
    """The killed run wrote steps 0-5; the rerun restored step 5's checkpoint, cut the
    file back to steps 0-4 and trained step 5 again, then step 6."""
    killed = [{"step": n, "time/wall": 100.0 + n} for n in range(5)]
    rerun = [{"step": 5, "time/wall": 200.0}, {"step": 6, "time/wall": 205.0}]
    steps = killed + rerun
    assert _BENCHMARK.first_written(steps, started=150.0)["step"] == 5
    assert steps[6]["step"] == 6  # the old measure's line: one trained step later
