"""The embedded backend against Ray on this machine, side by side in one run (issue 11).

1. Attempts per second: the same two-call episodes (numpy policy, no latency, no faults)
   through ``SimulatedAgentBackend`` staging into one SQLite file, and through
   ``RayGenerationBackend`` (``--actors`` actors) staging into ``--shards`` Ray data shards.
2. Staged MB/s: ``--rows`` puts of one ``--tokens``-token row each (what a long agent call
   stages), into the embedded SQLite store and through a worker's client into the shards.
3. Checkpoint hold: the main job (``--steps`` steps) with each backend; the longest
   exclusive hold of its checkpoints. A checkpoint copies no rows with either store, so
   the hold should not grow with Ray.
4. Controller cost per seal (backend-independent, the number the 64-node estimate in
   ``docs/ARCHITECTURE.md`` rests on): one ``sibling_seals`` barrier section, the ledger
   seal of a two-call receipt, and its journal record, with ``--groups`` groups of 16 in the
   ledger.

Run: ``pip install -e '.[ray]' && python benchmarks/bench_ray.py [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from rollout_recovery import DataPlaneCheckpointBarrier, RolloutRecoveryLedger
from rollout_recovery.capture import CaptureWriter
from rollout_recovery.capture._receipt import assemble_receipt
from rollout_recovery.cluster import RayConfig
from rollout_recovery.cluster._pool import RayGenerationBackend
from rollout_recovery.cluster._sharded_plane import RayShardedDataPlane, ShardDirectory
from rollout_recovery.cluster._worker import WorkerSpec
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.dataplane import DataPlane, MemoryDataPlane, Row, SqliteDataPlane
from rollout_recovery.history import AuditTrail
from rollout_recovery.history.records import Seal, SiblingSealed
from rollout_recovery.job import run_job
from rollout_recovery.policy import NumpyGRPOTrainer, TaskConfig, TaskSet
from rollout_recovery.rollout import (
    AttemptRequest,
    AttemptResult,
    DigitTask,
    FaultsConfig,
    GenerationConfig,
    SimulatedAgentBackend,
)
from rollout_recovery.rundir import RunDirectory

# One episode shape for both backends, written once: two calls (one thinking call and the
# answer), the episode of the embedded backend's default and of e894b17's Ray worker, so
# ``bench_revisions.py --only ray`` compares like with like (``[task]``'s default is four
# calls).
TASK = TaskConfig(dataset_size=4096, prompt_group_every=4, thinking_calls=1)
TASKS = TaskSet.from_config(TASK, seed=0)
EPISODES = DigitTask(TASKS, TASK)


async def _attempts(backend: Any, writer: CaptureWriter, count: int, concurrency: int) -> float:
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with slots:
            request = AttemptRequest(
                group_id=f"g{i}",
                generation_index=0,
                rollout_id=f"g{i}_g0_a0",
                prompt=TASKS[i],
                weight_version=0,
            )
            outcome = await backend.run_attempt(request, writer)
            if not isinstance(outcome, AttemptResult):  # a failure would inflate the rate
                raise RuntimeError(f"attempt {request.rollout_id} failed: {outcome}")

    if isinstance(backend, RayGenerationBackend):
        await backend.start()  # actor start-up is not throughput
    started = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        elapsed = time.perf_counter() - started
        await backend.aclose()
    return count / elapsed


def _layout(directory: Path, shards: int) -> ShardDirectory:
    return ShardDirectory(
        prefix=f"bench-{time.monotonic_ns()}",
        namespace="rollout-recovery-bench",
        directory=str(directory),
        shards=shards,
        cpus_per_shard=0.01,
    )


def _row(tokens: int, rng: np.random.Generator) -> Row:
    return Row(
        token_ids=rng.integers(0, 50_000, tokens, dtype=np.int32),
        token_mask=np.ones(tokens, np.float32),
        logprobs=rng.standard_normal(tokens).astype(np.float32),
        metadata={"rollout_id": "x", "model_call_id": "c"},
    )


def _staged_mb_per_s(store: DataPlane, rows: int, tokens: int) -> float:
    rng = np.random.default_rng(0)
    payload = [_row(tokens, rng) for _ in range(rows)]
    size = sum(r.token_ids.nbytes + r.token_mask.nbytes + r.logprobs.nbytes for r in payload)
    started = time.perf_counter()
    for i, row in enumerate(payload):
        store.put(CaptureWriter.staging_partition, {f"g{i}_g0_a0/c": row})
    return size / (time.perf_counter() - started) / 1e6


def _longest_hold(out: Path, backend: str, steps: int) -> float:
    config = config_from_builtins(
        {
            "job": {"steps": steps},
            "generation": {"backend": backend, "call_latency_s": 0.01},
            "ray": {"actors_per_node": 2, "cpus_per_actor": 0.01, "cpus_per_shard": 0.01},
        }
    )
    result = run_job(out, config)
    return max(timing.hold_s for timing in result.checkpoints)


async def _seal_cost(groups: int, siblings: int = 16) -> float:
    """Seconds per sealed sibling on the controller: what ``Controller._seal_sibling``
    does before it awaits the group-committed flush (no I/O but the journal's write)."""
    barrier = DataPlaneCheckpointBarrier()
    ledger = RolloutRecoveryLedger()
    writer = CaptureWriter(MemoryDataPlane())
    receipts = []
    for g in range(groups):
        async with barrier.mutation(kind="prompt_reservations") as cut:
            group = ledger.reserve_group(
                cut,
                prompt_id=str(g),
                prompt_payload={"idx": g},
                expected_generations=siblings,
                target_step=0,
                start_weight_version=0,
                group_id=f"grp{g}",
            )
            ledger.mark_group_dispatched(cut, f"grp{g}")
        for index, gate in enumerate(group.gate_rollout_ids):
            first = writer.stage_call(
                rollout_id=gate,
                model_call_id="c0",
                parent=None,
                prompt_token_ids=[1, 2, 3],
                generated_token_ids=[4, 5],
                generated_logprobs=[-0.5, -0.5],
                weight_version=0,
            )
            second = writer.stage_call(
                rollout_id=gate,
                model_call_id="c1",
                parent=first,
                prompt_token_ids=[1, 2, 3, 4, 5, 6],
                generated_token_ids=[7],
                generated_logprobs=[-0.5],
                weight_version=0,
            )
            receipt = assemble_receipt(gate, [first, second], terminal_model_call_id="c1").to_dict()
            receipts.append((f"grp{g}", index, gate, receipt))
    with tempfile.TemporaryDirectory() as tmp:
        trail = AuditTrail(RunDirectory(Path(tmp)))
        started = time.perf_counter()
        for group_id, index, gate, receipt in receipts:
            async with barrier.mutation(kind="sibling_seals") as cut:
                ledger.mark_sibling_sealed(
                    cut,
                    group_id,
                    generation_index=index,
                    gate_rollout_id=gate,
                    receipt=receipt,
                    reward=1.0,
                    mask_sample=False,
                )
                seal = Seal(
                    generation_index=index,
                    rollout_id=gate,
                    receipt=receipt,
                    reward=1.0,
                    mask_sample=False,
                    tokens=3,
                    weight_versions=[0, 0],
                )
                trail.append(SiblingSealed(group_id=group_id, seal=seal))
        elapsed = time.perf_counter() - started
        trail.close()
    return elapsed / len(receipts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    ray.init(
        num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False
    )
    results: dict[str, Any] = {}
    weights = NumpyGRPOTrainer(seed=0).weights()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        embedded = SqliteDataPlane(scratch / "embedded.sqlite")
        simulated = SimulatedAgentBackend(
            GenerationConfig(workers=args.actors, call_latency_s=0.0, latency_jitter=0.0),
            faults=FaultsConfig.only(),
            episodes=EPISODES,
            seed=0,
            initial_weights=weights,
            data_plane=embedded,
        )
        results["embedded attempts/s"] = asyncio.run(
            _attempts(simulated, CaptureWriter(embedded), args.attempts, args.concurrency)
        )
        plane = RayShardedDataPlane.start(_layout(scratch / "shards", args.shards))
        spec = WorkerSpec(
            kind="simulated",
            shards=plane.layout,
            seed=0,
            episodes=EPISODES,
            generation=GenerationConfig(call_latency_s=0.0, latency_jitter=0.0),
        )
        pool = RayGenerationBackend(
            RayConfig(actors_per_node=args.actors, cpus_per_actor=0.01),
            spec=spec,
            plane=plane,
            initial_weights=weights,
        )
        results["ray attempts/s"] = asyncio.run(
            _attempts(pool, CaptureWriter(plane), args.attempts, args.concurrency)
        )
        results["embedded staged MB/s"] = _staged_mb_per_s(
            SqliteDataPlane(scratch / "put.sqlite"), args.rows, args.tokens
        )
        plane2 = RayShardedDataPlane.start(_layout(scratch / "put-shards", args.shards))
        worker = RayShardedDataPlane(plane2.layout, writer="bench-worker")
        results["ray staged MB/s"] = _staged_mb_per_s(worker, args.rows, args.tokens)
        plane.close(stop_shards=True)
        plane2.close(stop_shards=True)
        results["embedded longest hold ms"] = 1000 * _longest_hold(
            scratch / "job-embedded", "simulated", args.steps
        )
        results["ray longest hold ms"] = 1000 * _longest_hold(
            scratch / "job-ray", "ray", args.steps
        )
    ray.shutdown()
    results["controller us per seal"] = 1e6 * asyncio.run(_seal_cost(args.groups))
    print(
        f"controller cost per seal: {results['controller us per seal']:.1f} us "
        f"({args.groups} groups of 16 in the ledger)"
    )
    for what in ("attempts/s", "staged MB/s", "longest hold ms"):
        embedded_value, ray_value = results[f"embedded {what}"], results[f"ray {what}"]
        print(
            f"{what:<16} embedded {embedded_value:>9.2f}   ray {ray_value:>9.2f}   "
            f"ray/embedded {ray_value / embedded_value:>6.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
