"""The checkpoint's exclusive hold against the ledger's size, side by side in one run.

Since checkpoints became snapshots of the journal, the hold (``CheckpointCommitted.hold_us``,
the time inside ``barrier.checkpoint()``) only takes the journal's position: it should not
grow with the ledger. The snapshot itself (the builder's replay of the records since the
last snapshot, the sidecar encoding, the fsynced write) runs after the hold, with
generation going on; its time is reported beside the hold.

For each ledger size: ``G`` admitted groups of 4 siblings, 3 sealed with a one-call
receipt (the shape of the default job's ledger at a checkpoint, ``G`` times). Then
``--repeat`` checkpoints, each after a few live seals through the controller (journaled and
flushed, so every snapshot has records to replay). The inner row store is the in-memory
one (rows are never touched by the hold; filling 150,000 fsynced SQLite puts would only
make the setup slow).

Run: ``python benchmarks/bench_checkpoint_hold.py --groups 160,5000,50000 [--repeat 5]
[--json]``. With ``--json`` the results are printed as one JSON document instead of the
table. Pass/fail lines check the issue's bounds: the longest hold at the largest ledger
under 50 ms and within 2x of the smallest's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from rollout_recovery.capture._receipt import Receipt, assemble_receipt
from rollout_recovery.control import Controller, load_config
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.history import AuditTrail
from rollout_recovery.job._components import default_components
from rollout_recovery.rollout import AttemptResult
from rollout_recovery.rundir import CheckpointStore, RunDirectory

#: Siblings per group, and how many of them the fill seals.
N = 4
SEALED = 3
#: Live seals (of the 4th sibling of a group) before each checkpoint.
SEALS_PER_CHECKPOINT = 16


def _controller(run: Path, groups: int) -> Controller:
    base = msgspec.to_builtins(load_config(None))
    # A dataset as large as the ledger, so every group has its own prompt.
    base["task"]["dataset_size"] = max(base["task"]["dataset_size"], groups)
    config = config_from_builtins(base)
    inner = MemoryDataPlane()
    parts = default_components(config, inner)
    return Controller(
        config=config,
        dataset=parts.dataset,
        backend=parts.backend,
        trainer=parts.trainer,
        data_plane=inner,
        history=AuditTrail(RunDirectory(run)),
        checkpoint_store=CheckpointStore(run, keep=2),
    )


def _staged(controller: Controller, rollout_id: str, prompt: list[int]) -> Receipt:
    """One staged call of ``rollout_id`` and the receipt naming it."""
    record = controller.capture.stage_call(
        rollout_id=rollout_id,
        model_call_id="c0",
        parent=None,
        prompt_token_ids=np.asarray(prompt, dtype=np.int32),
        generated_token_ids=np.array([7, 8], dtype=np.int32),
        generated_logprobs=np.full(2, -0.5, dtype=np.float32),
        weight_version=0,
    )
    return assemble_receipt(rollout_id, [record], terminal_model_call_id="c0")


async def _fill(controller: Controller, groups: int) -> None:
    """``groups`` admitted groups, ``SEALED`` of their ``N`` siblings sealed (not journaled:
    the snapshot builder starts from this state, as after a restore)."""
    ledger = controller.ledger
    for g in range(groups):
        prompt = controller.dataset[g]
        async with controller.barrier.mutation("prompt_reservations") as cut:
            record = ledger.reserve_group(
                cut,
                prompt_id=str(g),
                prompt_payload=prompt,
                expected_generations=N,
                target_step=0,
                start_weight_version=0,
                group_id=f"g{g:07d}",
            )
            ledger.mark_group_dispatched(cut, record.group_id)
            for index in range(SEALED):
                rollout_id = record.gate_rollout_id(index)
                ledger.mark_sibling_sealed(
                    cut,
                    record.group_id,
                    generation_index=index,
                    gate_rollout_id=rollout_id,
                    receipt=_staged(controller, rollout_id, prompt["prompt_token_ids"]).to_dict(),
                    reward=1.0,
                    mask_sample=False,
                )


async def _live_seals(controller: Controller, start: int, count: int) -> None:
    """Seal the last sibling of ``count`` groups the way the controller does (journaled,
    acknowledged after the flush)."""
    for g in range(start, start + count):
        group = controller.ledger.get_group(f"g{g:07d}")
        rollout_id = group.gate_rollout_id(N - 1)
        receipt = _staged(controller, rollout_id, controller.dataset[g]["prompt_token_ids"])
        result = AttemptResult(
            rollout_id=rollout_id,
            receipt=receipt,
            reward=0.5,
            mask_sample=False,
            reward_checks=None,
            generated_tokens=2,
        )
        await controller._seal_sibling(group.group_id, N - 1, result)


def measure(groups: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-hold-") as tmp:
        run = Path(tmp)
        controller = _controller(run, groups)

        async def scenario() -> tuple[float, list[Any]]:
            started = time.perf_counter()
            await _fill(controller, groups)
            controller.follow_journal()
            fill_s = time.perf_counter() - started
            timings = []
            for round_ in range(repeat):
                count = min(SEALS_PER_CHECKPOINT, groups // repeat)
                await _live_seals(controller, round_ * count, count)
                timings.append(await controller.checkpoint())
            await controller.backend.aclose()
            return fill_s, timings

        fill_s, timings = asyncio.run(scenario())
        sidecar = max(
            (p.stat().st_size for p in run.glob("checkpoints/step_*/rollout_recovery.*")),
            default=0,
        )
        controller.history.close()
    holds = [t.hold_s * 1e3 for t in timings]
    writes = [t.write_s * 1e3 for t in timings]
    return {
        "groups": groups,
        "siblings": groups * N,
        "fill_s": round(fill_s, 2),
        "checkpoints": len(timings),
        "hold_ms_max": max(holds),
        "hold_ms_median": statistics.median(holds),
        "stall_ms_max": max(t.stall_s * 1e3 for t in timings),
        "write_ms_median": statistics.median(writes),
        "sidecar_mb": sidecar / 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="160,5000,50000", help="ledger sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=5, help="checkpoints per size")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    sizes = [int(text) for text in args.groups.split(",")]
    rows = []
    for groups in sizes:
        print(f"measuring {groups} groups ...", file=sys.stderr)
        rows.append(measure(groups, args.repeat))
    base = rows[0]["hold_ms_max"]
    for row in rows:
        row["hold_vs_smallest"] = row["hold_ms_max"] / base if base else None
    largest = rows[-1]
    checks = {
        "largest_hold_under_50_ms": largest["hold_ms_max"] < 50.0,
        "largest_hold_within_2x_of_smallest": largest["hold_ms_max"] <= 2 * base,
    }
    if args.json:
        print(json.dumps({"sizes": rows, "checks": checks}, indent=2))
    else:
        print(
            f"{'groups':>8}{'siblings':>10}{'max hold ms':>13}{'median hold':>13}"
            f"{'max stall ms':>14}{'vs smallest':>13}{'snapshot ms':>13}{'sidecar MB':>12}"
        )
        for row in rows:
            print(
                f"{row['groups']:>8}{row['siblings']:>10}{row['hold_ms_max']:>13.3f}"
                f"{row['hold_ms_median']:>13.3f}{row['stall_ms_max']:>14.3f}"
                f"{row['hold_vs_smallest']:>12.2f}x{row['write_ms_median']:>13.1f}"
                f"{row['sidecar_mb']:>12.1f}"
            )
        for name, ok in checks.items():
            print(f"{name}: {'pass' if ok else 'FAIL'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
