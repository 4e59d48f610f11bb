"""A step's metrics are typed until one flat ``metrics.jsonl`` line is made of them: that
line's keys, their order and their values are the file's format (issue 25 item 4)."""

from __future__ import annotations

from rollout_recovery.control._step_record import StepRecord
from rollout_recovery.control._step_timing import StepTimes

TIMES = StepTimes(
    generation_s=1.0,
    train_s=0.5,
    weight_sync_s=0.25,
    checkpoint_s=0.0,
    journal_s=0.125,
    step_s=2.0,
    wall=1.7e9,
)


def record(**changes: object) -> StepRecord:
    values: dict[str, object] = {
        "step": 3,
        "mean_reward": 0.75,
        "groups": 2,
        "rows": 8,
        "valid_rows": 6,
        "refused_rows": 0,
        "placeholder_reasons": {"missing_receipt": 2},
        "weight_version": 4,
        "train_seconds": 0.5012,
        "train": {"loss": 0.1, "logprob_gap": 0.0},
        "backend": {"servers": {"a": 1}},
        "described": {"samples": [{"prompt": "p"}]},
        "times": TIMES,
        **changes,
    }
    return StepRecord(**values)  # type: ignore[arg-type]


def test_the_line_has_the_files_keys_in_the_files_order() -> None:
    assert list(record().flat().items()) == [
        ("step", 3),
        ("mean_reward", 0.75),
        ("groups", 2),
        ("rows", 8),
        ("valid_rows", 6),
        ("valid_row_fraction", 0.75),
        ("refused_rows", 0),
        ("placeholder_reasons", {"missing_receipt": 2}),
        ("weight_version", 4),
        ("train_seconds", 0.5012),
        ("train/loss", 0.1),
        ("train/logprob_gap", 0.0),
        ("backend", {"servers": {"a": 1}}),
        ("samples", [{"prompt": "p"}]),
        ("time/generation_s", 1.0),
        ("time/train_s", 0.5),
        ("time/weight_sync_s", 0.25),
        ("time/checkpoint_s", 0.0),
        ("time/journal_s", 0.125),
        ("time/step_s", 2.0),
        ("time/wall", 1.7e9),
    ]


def test_a_step_without_rows_or_telemetry() -> None:
    line = record(rows=0, valid_rows=0, mean_reward=None, backend=None, described={}).flat()
    assert line["valid_row_fraction"] is None and line["mean_reward"] is None
    assert "backend" not in line and "samples" not in line
