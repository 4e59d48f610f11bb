"""``[recovery] reuse`` measured: the same job, the same seed, the same 5 kills, under
``all``, ``ancestors`` and ``none``.

Each run is ``rollout-recovery run`` SIGKILLed (its whole process group) right after it
printed ``step S/`` for each S of ``--kills``, rerun after each kill, then run to the end.
From the run directory: the mean reward of every step (``metrics.jsonl``, the surviving
history: steps rolled back by a restore are trained and logged again), and from the
``restored`` records the seals each restore discarded under the policy and their tokens
(regenerated), the tokens of attempts the kills interrupted (lost under every policy),
and the steps rolled back. Wall time is the sum of every child's.

Kills land on printed steps, not on a clock, so every policy is killed at the same points
of its own progress; the runs themselves are asynchronous, so two runs of one policy do
not train identical batches (``--repeat`` runs each policy more than once).

Run: ``python benchmarks/bench_reuse.py [--kills 12,24,36,48,60] [--every 2,10]
[--repeat 1] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rollout_recovery.history._trail_reader import read_records
from rollout_recovery.history.records import Restored

POLICIES = ("all", "ancestors", "none")
BUCKETS = 10


def _child(out: Path, config: Path, seed: int, kill_after: int | None) -> tuple[int, float]:
    command = [sys.executable, "-m", "rollout_recovery", "run", "--out", str(out)]
    command += ["--config", str(config), "--seed", str(seed), "--plain"]
    started = time.perf_counter()
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    assert child.stdout is not None
    lines = []
    for line in child.stdout:
        lines.append(line)
        if kill_after is not None and line.startswith(f"step {kill_after - 1} ("):
            os.killpg(child.pid, signal.SIGKILL)
            break
    child.stdout.close()
    code = child.wait()
    if kill_after is None and code != 0:
        raise RuntimeError("the final run failed:\n" + "".join(lines[-20:]))
    return code, time.perf_counter() - started


def one_run(policy: str, every: int, kills: list[int], seed: int, scratch: Path) -> dict[str, Any]:
    config = scratch / f"reuse-{policy}-{every}.toml"
    config.write_text(f'[checkpoint]\nevery_steps = {every}\n\n[recovery]\nreuse = "{policy}"\n')
    out = scratch / f"run-{policy}-{every}-{seed}"
    wall = 0.0
    for step in kills:
        code, seconds = _child(out, config, seed, step)
        wall += seconds
        if code != -signal.SIGKILL:
            raise RuntimeError(f"{policy}: the kill after step {step} did not land ({code})")
    _, seconds = _child(out, config, seed, None)
    wall += seconds
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [m["mean_reward"] for m in metrics if m.get("mean_reward") is not None]
    restores = [r for _, r in read_records(out / "events.jsonl") if isinstance(r, Restored)]
    tenth = max(1, len(rewards) // BUCKETS)
    curve = [
        statistics.fmean(rewards[start : start + tenth]) for start in range(0, len(rewards), tenth)
    ]
    return {
        "policy": policy,
        "checkpoint_every": every,
        "seed": seed,
        "steps": len(rewards),
        "restores": len(restores),
        "final_reward": statistics.fmean(rewards[-tenth:]),
        "mean_reward": statistics.fmean(rewards),
        "curve": curve,
        "seals_discarded": sum(r.seals_lost for r in restores),
        "tokens_regenerated": sum(r.tokens_lost for r in restores),
        "tokens_interrupted": sum(r.tokens_in_flight_lost for r in restores),
        "tokens_reused": sum(r.tokens_reused for r in restores),
        "steps_rolled_back": sum(len(r.rolled_back_steps) for r in restores),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", default="12,24,36,48,60", help="kill after these steps")
    parser.add_argument("--every", default="2,10", help="checkpoint intervals to compare")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per policy (seeds seed..)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    kills = [int(k) for k in args.kills.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-reuse-") as tmp:
        for every in (int(e) for e in args.every.split(",")):
            for number in range(args.repeat):
                for policy in POLICIES:
                    label = f"reuse={policy}, checkpoint every {every}, run {number}"
                    print(label, file=sys.stderr)
                    rows.append(one_run(policy, every, kills, args.seed + number, Path(tmp)))
    print(
        f"{'every':>6}{'policy':>11}{'final reward':>14}{'mean reward':>13}{'seals disc.':>13}"
        f"{'tokens regen.':>15}{'tokens interr.':>16}{'rolled back':>13}{'wall s':>9}"
    )
    for row in rows:
        print(
            f"{row['checkpoint_every']:>6}{row['policy']:>11}{row['final_reward']:>14.3f}"
            f"{row['mean_reward']:>13.3f}{row['seals_discarded']:>13}"
            f"{row['tokens_regenerated']:>15}{row['tokens_interrupted']:>16}"
            f"{row['steps_rolled_back']:>13}{row['wall_s']:>9.1f}"
        )
    print("\nmean reward per tenth of the run")
    for row in rows:
        curve = " ".join(f"{value:.2f}" for value in row["curve"])
        print(f"{row['checkpoint_every']:>6}{row['policy']:>11}  {curve}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
