"""What reading a run's whole history costs at the start and at the end of a process.

1. **The start's history check** (``AuditTrail.require_synced_history``, issue 24 item
   3): every line of ``events.jsonl`` checksummed, streamed, nothing decoded, before
   anything trains. Reported in MB/s, best of ``--repeat``, for the journal of a real run
   and for that journal repeated to the length of a long run.
2. **A process end** (issue 24 item 7): what the job reads back for its summary and its
   reward plot. *Before*: the whole journal decoded into a list (its bytes read at once,
   as the old reader did) and the metrics read whole, as ``_plot`` and ``_summary`` did.
   *After*: ``RunReadback.read`` (metrics line by line, only ``checkpoint_committed``
   records decoded). Each case runs in a fresh interpreter; reported: the peak of
   ``tracemalloc`` while reading, and the process's peak RSS (``ru_maxrss``) after it
   minus the same before it.

The runs: the default job (``--steps`` steps, real), and copies of it whose journal and
metrics are that run's repeated until they hold about ``--long-steps`` steps (each
journal line is whole on its own: its checksum covers only itself).

Run: ``python benchmarks/bench_history_read.py [--steps 20] [--long-steps 1500]
[--repeat 5] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec

from rollout_recovery.control import load_config
from rollout_recovery.history import AuditTrail
from rollout_recovery.history._journal import JournalStream, scan_journal
from rollout_recovery.history.records import CheckpointCommitted
from rollout_recovery.job import run_job
from rollout_recovery.job._readback import RunReadback
from rollout_recovery.rundir import CheckpointStore, RunDirectory


def _make_run(root: Path, steps: int) -> Path:
    """The default job (what ``rollout-recovery run`` runs without --config), ``steps``
    steps of it."""
    config = load_config(None)
    out = root / f"run-{steps}"
    job = msgspec.structs.replace(config.job, steps=steps)
    run_job(out, msgspec.structs.replace(config, job=job))
    return out


def lengthened(source: Path, target: Path, times: int) -> Path:
    """A copy of the run ``source`` whose journal and metrics are its own ``times``
    over (the metrics' steps renumbered): a long run's history, read like one."""
    shutil.copytree(source, target)
    journal = (source / "events.jsonl").read_bytes()
    with open(target / "events.jsonl", "wb") as events:
        for _ in range(times):
            events.write(journal)
    lines = [json.loads(line) for line in (source / "metrics.jsonl").read_text().splitlines()]
    with open(target / "metrics.jsonl", "w") as metrics:
        for copy in range(times):
            for values in lines:
                metrics.write(json.dumps({**values, "step": copy * len(lines) + values["step"]}))
                metrics.write("\n")
    return target


# ------------------------------------------------------------------ 1. the start's check


def _check_speed(out: Path, repeat: int) -> dict[str, Any]:
    run = RunDirectory(out)
    size = run.events.stat().st_size
    store = CheckpointStore(out, keep=3)
    verify, whole = math.inf, math.inf
    for _ in range(repeat):
        started = time.perf_counter()
        JournalStream(run.events).verify()
        verify = min(verify, time.perf_counter() - started)
        started = time.perf_counter()
        AuditTrail.require_synced_history(run, store)
        whole = min(whole, time.perf_counter() - started)
    return {
        "journal_mb": size / 1e6,
        "records": JournalStream(run.events).verify().records,
        "verify_s": verify,
        "verify_mb_s": size / 1e6 / verify,
        "check_s": whole,
    }


# ----------------------------------------------------------------- 2. a process end


def _before(run: RunDirectory) -> int:
    """The old end-of-run reads: the journal's bytes and every record, the metrics whole
    (read twice: once for the summary, once for the plot)."""
    data = run.events.read_bytes()
    records = [entry.record for entry in scan_journal(run.events).entries]
    checkpoints = [r.step for r in records if isinstance(r, CheckpointCommitted)]
    rewards = []
    for _ in range(2):
        text = run.metrics.read_bytes()
        metrics = [json.loads(line) for line in text.splitlines() if line.strip()]
        rewards = [m.get("mean_reward") for m in metrics]
    return len(data) + len(checkpoints) + len(rewards)


def _after(run: RunDirectory) -> int:
    found = RunReadback.read(run)
    return len(found.checkpoints) + len(found.steps)


def _child(case: str, out: str) -> None:
    run = RunDirectory(Path(out))
    read = _before if case == "before" else _after
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    started = time.perf_counter()
    read(run)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "tracemalloc_peak_mb": peak / 2**20,
                "rss_growth_mb": (rss_after - rss_before) / 1024,
                "seconds": seconds,
            }
        )
    )


def _end_of_run(out: Path, case: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, __file__, "--child", case, str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps of the real run")
    parser.add_argument("--long-steps", type=int, default=1500, help="steps of the long copy")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as root:
        short = _make_run(Path(root), args.steps)
        times = max(1, round(args.long_steps / args.steps))
        long = lengthened(short, Path(root) / "long", times)
        for label, out in ((f"{args.steps} steps", short), (f"{args.steps * times} steps", long)):
            row: dict[str, Any] = {"run": label, **_check_speed(out, args.repeat)}
            for case in ("before", "after"):
                row[case] = _end_of_run(out, case)
            rows.append(row)
            print(json.dumps(row))
    print()
    print("| run | journal | records | checksum pass | MB/s | start's whole check |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['run']} | {row['journal_mb']:.2f} MB | {row['records']:,} | "
            f"{row['verify_s'] * 1e3:.1f} ms | {row['verify_mb_s']:.0f} | "
            f"{row['check_s'] * 1e3:.1f} ms |"
        )
    print()
    print("| run | end-of-run reads | tracemalloc peak | RSS growth | time |")
    print("|---|---|---:|---:|---:|")
    for row in rows:
        for case in ("before", "after"):
            found = row[case]
            print(
                f"| {row['run']} | {case} | {found['tracemalloc_peak_mb']:.1f} MB | "
                f"{found['rss_growth_mb']:.1f} MB | {found['seconds'] * 1e3:.0f} ms |"
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
