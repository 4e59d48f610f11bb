"""The kill test: SIGKILL ``rollout-recovery run`` anywhere, rerun it, get one history.

The CLI runs in a child process group. Some reruns are killed by the test (the whole
group, SIGKILL) right after the N-th output line, N drawn from a seeded RNG; the others
arm a named crash point through ``ROLLOUT_RECOVERY_CRASH_AT``, so the child kills itself
inside a checkpoint write, during finalization, between staging and acknowledgement,
between training and clearing, or in the middle of a restore. Then the same command is
rerun until it exits 0, and the audit trail must tell one consistent history
(``check_trail``): every group trained in exactly one step with exactly N rows, no
sibling or prompt trained twice, every prompt taken trained or dropped with a reason,
every sealed sibling trained with its sealed rollout id unless an abandon event says why.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.control import RunConfig
from rollout_recovery.history._trail_check import check_trail

Cli = Callable[..., subprocess.CompletedProcess[str]]
ReadJsonl = Callable[[Path], list[dict[str, Any]]]

RNG_SEED = 20261130

#: The fast job, longer and with slower calls, so many attempts are in flight at a kill.
#: Stragglers keep some groups half sealed while a checkpoint is taken, so restores have
#: sealed siblings to reuse. Forty steps leave room for the whole plan: a rerun killed
#: after at most 8 lines keeps at most 6 steps, a crash-point rerun at most 2, so every
#: rerun of the plan still has work left and really dies where it is meant to.
KILL_JOB: dict[str, dict[str, Any]] = {
    "job": {"steps": 40},
    "generation": {"call_latency_s": 0.005},
    "faults": {"straggler_rate": 0.2, "straggler_factor": 8.0},
    "checkpoint": {"every_steps": 2},
}

#: One entry per rerun: None = killed by the test after a random number of output lines;
#: otherwise the crash point to arm (a count drawn at random where it is ``{}``).
PLAN: list[str | None] = [
    None,
    "capture.before_ack:{}",
    "checkpoint.before_committed:1",
    None,
    "finalize.after_put:{}",
    "checkpoint.before_rename:1",
    None,
    "restore.mid",
    "train.before_clear:{}",
    None,
    "checkpoint.before_latest:1",
    None,
]
COUNTS = {
    "capture.before_ack": (10, 80),
    "finalize.after_put": (2, 10),
    "train.before_clear": (1, 3),
}
KILL_AFTER_LINES = (2, 8)
MAX_FINAL_RERUNS = 3


def arm(entry: str, rng: random.Random) -> str:
    name = entry.split(":")[0]
    if "{}" in entry:
        low, high = COUNTS[name]
        return entry.format(rng.randint(low, high))
    return entry


@pytest.mark.slow
def test_sigkill_anywhere_and_rerun_tells_one_consistent_history(
    tmp_path: Path,
    write_config: Callable[..., Path],
    fast_config: Callable[..., RunConfig],
    run_cli: Cli,
    run_cli_until: Cli,
    read_jsonl: ReadJsonl,
) -> None:
    rng = random.Random(RNG_SEED)
    config = fast_config(KILL_JOB)
    out = tmp_path / "run"
    args = ["--out", str(out), "--config", str(write_config(KILL_JOB)), "--plain"]
    restored: dict[str, dict[str, Any]] = {}  # every restored event ever written
    history: list[str] = []

    def collect_restored() -> None:
        if (out / "events.jsonl").exists():
            for event in read_jsonl(out / "events.jsonl"):
                if event["event"] == "restored":
                    restored[json.dumps(event, sort_keys=True)] = event

    for number, entry in enumerate(PLAN):
        if entry is None:
            lines = rng.randint(*KILL_AFTER_LINES)
            result = run_cli_until(args, stop=lambda _line, seen, n=lines: len(seen) >= n)
            history.append(f"run {number}: killed after line {lines} -> {result.returncode}")
            assert result.returncode == -9, (history, result.stdout)
        else:
            armed = arm(entry, rng)
            name = armed.split(":")[0]
            result = run_cli(args, env={"ROLLOUT_RECOVERY_CRASH_AT": armed})
            history.append(f"run {number}: armed {armed} -> {result.returncode}")
            assert result.returncode == -9, (history, result.stdout)
            assert f"crash point {name} fired" in result.stdout, (history, result.stdout)
        collect_restored()

    for _ in range(MAX_FINAL_RERUNS):
        final = run_cli(args)
        history.append(f"final rerun -> {final.returncode}")
        collect_restored()
        if final.returncode == 0:
            break
    assert final.returncode == 0, (history, final.stdout)
    assert "resumed from step_" in final.stdout

    report = check_trail(out, group_size=config.job.generations_per_prompt)
    assert report.ok, (history, report.violations[:20])
    counts = report.counts
    assert counts["groups_trained"] + counts["prompts_dropped"] == counts["prompts_taken"]
    assert counts["prompts_taken"] == config.job.steps * config.job.prompts_per_step
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(config.job.steps))
    # Restores happened and at least one kept sealed siblings instead of regenerating them.
    resumes = [line for line in read_jsonl(out / "run_log.jsonl") if line["event"] == "resume"]
    assert len(resumes) >= len(PLAN) - 1, history
    kept = [event["sealed_siblings_kept"] for event in restored.values()]
    # (check_trail above: every sibling sealed in the final history was trained with the
    # rollout id it was sealed with, unless an abandon event says why.)
    assert any(k > 0 for k in kept), (history, kept)
