"""``rollout-recovery chaos``: the kill schedule is the seed's, every kill is verified, the
run finishes and the audit passes.

The runs are the fast job of conftest.py (10 steps of 4 x 4, a checkpoint every 2 steps)
with 5 ms calls and many stragglers, so kills find attempts in flight and half-sealed
groups. The main test passes an explicit schedule so that six distinct crash points
fire whatever the seeded plan would have drawn; the CLI test uses the seeded plan.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rollout_recovery._crashpoints import CRASH_POINTS
from rollout_recovery.chaos._chaos import (
    RANDOM,
    UNPLANNED_POINTS,
    KillRanges,
    PlannedKill,
    plan_kills,
    run_chaos,
)
from rollout_recovery.control import load_config

CHAOS_JOB: dict[str, dict[str, Any]] = {
    "generation": {"call_latency_s": 0.005},
    "faults": {"straggler_rate": 0.2, "straggler_factor": 8.0},
}

#: Every kill but the last loses at most the two steps since the last checkpoint, so the
#: 10-step job is still running when each of them comes.
SCHEDULE = [
    PlannedKill(None, 4),  # after "step 1 (2/10 done)": the bootstrap checkpoint is committed
    PlannedKill("restore.mid", 1),
    PlannedKill("journal.before_cut", 1),  # the harness tears the journal's tail first
    PlannedKill("checkpoint.before_committed", 1),
    PlannedKill("finalize.after_put", 3),
    PlannedKill("train.before_clear", 1),
    PlannedKill("checkpoint.before_latest", 1),
]

CHILD_TIMEOUT_S = 120.0
CHAOS_CLI = [sys.executable, "-m", "rollout_recovery", "chaos"]


@pytest.fixture
def chaos_config(write_config: Callable[..., Path]) -> Path:
    return write_config(CHAOS_JOB)


@pytest.mark.slow
def test_kills_at_named_crash_points_are_verified_and_the_audit_passes(
    tmp_path: Path, chaos_config: Path
) -> None:
    messages: list[str] = []
    report = run_chaos(
        kills=len(SCHEDULE),
        seed=3,
        out=tmp_path / "run",
        config_path=chaos_config,
        log=messages.append,
        schedule=SCHEDULE,
        child_timeout_s=CHILD_TIMEOUT_S,
    )
    history = "\n".join(messages)
    assert report.failures == [], history
    assert report.audit is not None and report.audit.ok, report.audit
    assert report.ok and report.finished, history
    assert report.kills_by_point == dict(
        sorted(Counter(planned.label for planned in SCHEDULE).items())
    ), history
    assert report.not_reached_by_point == {}
    assert [outcome.result for outcome in report.outcomes[: len(SCHEDULE)]] == ["killed"] * 7
    assert report.outcomes[-1].result == "finished"
    assert report.runs == len(SCHEDULE) + report.final_reruns
    # Every child but the two killed inside a restore (and the fresh first) restored.
    assert report.restores == report.runs - 3, history
    assert len(report.tokens_wasted) == len(report.tokens_unsealed) == report.restores
    # The torn tail survived the kill at its cut; the next restore cut it.
    assert report.torn_tails_cut == 1, history
    # reuse = "all": no seal discarded, only unsealed work is lost.
    assert report.sealed_regenerated == 0
    assert report.tokens_wasted == report.tokens_unsealed
    assert report.audit.counts["steps"] == 10
    assert report.longest_checkpoint_stall_s is not None
    assert report.stall_source == "final run summary"
    data = report.to_json()
    assert data["kills"] == 7 and data["ok"] is True
    assert data["tokens"]["kills_wasting_more_than_unsealed"] == 0
    json.dumps(data)  # serializable as is


@pytest.mark.slow
def test_a_crash_point_that_cannot_be_reached_is_not_a_kill(
    tmp_path: Path, chaos_config: Path
) -> None:
    # A fresh run never restores: ``restore.mid`` is skipped, not counted, not started.
    report = run_chaos(
        kills=1,
        seed=0,
        out=tmp_path / "run",
        config_path=chaos_config,
        log=lambda _message: None,
        schedule=[PlannedKill("restore.mid", 1)],
        child_timeout_s=CHILD_TIMEOUT_S,
    )
    assert report.kills == 0
    assert report.not_reached_by_point == {"restore.mid": 1}
    assert report.runs == 1 and report.finished
    assert report.ok, report.to_json()
    console = Console(file=io.StringIO(), width=120)
    report.render(console)
    shown = console.file.getvalue()
    assert "restore.mid" in shown and "chaos report" in shown and "audit: PASS" in shown


@pytest.mark.slow
def test_cli_json_report(tmp_path: Path, chaos_config: Path) -> None:
    out = tmp_path / "run"
    args = ["--kills", "2", "--seed", "5", "--out", str(out), "--config", str(chaos_config)]
    completed = subprocess.run(
        [*CHAOS_CLI, *args, "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr + completed.stdout
    data = json.loads(completed.stdout)  # the progress lines went to stderr
    assert data["ok"] is True
    assert data["kills_planned"] == 2
    assert data["kills"] + sum(data["not_reached_by_point"].values()) == 2
    assert set(data["kills_by_point"]) <= CRASH_POINTS | {RANDOM}
    assert {"reused", "regenerated"} == set(data["sealed_siblings"])
    assert {
        "reused",
        "wasted_total",
        "wasted_per_kill_mean",
        "wasted_per_kill_max",
        "unsealed_total",
        "unsealed_per_kill_mean",
        "unsealed_per_kill_max",
        "kills_wasting_more_than_unsealed",
        "cohort_in_flight_regenerated_per_kill",
        "resumable_per_kill",
    } == set(data["tokens"])
    assert {"replayed_records", "torn_tails_cut"} <= set(data)
    assert {"mean", "max", "total"} == set(data["tokens"]["resumable_per_kill"])
    assert data["audit"]["verdict"] == "pass"
    assert {"counts", "violation_count", "first_violations"} <= set(data["audit"])
    expected = plan_kills(2, 5, KillRanges.for_config(load_config(chaos_config, seed=5)))
    assert data["schedule"] == [planned.to_json() for planned in expected]
    assert "kill 1/2" in completed.stderr


def test_cli_refuses_a_non_empty_out(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    completed = subprocess.run(
        [*CHAOS_CLI, "--kills", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2
    assert "not a new or empty directory" in completed.stderr


def test_same_seed_same_schedule_and_every_point_is_drawn(chaos_config: Path) -> None:
    ranges = KillRanges.for_config(load_config(chaos_config))
    first = plan_kills(200, 7, ranges)
    assert first == plan_kills(200, 7, ranges)
    assert first != plan_kills(200, 8, ranges)
    labels = Counter(planned.label for planned in first)
    assert set(labels) == (CRASH_POINTS - UNPLANNED_POINTS) | {RANDOM}
    assert 60 <= labels[RANDOM] <= 140  # about half
    for planned in first:
        low, high = ranges.after_lines if planned.point is None else ranges.hits[planned.point]
        assert low <= planned.count <= high


def test_restore_mid_is_never_planned_while_the_run_is_fresh() -> None:
    ranges = KillRanges.for_config(load_config(None))
    for seed in range(200):
        plan = plan_kills(6, seed, ranges)
        fresh = True
        for planned in plan:
            assert not (
                fresh and planned.point in ("restore.mid", "replay.mid", "journal.before_cut")
            ), (seed, plan)
            fresh = (
                fresh
                and planned.count == 1
                and planned.point
                in (
                    "checkpoint.before_committed",
                    "checkpoint.before_rename",
                )
            )


def test_plan_refuses_bad_input() -> None:
    ranges = KillRanges.for_config(load_config(None))
    assert plan_kills(0, 1, ranges) == []
    with pytest.raises(ValueError, match="kills"):
        plan_kills(-1, 1, ranges)
    with pytest.raises(ValueError, match="crash point"):
        PlannedKill("no.such.point", 1)
    with pytest.raises(ValueError, match="count"):
        PlannedKill(None, 0)
