"""After a restore, every older retained checkpoint can still be restored (issue 24,
item 4).

A restore used to delete at once every data-plane row its own checkpoint does not need.
The older retained checkpoints need some of them (the canonical rows of the steps trained
between them and the restored one, which they train again). If the restored checkpoint
was then damaged before the next checkpoint committed, the fallback to an older one found
"the data plane lacks rows" and the run could not continue. Now the restore keeps (as
deferred deletions, gone once ``keep`` later checkpoints have committed) every row a
retained checkpoint needs, so "skipped for the previous one" holds at every moment.

SIGKILLs of the real CLI, synchronized on its output lines or at a crash point.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery._crashpoints import CRASH_AT_ENV
from rollout_recovery.history import audit_run
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.history.records import Restored

Cli = Callable[..., subprocess.CompletedProcess[str]]

JOB: dict[str, dict[str, Any]] = {
    "job": {"steps": 12},
    # In the step: a checkpoint's commit and the prune after it end before the step trains,
    # so a crash in step 6's training finds exactly checkpoints 2, 4 and 6. (A background
    # write can be between its commit and its prune at any kill: a CI run found 0 too.)
    "checkpoint": {"every_steps": 2, "keep": 3, "background": False},
}


def _damage(checkpoint: Path) -> None:
    """Flip a byte of the checkpoint's replay index: its sha256 no longer matches."""
    victim = checkpoint / "replay_index.msgpack"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))


@pytest.mark.slow
def test_an_older_retained_checkpoint_restores_after_the_newest_is_lost_following_a_restore(
    tmp_path: Path, write_config: Callable[..., Path], run_cli: Cli
) -> None:
    out = tmp_path / "run"
    args = ["--out", str(out), "--config", str(write_config(JOB)), "--plain"]
    # Killed in step 6's training (the 7th), not on an output line a late reader may see
    # after the next checkpoint.
    killed = run_cli(args, env={CRASH_AT_ENV: "train.before_clear:7"})
    assert killed.returncode == -9, killed.stdout
    checkpoints = sorted(path.name for path in (out / "checkpoints").glob("step_*"))
    assert checkpoints == ["step_000002", "step_000004", "step_000006"], checkpoints
    *older, newest = checkpoints

    # Restored from the newest, then killed in its first step, so before the next
    # checkpoint commits (a SIGKILL on the "resumed from" line raced the steps after it).
    restored = run_cli(args, env={CRASH_AT_ENV: "train.before_clear:1"})
    assert restored.returncode == -9, restored.stdout
    assert f"resumed from {newest}" in restored.stdout
    assert sorted(path.name for path in (out / "checkpoints").glob("step_*")) == checkpoints

    _damage(out / "checkpoints" / newest)
    finished = run_cli(args)

    assert finished.returncode == 0, finished.stdout
    assert f"skipping checkpoint {newest}" in finished.stdout
    restores = [e.record for e in read_entries(out / "events.jsonl")]
    last = [r for r in restores if isinstance(r, Restored)][-1]
    assert last.checkpoint == older[-1], finished.stdout
    report = audit_run(out)
    assert report.ok and report.complete, report.violations
