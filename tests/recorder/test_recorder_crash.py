"""SIGKILL a real process while it seals in a loop, reopen, repeat: every seal a call
acknowledged is in the journal, unchanged, and the run directory passes the audit."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_recovery.history import audit_run
from rollout_recovery.recorder import Recorder

CHILD = Path(__file__).with_name("recorder_child.py")
KEYS = 12
GROUP_SIZE = 3


def run_child(run_dir: Path, kill_after: int | None) -> tuple[list[str], bool]:
    """Run the child; SIGKILL its process group after ``kill_after`` acknowledgements.
    Returns its ACK lines and whether it finished."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(run_dir), str(KEYS)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    acks: list[str] = []
    done = False
    assert child.stdout is not None
    try:
        for line in child.stdout:
            if line.startswith("ACK"):
                acks.append(line.strip())
                if kill_after is not None and len(acks) >= kill_after:
                    os.killpg(child.pid, signal.SIGKILL)
                    break
            elif line.strip() == "DONE":
                done = True
    finally:
        if child.poll() is None and kill_after is not None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        child.stdout.close()
    return acks, done


@pytest.mark.slow
def test_every_acknowledged_seal_survives_repeated_kills(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    rng = random.Random(26)
    acknowledged: dict[tuple[str, int], list[int]] = {}
    for _ in range(4):
        acks, done = run_child(run_dir, kill_after=rng.randint(1, 7))
        assert not done
        for line in acks:
            _, key, sibling, tokens = line.split()
            seal = (key, int(sibling))
            assert seal not in acknowledged, f"{seal} was sealed twice"
            acknowledged[seal] = [int(t) for t in tokens.split(",")]
        report = audit_run(run_dir)
        assert report.ok, report.violations
    acks, done = run_child(run_dir, kill_after=None)
    assert done
    for line in acks:
        _, key, sibling, _ = line.split()
        assert (key, int(sibling)) not in acknowledged, f"{key}/{sibling} generated again"
    with Recorder.open(run_dir, group_size=GROUP_SIZE) as rec:
        for (key, sibling), tokens in acknowledged.items():
            stored = rec.take(key, {"row": int(key.split(":")[1])}).sealed[sibling]
            assert stored.completion_token_ids == tokens, (key, sibling)
        rec.mark_checkpoint("end", step=0)
    report = audit_run(run_dir)
    assert report.ok, report.violations
    assert report.counts["seals"] == KEYS * GROUP_SIZE
