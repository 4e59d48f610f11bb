"""The ``time/*`` fields of a step's metrics: where its wall time went (issue 28, item 1)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery._clock import VirtualClockLoop
from rollout_recovery.control import RunConfig
from rollout_recovery.control._step_timing import TIME_FIELDS, StepTimer
from rollout_recovery.errors import InvalidArgumentError
from rollout_recovery.job import run_job
from rollout_recovery.job._readback import RunReadback
from rollout_recovery.rundir import RunDirectory


def _on_virtual_clock(body: Callable[[VirtualClockLoop], Any]) -> Any:
    loop = VirtualClockLoop()

    async def main() -> Any:
        return body(loop)

    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def test_a_period_holds_what_was_added_and_the_next_one_starts_empty() -> None:
    def body(loop: VirtualClockLoop) -> tuple[dict[str, float], dict[str, float]]:
        timer = StepTimer()
        timer.start()
        loop.jump(3.0)
        timer.add("time/generation_s", 2.0)
        timer.add("time/train_s", 0.5)
        timer.add("time/train_s", 0.25)
        timer.add("time/journal_s", -1.0)  # a clock that went back counts as nothing
        first = timer.lap().flat()
        loop.jump(1.5)
        return first, timer.lap().flat()

    first, second = _on_virtual_clock(body)
    assert first["time/step_s"] == 3.0
    assert first["time/generation_s"] == 2.0
    assert first["time/train_s"] == 0.75
    assert first["time/journal_s"] == 0.0
    assert set(first) == {*TIME_FIELDS, "time/step_s", "time/wall"}
    assert second["time/step_s"] == 1.5
    assert all(second[name] == 0.0 for name in TIME_FIELDS)


def test_an_unknown_part_is_refused_by_name() -> None:
    def body(loop: VirtualClockLoop) -> None:
        timer = StepTimer()
        timer.start()
        with pytest.raises(InvalidArgumentError, match=r"time/sleep_s.*time/train_s"):
            timer.add("time/sleep_s", 1.0)
        assert timer.lap().flat()["time/train_s"] == 0.0

    _on_virtual_clock(body)


def test_a_push_counts_as_weight_sync_whether_it_loaded_or_failed() -> None:
    def body(loop: VirtualClockLoop) -> dict[str, float]:
        timer = StepTimer()
        timer.start()
        timer.add_backend_event("weights_loaded", {"seconds": 0.5, "load_s": 0.4})
        timer.add_backend_event("weights_push_failed", {"seconds": 0.25, "why": "refused"})
        # Not a push, or no usable count: nothing.
        timer.add_backend_event("server_state", {"seconds": 9.0})
        for broken in (True, float("nan"), "1.0", None):
            timer.add_backend_event("weights_loaded", {"seconds": broken})
        return timer.lap().flat()

    assert _on_virtual_clock(body)["time/weight_sync_s"] == 0.75


def test_every_step_says_where_its_time_went_and_the_summary_shows_the_shares(
    tmp_path: Path, fast_config: Callable[..., RunConfig], read_jsonl: Any
) -> None:
    out = tmp_path / "run"
    config = fast_config(
        {"job": {"steps": 4}, "checkpoint": {"every_steps": 1}, "faults": {"hang_rate": 0.0}}
    )
    result = run_job(out, config)
    steps = read_jsonl(RunDirectory(out).metrics)
    assert [record["step"] for record in steps] == [0, 1, 2, 3]
    walls = []
    for record in steps:
        parts = [record[name] for name in TIME_FIELDS]
        assert all(seconds >= 0.0 for seconds in parts), record
        # In process every part runs on the pump, one after another: within the period.
        assert sum(parts) <= record["time/step_s"] + 1e-3, record
        assert record["time/train_s"] > 0.0
        walls.append(record["time/wall"])
    assert walls == sorted(walls)
    # Nothing came before step 0; every later step follows a checkpoint and a hand-over.
    assert steps[0]["time/checkpoint_s"] == 0.0
    assert steps[0]["time/weight_sync_s"] == 0.0
    assert all(record["time/checkpoint_s"] > 0.0 for record in steps[1:])
    shares = RunReadback.read(RunDirectory(out)).time_shares
    assert set(shares) == {name.removeprefix("time/").removesuffix("_s") for name in TIME_FIELDS}
    assert 0.0 < shares["train"] < 1.0
    assert result.summary.time_shares == shares
