"""finalize_group on a realistic group vs. the raw cost of fetching the same staged rows.

Standalone (never part of the test run)::

    python benchmarks/bench_finalize.py [--siblings 16] [--calls 8] [--min-delta 1000]
                                        [--max-delta 2000] [--repeats 20] [--json PATH]

One SQLite data plane (the embedded default, WAL + synchronous=FULL) holds a sealed group of
``--siblings`` rollouts, each a chain of ``--calls`` model calls whose staged token delta is
``--min-delta``..``--max-delta`` tokens (carried prompt/tool tokens plus generated ones), staged
through the real :class:`CaptureWriter` and sealed through a real ledger. Side by side in one
run, each measured ``--repeats`` times:

- ``raw fetch``: one ``get`` of every staged row of the group (what any finalizer must read);
- ``finalize_group``: fetch, verify every digest and lineage hash, linearize, finalize rewards
  and build the N canonical rows (no penalties; then with the unwanted-token penalty on, which
  scans every generated token).

The ratio is the finalizer's overhead over the raw fetch. Prints a table; ``--json`` also
writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.capture._receipt import assemble_receipt
from rollout_recovery.capture._records import CallRecord
from rollout_recovery.dataplane import SqliteDataPlane
from rollout_recovery.finalize._group import finalize_group
from rollout_recovery.ledger import PromptGroupRecoveryRecord, RolloutRecoveryLedger
from rollout_recovery.rewards import CaptureRewardSettings


class _Cut:
    def require_live(self) -> None:
        return None


CUT = _Cut()


def build_group(
    store: SqliteDataPlane, *, siblings: int, calls: int, min_delta: int, max_delta: int
) -> tuple[PromptGroupRecoveryRecord, list[str], int]:
    """Stage and seal one group; return its record, every staging key and the token count."""
    rng = np.random.default_rng(0)
    ledger = RolloutRecoveryLedger()
    ledger.reserve_group(
        CUT,
        prompt_id="0",
        prompt_payload={"idx": 0},
        expected_generations=siblings,
        target_step=0,
        start_weight_version=0,
        group_id="bench",
    )
    ledger.mark_group_dispatched(CUT, "bench")
    record = ledger.get_group("bench")
    writer = CaptureWriter(store)
    keys: list[str] = []
    staged_tokens = 0
    for index in range(siblings):
        rollout_id = record.gate_rollout_id(index)
        records: list[CallRecord] = []
        history = np.zeros(0, dtype=np.int32)
        for call in range(calls):
            delta = int(rng.integers(min_delta, max_delta + 1))
            generated_len = int(rng.integers(delta // 4, delta // 2))
            carried = rng.integers(0, 150_000, delta - generated_len, dtype=np.int32)
            generated = rng.integers(0, 150_000, generated_len, dtype=np.int32)
            records.append(
                writer.stage_call(
                    rollout_id=rollout_id,
                    model_call_id=f"c{call}",
                    parent=records[-1] if records else None,
                    prompt_token_ids=np.concatenate([history, carried]),
                    generated_token_ids=generated,
                    generated_logprobs=-rng.random(generated_len, dtype=np.float32),
                    weight_version=call // 3,
                )
            )
            history = np.concatenate([history, carried, generated])
            staged_tokens += delta
        keys += [r.staging_key for r in records]
        receipt = assemble_receipt(
            rollout_id, records, terminal_model_call_id=f"c{calls - 1}"
        ).to_dict()
        ledger.mark_sibling_sealed(
            CUT,
            "bench",
            generation_index=index,
            gate_rollout_id=rollout_id,
            receipt=receipt,
            reward=float(index % 2),
            mask_sample=False,
        )
    return ledger.get_group("bench"), keys, staged_tokens


def measure(action: Callable[[], object], repeats: int) -> list[float]:
    action()  # warm the page cache and the code paths once
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--siblings", type=int, default=16)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--min-delta", type=int, default=1000)
    parser.add_argument("--max-delta", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    plain = CaptureRewardSettings()
    penalized = CaptureRewardSettings.from_configs(
        penalties={"penalize_unwanted_tokens": True, "token_ids": {"unwanted": [150_001]}}
    )
    with tempfile.TemporaryDirectory() as workdir:
        store = SqliteDataPlane(Path(workdir) / "store.sqlite3")
        try:
            group, keys, staged_tokens = build_group(
                store,
                siblings=args.siblings,
                calls=args.calls,
                min_delta=args.min_delta,
                max_delta=args.max_delta,
            )
            check = finalize_group(group=group, data_plane=store, settings=plain)
            assert check.valid_row_count == args.siblings, check.metas
            row_tokens = sum(row.token_ids.size for row in check.rows)
            cases: dict[str, list[float]] = {
                "raw fetch (one get of all staged rows)": measure(
                    lambda: store.get(CaptureWriter.staging_partition, keys), args.repeats
                ),
                "finalize_group, no penalties": measure(
                    lambda: finalize_group(group=group, data_plane=store, settings=plain),
                    args.repeats,
                ),
                "finalize_group, unwanted-token penalty": measure(
                    lambda: finalize_group(group=group, data_plane=store, settings=penalized),
                    args.repeats,
                ),
            }
        finally:
            store.close()

    raw = statistics.median(cases["raw fetch (one get of all staged rows)"])
    print(
        f"group: {args.siblings} siblings x {args.calls} calls, {len(keys)} staged rows, "
        f"{staged_tokens:,} staged tokens, {row_tokens:,} tokens in canonical rows; "
        f"SQLite; {args.repeats} repeats"
    )
    header = f"{'case':<42} {'median ms':>10} {'min ms':>9} {'Mtok/s':>8} {'x raw':>7}"
    print(header)
    print("-" * len(header))
    results: dict[str, Any] = {}
    for name, samples in cases.items():
        median = statistics.median(samples)
        results[name] = {"median_s": median, "min_s": min(samples), "ratio": median / raw}
        print(
            f"{name:<42} {median * 1e3:>10.2f} {min(samples) * 1e3:>9.2f} "
            f"{staged_tokens / median / 1e6:>8.1f} {median / raw:>7.2f}"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "python": sys.version,
                    "platform": platform.platform(),
                    "staged_rows": len(keys),
                    "staged_tokens": staged_tokens,
                    "canonical_tokens": row_tokens,
                    "results": results,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
