"""What the write-ahead journal costs and what a restore from it costs, side by side.

1. **Group commit**: records per second of one :class:`JournalWriter` when ``C`` tasks
   each append a seal-sized record and await ``flush()`` (acknowledged only once durable),
   for several ``C``; with the syncs they shared. Beside it: appends alone (no flush).
2. **The default job with and without fsync**: the journal cannot be switched off (the
   restore is built on it), so the job runs with its ``fdatasync`` replaced by a no-op
   (the benchmark-only seam ``history._journal._fdatasync``) against the real one, runs
   interleaved. Reported: steps per second, and each seal's latency from its ledger
   mutation (the record appended inside the cut) to its acknowledgement (``flush()``
   returned), and the journal's bytes per step.
3. **Restore time against journal length**: the default job (10 ms calls) SIGKILLed after
   step S, then the restore alone, timed in-process on a copy of the run directory:
   verification (every file decoded, the journal after the snapshot scanned and replayed
   on scratch copies, rows checked) and the restore (replay, inventory, rebinding). Two
   series: checkpoints only at step 0, so the replay grows with S; and checkpoints every
   2 steps, so the replay stays short while the journal before the snapshot grows.

Run: ``python benchmarks/bench_journal.py [--parts commit,job,restore] [--repeat 2]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollout_recovery.control import Controller, load_config
from rollout_recovery.control._checkpointing import VerifiedCheckpoint
from rollout_recovery.history import AuditTrail, _journal
from rollout_recovery.history._journal import JournalWriter
from rollout_recovery.history.records import GroupSealed, HistoryRecord, Seal, SiblingSealed
from rollout_recovery.job import run_job
from rollout_recovery.job._components import default_components, job_data_plane
from rollout_recovery.rundir import CheckpointStore, RunDirectory

# ------------------------------------------------------------------------ 1. group commit


def _seal_record(number: int) -> SiblingSealed:
    """A record the size of the default job's seals (about 1.9 KB: a two-call receipt)."""
    call = {
        "model_call_id": f"call-{number:016x}",
        "parent_call_id": None,
        "mode": "text",
        "prev_len": 0,
        "delta_len": 11,
        "cum_len": 11,
        "weight_version": 0,
        "digest": "d9b916a1" * 8,
        "extras_digest": "a1edc33c" * 8,
        "chain_hash": "60927920" * 8,
        "cumulative_hash": "b777e798" * 8,
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "staging_key": f"g{number:07d}_g0_a{number:032x}/call-{number:016x}",
    }
    rollout_id = f"g{number:07d}_g0_a{number:032x}"
    receipt = {
        "rollout_id": rollout_id,
        "terminal_model_call_id": call["model_call_id"],
        "manifest": [call, dict(call, mode="token_in", prev_len=11, cum_len=14)],
        "capture_poisoned": False,
        "failure_reason": None,
        "reward": 0.0,
    }
    return SiblingSealed(
        group_id=f"g{number:07d}",
        seal=Seal(
            generation_index=0,
            rollout_id=rollout_id,
            receipt=receipt,
            reward=0.0,
            mask_sample=False,
            tokens=6,
            weight_versions=[0, 0],
        ),
    )


async def _committers(writer: JournalWriter, records: list[SiblingSealed], tasks: int) -> None:
    queue = iter(records)

    async def committer() -> None:
        for record in queue:
            writer.append(record)
            await writer.flush()

    await asyncio.gather(*(committer() for _ in range(tasks)))


def group_commit(records: int, concurrency: list[int], scratch: Path) -> list[dict[str, Any]]:
    batch = [_seal_record(number) for number in range(records)]
    size = len(_journal.frame_record(batch[0]))
    rows = []
    path = scratch / "append-only.jsonl"
    writer = JournalWriter(path)
    started = time.perf_counter()
    for record in batch:
        writer.append(record)
    writer.sync()
    seconds = time.perf_counter() - started
    writer.close()
    rows.append(
        {
            "case": "append only, one sync at the end",
            "tasks": 1,
            "records_per_s": records / seconds,
            "syncs": 1,
            "records_per_sync": records,
            "record_bytes": size,
        }
    )
    for tasks in concurrency:
        path = scratch / f"commit-{tasks}.jsonl"
        writer = JournalWriter(path)
        started = time.perf_counter()
        asyncio.run(_committers(writer, batch, tasks))
        seconds = time.perf_counter() - started
        writer.close()
        rows.append(
            {
                "case": f"append + flush, {tasks} concurrent committers",
                "tasks": tasks,
                "records_per_s": records / seconds,
                "syncs": writer.syncs,
                "records_per_sync": records / max(1, writer.syncs),
                "record_bytes": size,
            }
        )
    return rows


# ------------------------------------------------------------------ 2. the default job


@contextlib.contextmanager
def _seal_latencies(into: list[float]) -> Iterator[None]:
    """Time each seal from its record's append (inside the cut, right after the ledger's
    mutation) to the end of the seal call (after ``flush()``: the acknowledgement)."""
    appended: dict[asyncio.Task[Any], float] = {}
    record, sibling, cohort = Controller.record, Controller._seal_sibling, Controller._seal_cohort

    def timed_record(self: Controller, item: HistoryRecord) -> None:
        record(self, item)
        if isinstance(item, SiblingSealed | GroupSealed):
            task = asyncio.current_task()
            if task is not None:
                appended[task] = time.perf_counter()

    def acknowledged() -> None:
        task = asyncio.current_task()
        start = appended.pop(task, None) if task is not None else None
        if start is not None:
            into.append(time.perf_counter() - start)

    async def timed_sibling(self: Controller, *args: Any, **kwargs: Any) -> None:
        await sibling(self, *args, **kwargs)
        acknowledged()

    async def timed_cohort(self: Controller, *args: Any, **kwargs: Any) -> None:
        await cohort(self, *args, **kwargs)
        acknowledged()

    Controller.record = timed_record  # type: ignore[method-assign]
    Controller._seal_sibling = timed_sibling  # type: ignore[method-assign]
    Controller._seal_cohort = timed_cohort  # type: ignore[method-assign]
    try:
        yield
    finally:
        Controller.record = record  # type: ignore[method-assign]
        Controller._seal_sibling = sibling  # type: ignore[method-assign]
        Controller._seal_cohort = cohort  # type: ignore[method-assign]


@contextlib.contextmanager
def _fsync(enabled: bool) -> Iterator[None]:
    real = _journal._fdatasync
    if not enabled:
        _journal._fdatasync = lambda fd: None
    try:
        yield
    finally:
        _journal._fdatasync = real


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def default_job(repeat: int, scratch: Path) -> dict[str, Any]:
    config = load_config(None)
    runs: dict[str, list[dict[str, Any]]] = {"fsync on": [], "fsync off": []}
    for number in range(repeat):
        for label in ("fsync on", "fsync off") if number % 2 == 0 else ("fsync off", "fsync on"):
            out = scratch / f"job-{label.replace(' ', '-')}-{number}"
            latencies: list[float] = []
            with _fsync(label == "fsync on"), _seal_latencies(latencies):
                started = time.perf_counter()
                result = run_job(out, config)
                seconds = time.perf_counter() - started
            steps = result.summary.steps
            journal = RunDirectory(out).events.stat().st_size
            runs[label].append(
                {
                    "steps": steps,
                    "seconds": seconds,
                    "steps_per_s": steps / seconds,
                    "seals": len(latencies),
                    "seal_ms_median": statistics.median(latencies) * 1e3,
                    "seal_ms_p99": _percentile(latencies, 0.99) * 1e3,
                    "journal_bytes": journal,
                    "journal_bytes_per_step": journal / steps,
                }
            )
            print(f"  {label}, run {number + 1}: {steps / seconds:.3f} steps/s", file=sys.stderr)
            shutil.rmtree(out, ignore_errors=True)
    summary = {
        label: {
            "steps_per_s_best": max(r["steps_per_s"] for r in rows),
            "steps_per_s_median": statistics.median(r["steps_per_s"] for r in rows),
            "seal_ms_median": statistics.median(r["seal_ms_median"] for r in rows),
            "seal_ms_p99": statistics.median(r["seal_ms_p99"] for r in rows),
            "journal_bytes_per_step": statistics.median(r["journal_bytes_per_step"] for r in rows),
            "runs": rows,
        }
        for label, rows in runs.items()
    }
    on, off = summary["fsync on"], summary["fsync off"]
    summary["steps_per_s_on_over_off"] = on["steps_per_s_median"] / off["steps_per_s_median"]
    summary["seal_ms_added_median"] = on["seal_ms_median"] - off["seal_ms_median"]
    return summary


# ------------------------------------------------------------------------- 3. restore


def _killed_run(out: Path, config: Path, step: int) -> None:
    """The job, SIGKILLed (its whole process group) once it printed ``step S/``."""
    command = [sys.executable, "-m", "rollout_recovery", "run", "--out", str(out)]
    command += ["--config", str(config), "--plain"]
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith(f"step {step - 1} ("):
            os.killpg(child.pid, signal.SIGKILL)
            break
    child.stdout.close()
    if child.wait() != -signal.SIGKILL:
        raise RuntimeError(f"the job was not killed after step {step}")


def _time_restore(run_dir: Path) -> dict[str, Any]:
    run = RunDirectory(run_dir)
    config = load_config(run.job_file)
    journal = run.events.stat().st_size  # before the restore appends its records
    with job_data_plane(run, config) as inner:
        history = AuditTrail(run)
        parts = default_components(config, inner)
        controller = Controller(
            config=config,
            dataset=parts.dataset,
            backend=parts.backend,
            trainer=parts.trainer,
            data_plane=inner,
            history=history,
            checkpoint_store=CheckpointStore(run.root, keep=config.checkpoint.keep),
        )

        async def restore() -> tuple[float, float, Any, VerifiedCheckpoint]:
            started = time.perf_counter()
            found = controller.checkpoints.store.newest_loadable(controller.checkpoints.verify)
            verified = time.perf_counter()
            assert found is not None
            checkpoint = found[1]
            report = await controller.restore(checkpoint)
            done = time.perf_counter()
            await controller.backend.aclose()
            return verified - started, done - verified, report, checkpoint

        try:
            verify_s, restore_s, report, checkpoint = asyncio.run(restore())
        finally:
            history.close()
    return {
        "verify_s": verify_s,
        "restore_s": restore_s,
        "replayed_records": report.replayed_records,
        "bytes_after_snapshot": journal - checkpoint.position,
        "snapshot_position": checkpoint.position,
    }


def restore_table(
    steps: list[int], every: list[int], repeat: int, scratch: Path
) -> list[dict[str, Any]]:
    rows = []
    for interval in every:
        config = scratch / f"restore-{interval}.toml"
        config.write_text(
            f"[job]\nsteps = 100000\n\n[generation]\ncall_latency_s = 0.01\n\n"
            f"[checkpoint]\nevery_steps = {interval}\n"
        )
        for step in steps:
            original = scratch / f"restore-{interval}-{step}"
            _killed_run(original, config, step)
            journal = (original / "events.jsonl").stat().st_size
            timings = []
            for attempt in range(repeat):
                copy = scratch / f"restore-{interval}-{step}-copy{attempt}"
                shutil.copytree(original, copy)
                timings.append(_time_restore(copy))
                shutil.rmtree(copy)
            shutil.rmtree(original)
            best = min(timings, key=lambda t: t["verify_s"] + t["restore_s"])
            rows.append(
                {
                    "checkpoint_every": interval,
                    "killed_after_step": step,
                    "journal_bytes": journal,
                    **best,
                    "total_s": best["verify_s"] + best["restore_s"],
                }
            )
            print(
                f"  every {interval}, step {step}: {best['replayed_records']} records "
                f"replayed in {rows[-1]['total_s']:.3f} s",
                file=sys.stderr,
            )
    return rows


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="commit,job,restore")
    parser.add_argument("--records", type=int, default=20_000, help="records per commit case")
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--repeat", type=int, default=2, help="job runs per side; restores per row")
    parser.add_argument("--steps", default="10,40,160", help="restore: kill after these steps")
    parser.add_argument("--every", default="100000,2", help="restore: checkpoint intervals")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-journal-") as tmp:
        scratch = Path(tmp)
        if "commit" in parts:
            print("group commit ...", file=sys.stderr)
            concurrency = [int(c) for c in args.concurrency.split(",")]
            results["group_commit"] = group_commit(args.records, concurrency, scratch)
            print(f"\n{'case':<44}{'records/s':>12}{'syncs':>8}{'records/sync':>14}")
            for row in results["group_commit"]:
                print(
                    f"{row['case']:<44}{row['records_per_s']:>12,.0f}{row['syncs']:>8}"
                    f"{row['records_per_sync']:>14.1f}"
                )
        if "job" in parts:
            print("the default job, fsync on and off ...", file=sys.stderr)
            job = default_job(args.repeat, scratch)
            results["default_job"] = job
            print(f"\n{'':<12}{'steps/s':>10}{'seal ms p50':>13}{'seal ms p99':>13}{'B/step':>10}")
            for label in ("fsync on", "fsync off"):
                row = job[label]
                print(
                    f"{label:<12}{row['steps_per_s_median']:>10.3f}{row['seal_ms_median']:>13.2f}"
                    f"{row['seal_ms_p99']:>13.2f}{row['journal_bytes_per_step']:>10,.0f}"
                )
            print(
                f"steps/s with fsync / without: {job['steps_per_s_on_over_off']:.3f}; "
                f"seal latency added (median): {job['seal_ms_added_median']:.2f} ms"
            )
        if "restore" in parts:
            print("restore time against journal length ...", file=sys.stderr)
            steps = [int(s) for s in args.steps.split(",")]
            every = [int(e) for e in args.every.split(",")]
            results["restore"] = restore_table(steps, every, args.repeat, scratch)
            print(
                f"\n{'ckpt every':>10}{'kill step':>10}{'journal MB':>12}{'after snap MB':>15}"
                f"{'replayed':>10}{'verify s':>10}{'restore s':>11}{'total s':>9}"
            )
            for row in results["restore"]:
                print(
                    f"{row['checkpoint_every']:>10}{row['killed_after_step']:>10}"
                    f"{row['journal_bytes'] / 1e6:>12.2f}{row['bytes_after_snapshot'] / 1e6:>15.2f}"
                    f"{row['replayed_records']:>10}{row['verify_s']:>10.3f}"
                    f"{row['restore_s']:>11.3f}{row['total_s']:>9.3f}"
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
