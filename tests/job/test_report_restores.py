"""Honest reuse counts in the summary (issue 27 item 6): what restores kept (finished
groups, rows, tokens), what they rolled back and trained again, and what they lost, from
the journal's ``restored`` records, never "siblings reused 0" when finished groups were
kept."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from rollout_recovery._crashpoints import CRASH_AT_ENV
from rollout_recovery.history import AuditTrail, audit_run
from rollout_recovery.history.records import Restored, StepTrained, TrainedRow
from rollout_recovery.job._report import RestoreTotals
from rollout_recovery.rundir import RunDirectory

Cli = Callable[..., subprocess.CompletedProcess[str]]


def _trained(step: int, groups: int, group_size: int) -> StepTrained:
    rows = [
        TrainedRow(
            group_id=f"g{step}{g}",
            generation_index=i,
            prompt_idx=g,
            rollout_id=f"g{step}{g}_g{i}_a0",
            valid=True,
            reward=0.0,
            weight_version=step,
        )
        for g in range(groups)
        for i in range(group_size)
    ]
    return StepTrained(
        step=step,
        weight_version=step + 1,
        group_ids=[f"g{step}{g}" for g in range(groups)],
        rows=rows,
        valid_rows=len(rows),
    )


def _restored(**fields: object) -> Restored:
    values: dict[str, object] = {
        "checkpoint": "step_000002",
        "step": 2,
        "snapshot_position": 0,
        "replayed_records": 10,
        "groups_in_ledger": 3,
        "sealed_siblings_kept": 5,
        "canonical_groups": 4,
        "canonical_tokens_kept": 100,
        "tokens_reused": 20,
        "tokens_resumable": 3,
        "tokens_lost": 7,
        "tokens_in_flight_lost": 11,
    }
    values.update(fields)
    return Restored(**values)  # type: ignore[arg-type]


def test_the_totals_add_up_what_each_restore_kept_retrained_and_lost() -> None:
    history = [
        _trained(0, 2, 4),
        _trained(1, 2, 4),
        _trained(2, 3, 4),  # rolled back by the first restore
        _restored(rolled_back_steps=[2]),
        _trained(2, 2, 4),
        _trained(3, 2, 4),  # rolled back by the second
        _restored(canonical_groups=0, sealed_siblings_kept=1, rolled_back_steps=[3]),
    ]
    assert RestoreTotals.of(history, group_size=4) == RestoreTotals(
        groups_kept=4,
        rows_kept=4 * 4 + 5 + 1,
        tokens_kept=2 * (100 + 20 + 3),
        steps_retrained=2,
        groups_retrained=3 + 2,
        rows_retrained=12 + 8,
        tokens_lost=2 * (7 + 11),
    )


def test_a_resumed_run_says_what_its_restore_kept(
    tmp_path: Path, write_config: Callable[..., Path], run_cli: Cli
) -> None:
    """Killed after its step-4 training and before the checkpoint after it: finished
    groups waiting to train are kept, and the summary says so (the old summary counted
    only the sealed siblings of unfinished groups: "siblings reused 0")."""
    out = tmp_path / "run"
    config = write_config({"job": {"steps": 6}, "checkpoint": {"every_steps": 3}}, faults_off=True)
    args = ["--out", str(out), "--config", str(config), "--plain"]
    killed = run_cli(args, env={CRASH_AT_ENV: "train.before_clear:5"})
    assert killed.returncode == -9, killed.stdout
    rerun = run_cli(args)
    assert rerun.returncode == 0, rerun.stdout
    assert audit_run(out).ok
    restored = [r for r in AuditTrail.read_history(RunDirectory(out)) if isinstance(r, Restored)]
    assert len(restored) == 1 and restored[0].canonical_groups > 0
    totals = RestoreTotals.of(AuditTrail.read_history(RunDirectory(out)), group_size=4)
    assert totals.groups_kept == restored[0].canonical_groups
    assert totals.rows_kept >= 4 * totals.groups_kept and totals.tokens_kept > 0
    assert totals.steps_retrained == len(restored[0].rolled_back_steps) == 1
    rows = dict(
        (cells[0], cells[1])
        for line in rerun.stdout.splitlines()
        if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 2
    )
    assert rows["finished groups kept by restores"] == str(totals.groups_kept)
    assert rows["rows kept by restores (not generated again)"] == str(totals.rows_kept)
    assert rows["steps rolled back and trained again"] == "1"
    assert rows["rows trained again"] == str(totals.rows_retrained)
    assert "siblings reused" not in rerun.stdout
