"""Ledger checkpoint-path benchmark: 5,000 groups x 16 siblings.

Workload (issue 2): every sibling dispatched, 90% sealed with a two-call receipt, the other
10% abandoned and retried (a fresh RESERVED attempt is current). Measures what a checkpoint
or a restore holds the barrier for:

- ``state_dict``                    the ledger's part of a checkpoint
- ``from_state_dict + bind``        a restore, rebinding every prompt from the dataset
- ``build + parse sidecar``         the whole sidecar, built and validated as a reader would
- ``get_group``                     one group's copy, the hot read of the rollout pump
- memory per group                  tracemalloc of the ledger alone (payloads excluded)

The seed cannot run here (its scraped source lost its indentation and imports NeMo-RL),
so the baseline column is the seed's timing measured on this kind of machine, as given in
the issue. Run: ``python benchmarks/bench_ledger.py [--groups 5000] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollout_recovery import (
    RolloutRecoveryLedger,
    build_rollout_recovery_state,
    parse_rollout_recovery_state,
)

SEED_SECONDS = {
    "state_dict": 1.46,
    "from_state_dict + bind": 2.06,
    "build + parse sidecar": 1.58,
    "get_group": 301e-6,
}
SEED_BYTES_PER_GROUP = 24.5e3
SIBLINGS = 16


class _LiveCut:
    def require_live(self) -> None:
        return None


CUT = _LiveCut()


def _receipt(gate_id: str) -> dict[str, Any]:
    """A two-key receipt, as in the issue: the manifest names two staged model calls."""
    return {
        "rollout_id": gate_id,
        "manifest": [{"staging_key": f"{gate_id}/call-{call}"} for call in range(2)],
    }


def build_workload(groups: int, payloads: list[dict[str, Any]]) -> RolloutRecoveryLedger:
    ledger = RolloutRecoveryLedger()
    for index in range(groups):
        group_id = f"group-{index:06d}"
        ledger.reserve_group(
            CUT,
            prompt_id=str(index),
            prompt_payload=payloads[index],
            expected_generations=SIBLINGS,
            target_step=index // 64,
            start_weight_version=3,
            group_id=group_id,
            admission_id=f"batch-{index // 64}",
        )
        ledger.mark_group_dispatched(CUT, group_id)
        record = ledger.get_group(group_id)
        for sibling in range(SIBLINGS):
            # 90% of siblings seal; the rest are abandoned and retried below.
            if (index * SIBLINGS + sibling) % 10 == 9:
                continue
            gate_id = record.gate_rollout_id(sibling)
            ledger.mark_sibling_sealed(
                CUT,
                group_id,
                generation_index=sibling,
                gate_rollout_id=gate_id,
                receipt=_receipt(gate_id),
                reward=1.0,
                mask_sample=False,
            )
        if ledger.get_group(group_id).status.value == "generating":
            ledger.abandon_unsealed(CUT, group_id)
            ledger.prepare_incomplete_retry(CUT, group_id)
    return ledger


def _best_of(repeat: int, run: Callable[[], object]) -> float:
    samples = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return min(samples)


def _restore(state: dict[str, Any], payloads: list[dict[str, Any]]) -> RolloutRecoveryLedger:
    ledger = RolloutRecoveryLedger.from_state_dict(state)
    for record_group in state["groups"]:
        ledger.bind_runtime_prompt(
            CUT, record_group["group_id"], payloads[int(record_group["prompt_id"])]
        )
    return ledger


def _sidecar_round_trip(ledger: RolloutRecoveryLedger) -> None:
    sidecar = build_rollout_recovery_state(
        ledger, batch_shortfall={7: 1}, sampler_stamps_target_steps=True
    )
    parse_rollout_recovery_state(sidecar)


def measure_memory(groups: int, payloads: list[dict[str, Any]]) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ledger = build_workload(groups, payloads)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del ledger
    return (after - before) / groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/ledger.json"))
    args = parser.parse_args(argv)

    payloads = [{"idx": i, "task_name": None, "prompt": f"prompt {i}"} for i in range(args.groups)]
    ledger = build_workload(args.groups, payloads)
    state = ledger.state_dict()
    group_ids = [g["group_id"] for g in state["groups"]]
    probe = group_ids[len(group_ids) // 2]

    results = {
        "state_dict": _best_of(args.repeat, ledger.state_dict),
        "from_state_dict + bind": _best_of(args.repeat, lambda: _restore(state, payloads)),
        "build + parse sidecar": _best_of(args.repeat, lambda: _sidecar_round_trip(ledger)),
        "get_group": _best_of(args.repeat, lambda: [ledger.get_group(probe) for _ in range(1000)])
        / 1000,
    }
    bytes_per_group = measure_memory(args.groups, payloads)

    scale = args.groups / 5000
    print(f"ledger: {args.groups} groups x {SIBLINGS} siblings, best of {args.repeat}")
    print(f"{'operation':<24}{'ours':>12}{'seed':>12}{'speed-up':>10}")
    for name, seconds in results.items():
        seed = SEED_SECONDS[name] * (scale if name != "get_group" else 1.0)
        unit, factor = ("us", 1e6) if name == "get_group" else ("ms", 1e3)
        print(
            f"{name:<24}{seconds * factor:>10.1f}{unit}{seed * factor:>10.1f}{unit}"
            f"{seed / seconds:>9.1f}x"
        )
    print(
        f"{'memory per group':<24}{bytes_per_group / 1e3:>10.1f}KB"
        f"{SEED_BYTES_PER_GROUP / 1e3:>10.1f}KB{SEED_BYTES_PER_GROUP / bytes_per_group:>9.1f}x"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "groups": args.groups,
                "siblings": SIBLINGS,
                "python": sys.version.split()[0],
                "seconds": results,
                "seed_seconds": SEED_SECONDS,
                "bytes_per_group": bytes_per_group,
                "seed_bytes_per_group": SEED_BYTES_PER_GROUP,
                "sizes": {"state_groups": len(group_ids)},
                "median_check": statistics.median(results.values()),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
