"""``[generation] on_weight_update`` measured: the default job under ``"continue"`` and
``"interrupt"``, side by side in one process.

Runs alternate (continue, interrupt, continue, interrupt, ...) so the machine's load hits
both alike; each pair gives a steps/s ratio. From each run's journal (the rows every step
trained, with their per-token ``weight_version_spans``): the staleness of every trained
generated token, ``step - version of the weights that generated it``, and how many rows
hold a call that new weights interrupted (two spans that touch).

The default job uses the simulated backend: under "continue" a call samples all its
tokens from the weights current when it ends; under "interrupt" each token from the
weights current when it is produced (the call's latency spread over its tokens).

Run: ``python benchmarks/bench_interrupt.py [--steps 100] [--repeat 2] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.history._trail_check import check_trail
from rollout_recovery.job import run_job

MODES = ("continue", "interrupt")


def _one(mode: str, steps: int, root: Path, index: int) -> dict[str, Any]:
    config = config_from_builtins(
        {"job": {"steps": steps}, "generation": {"on_weight_update": mode}}
    )
    out = root / f"{mode}-{index}"
    started = time.perf_counter()
    result = run_job(out, config, log=lambda _line: None)
    seconds = time.perf_counter() - started
    staleness: Counter[int] = Counter()
    interrupted = rows = 0
    for step, row in check_trail(out, complete=False).rows:
        if not row.valid:
            continue
        rows += 1
        spans = row.weight_version_spans
        for version, start, end in spans:
            staleness[step - version] += end - start
        if any(a[2] == b[1] and a[0] != b[0] for a, b in itertools.pairwise(spans)):
            interrupted += 1
    tokens = sum(staleness.values())
    return {
        "mode": mode,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "last_tenth_reward": result.summary.last_tenth_reward,
        "rows": rows,
        "interrupted_rows": interrupted,
        "tokens": tokens,
        "staleness": {str(k): staleness[k] / tokens for k in sorted(staleness)},
        "mean_staleness": sum(k * n for k, n in staleness.items()) / tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-interrupt-") as tmp:
        for index in range(args.repeat):
            for mode in MODES:
                run = _one(mode, args.steps, Path(tmp), index)
                runs.append(run)
                print(
                    f"{mode:>9} #{index}: {run['steps_per_s']:.3f} steps/s "
                    f"({run['seconds']:.1f} s), mean staleness {run['mean_staleness']:.3f}, "
                    f"interrupted rows {run['interrupted_rows']}/{run['rows']}",
                    flush=True,
                )
    ratios = [
        b["steps_per_s"] / a["steps_per_s"] for a, b in zip(runs[0::2], runs[1::2], strict=True)
    ]
    print(f"\nsteps/s ratio interrupt / continue per pair: {[round(r, 3) for r in ratios]}")
    print(f"median ratio: {statistics.median(ratios):.3f}")
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        merged: Counter[str] = Counter()
        for run in mine:
            for key, share in run["staleness"].items():
                merged[key] += share / len(mine)
        shares = ", ".join(
            f"{k}: {v:.3f}" for k, v in sorted(merged.items(), key=lambda kv: int(kv[0]))
        )
        print(
            f"{mode:>9}: steps/s {statistics.mean(r['steps_per_s'] for r in mine):.3f}, "
            f"staleness share of trained tokens {{{shares}}}, mean "
            f"{statistics.mean(r['mean_staleness'] for r in mine):.3f}, last-tenth reward "
            f"{statistics.mean(r['last_tenth_reward'] for r in mine):.3f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": runs, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
