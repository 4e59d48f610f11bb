"""The main job's numbers, side by side in one run.

1. One SIGKILL mid-run of the default job, then the same command again: what the
   restore kept (sealed siblings from the journal, finished groups waiting to train,
   staged calls of interrupted attempts kept for call-level resume) against what it
   generates again, next to what a restart that discards all unfinished work (what other
   frameworks do) regenerates: all of it.
2. Steps per second of the default job (fresh run, no kill), ``--repeat`` runs.

The checkpoint hold has its own benchmark (``bench_checkpoint_hold.py``), and so do the
journal's costs (``bench_journal.py``).

Run: ``python benchmarks/bench_run.py [--kill-after-step 12] [--repeat 1] [--json out.json]``.
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

from rollout_recovery.control import load_config
from rollout_recovery.history._trail_reader import read_records
from rollout_recovery.history.records import Restored


def _run_cli(out: Path, *, kill_after_step: int | None = None) -> tuple[int, float, str]:
    command = [sys.executable, "-m", "rollout_recovery", "run", "--out", str(out), "--plain"]
    started = time.monotonic()
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert child.stdout is not None
    lines = []
    for line in child.stdout:
        lines.append(line)
        if kill_after_step is not None and line.startswith(f"step {kill_after_step - 1} ("):
            os.killpg(child.pid, signal.SIGKILL)
            break
    child.wait()
    return child.returncode, time.monotonic() - started, "".join(lines)


def kill_case(kill_after_step: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        code, _, _ = _run_cli(out, kill_after_step=kill_after_step)
        assert code == -signal.SIGKILL, code
        code, _, text = _run_cli(out)
        assert code == 0, text
        restores = [r for _, r in read_records(out / "events.jsonl") if isinstance(r, Restored)]
    restored = restores[-1]
    reused, lost = restored.tokens_reused, restored.tokens_lost
    buffered = restored.canonical_tokens_kept
    in_flight, resumable = restored.tokens_in_flight_lost, restored.tokens_resumable
    return {
        "killed_after_step": kill_after_step,
        "restored_step": restored.step,
        "journal_records_replayed": restored.replayed_records,
        "sealed_siblings_kept": restored.sealed_siblings_kept,
        "canonical_groups_kept": restored.canonical_groups,
        "tokens_reused_sealed": reused,
        "tokens_reused_buffered": buffered,
        "tokens_kept_to_resume": resumable,
        "tokens_regenerated": lost + in_flight,
        # Other frameworks drop buffered and in-flight rollouts: everything sealed or
        # finished but not yet trained, and every staged call, is generated again.
        "discard_all_tokens_regenerated": reused + buffered + resumable + lost + in_flight,
    }


def default_job_case() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        code, seconds, text = _run_cli(Path(tmp) / "run")
        assert code == 0, text
    steps = load_config(None).job.steps
    return {"steps": steps, "seconds": seconds, "steps_per_second": steps / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill-after-step", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=1, help="default-job runs to time")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    kill = kill_case(args.kill_after_step)
    print("one SIGKILL of the default job, then the same command again")
    for key, value in kill.items():
        print(f"  {key}: {value}")
    saved = kill["discard_all_tokens_regenerated"] / max(1, kill["tokens_regenerated"])
    print(f"  discard-all regenerates {saved:.1f}x the tokens we regenerate")
    jobs = [default_job_case() for _ in range(args.repeat)]
    rates = [job["steps_per_second"] for job in jobs]
    print(
        f"\ndefault job: {jobs[0]['steps']} steps, "
        f"{statistics.median(rates):.2f} steps/s (median of {len(rates)}: "
        + ", ".join(f"{rate:.2f}" for rate in rates)
        + ")"
    )
    if args.json:
        args.json.write_text(json.dumps({"kill": kill, "jobs": jobs}, indent=2))


if __name__ == "__main__":
    main()
