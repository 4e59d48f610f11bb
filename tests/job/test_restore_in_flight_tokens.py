"""What a restore reports as lost in flight: the generated tokens the crash cost, no more.

``restored.tokens_in_flight_lost`` counts the tokens staged by the attempts the crash
interrupted (abandoned by the restart). The store also holds staged rows no seal in the
ledger names that the crash did not cost: those of groups already published, kept until
their deferred deletion, and of attempts abandoned before the crash. Counting every such
orphan made a restore report tokens lost that were never lost.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from rollout_recovery._crashpoints import CRASH_AT_ENV
from rollout_recovery.capture import CaptureWriter
from rollout_recovery.dataplane import SqliteDataPlane
from rollout_recovery.history import audit_run
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.history.records import AttemptsAbandoned, GroupPublished, Restored

Cli = Callable[..., subprocess.CompletedProcess[str]]


def staged_tokens_by_rollout(store_file: Path) -> dict[str, int]:
    store = SqliteDataPlane(store_file)
    try:
        keys = store.keys(CaptureWriter.staging_partition)
        tokens: dict[str, int] = defaultdict(int)
        for key, row in zip(keys, store.get(CaptureWriter.staging_partition, keys), strict=True):
            tokens[key.split("/", 1)[0]] += int(row.token_mask.sum())
        return dict(tokens)
    finally:
        store.close()


def test_a_restore_counts_as_lost_in_flight_only_the_interrupted_attempts_tokens(
    tmp_path: Path, write_config: Callable[..., Path], run_cli: Cli
) -> None:
    out = tmp_path / "run"
    config = write_config(
        {
            "job": {"steps": 10},
            "checkpoint": {"every_steps": 50},
            # Attempt-level resume (call-level keeps the interrupted calls) and two calls
            # an episode, so the call count below lands mid-run.
            "recovery": {"resume": "attempt"},
            "task": {"thinking_calls": 1},
        },
        faults_off=True,
    )
    args = ["--out", str(out), "--config", str(config), "--plain"]
    # Killed with a call staged and not acknowledged: its attempt was mid-episode.
    killed = run_cli(args, env={CRASH_AT_ENV: "capture.before_ack:150"})
    assert killed.returncode == -9, killed.stdout
    staged = staged_tokens_by_rollout(out / "dataplane.sqlite")
    published = {
        e.record.group_id
        for e in read_entries(out / "events.jsonl")
        if isinstance(e.record, GroupPublished)
    }
    # Rows the crash did not cost are there: published groups' rows, deletion deferred.
    assert any(rollout_id.split("_g")[0] in published for rollout_id in staged)

    rerun = run_cli(["--out", str(out), "--plain"])
    assert rerun.returncode == 0, rerun.stdout
    assert audit_run(out).ok
    history = [e.record for e in read_entries(out / "events.jsonl")]
    (restored,) = [r for r in history if isinstance(r, Restored)]
    interrupted = [
        a.rollout_id
        for r in history
        if isinstance(r, AttemptsAbandoned)
        for a in r.attempts
        if a.reason.value == "restart"
    ]
    lost = sum(staged.get(rid, 0) for rid in interrupted)
    assert lost > 0  # the call staged at the crash, at least
    assert restored.tokens_in_flight_lost == lost
