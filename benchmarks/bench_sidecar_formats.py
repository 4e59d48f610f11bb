"""Sidecar file formats side by side: native MessagePack vs ``.pt`` (with and without torch).

Workload: ``bench_ledger.build_workload`` (5,000 groups x 16 siblings, 90% sealed with a
two-call receipt, 10% abandoned and retried), as the sidecar ``build_rollout_recovery_state``
makes of it. Every case runs in this one process on the same state, best of ``--repeat``:

- native write            ``write_sidecar(format="native")``: full validation, encode,
                          read-back check, atomic fsynced write
- native write, unchecked the same with ``validate=False`` (encode + atomic write only)
- checkpoint bytes        what the barrier is held for: ``build_rollout_recovery_state``
                          + ``encode_sidecar`` (validated), versus
                          ``encode_native_checkpoint`` straight from ledger storage
- native read             ``load_sidecar``: checksum, typed decode straight into the
                          ledger's storage, and full validation (the sidecar's rules and
                          every ledger load invariant)
- native decode only      the same without the ledger's validation
- .pt write / read        the same API with ``format="pt"``; torch is not used
- torch.save / torch.load ``torch.save(state, path)`` and ``torch.load(path,
                          weights_only=True)``, with no validation, when torch is importable
- torch.load + validation torch.load followed by the same full validation as a native read

Run: ``python benchmarks/bench_sidecar_formats.py [--groups 5000] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ledger import build_workload

from rollout_recovery import build_rollout_recovery_state
from rollout_recovery.checkpoint import load_sidecar, write_sidecar
from rollout_recovery.checkpoint._native import encode_native_checkpoint
from rollout_recovery.checkpoint._sidecar_io import (
    decode_sidecar,
    encode_sidecar,
    validate_sidecar_state,
)


def _best_of(repeat: int, run: Callable[[], object]) -> float:
    samples = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        result = run()
        samples.append(time.perf_counter() - start)
        # Freed after the clock stops: a restore keeps what it read, and freeing a
        # 10^6-object tree would otherwise be charged to whichever case ran.
        del result
    return min(samples)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--json", type=Path, default=Path("benchmarks/results/sidecar_formats.json")
    )
    args = parser.parse_args(argv)

    payloads = [{"idx": i, "task_name": None} for i in range(args.groups)]
    ledger = build_workload(args.groups, payloads)
    state = build_rollout_recovery_state(
        ledger, batch_shortfall={7: 1}, sampler_stamps_target_steps=True
    )
    attempts = sum(len(s["attempts"]) for g in state["groups"] for s in g["siblings"])
    torch = _torch()

    rows: dict[str, float] = {}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(dir=".") as scratch:
        native, pt, torch_path = (Path(scratch) / n for n in ("s.native", "s.pt", "s.torch"))

        rows["native write"] = _best_of(args.repeat, lambda: write_sidecar(native, state))
        rows["native write, unchecked"] = _best_of(
            args.repeat, lambda: write_sidecar(native, state, validate=False)
        )
        # What a checkpoint holds the barrier for: the ledger and controller state turned
        # into file bytes (the write and fsync can follow after the cut is released).
        rows["checkpoint bytes: build_rollout_recovery_state + encode"] = _best_of(
            args.repeat,
            lambda: encode_sidecar(
                build_rollout_recovery_state(
                    ledger, batch_shortfall={7: 1}, sampler_stamps_target_steps=True
                ),
                format="native",
            ),
        )
        rows["checkpoint bytes: encode_native_checkpoint (from storage)"] = _best_of(
            args.repeat,
            lambda: encode_native_checkpoint(
                ledger, batch_shortfall={7: 1}, sampler_stamps_target_steps=True
            ),
        )
        rows["native read (full validation)"] = _best_of(args.repeat, lambda: load_sidecar(native))
        native_bytes = native.read_bytes()
        rows["native decode only"] = _best_of(args.repeat, lambda: decode_sidecar(native_bytes))
        sizes["native"] = len(native_bytes)

        rows[".pt write (no torch)"] = _best_of(
            args.repeat, lambda: write_sidecar(pt, state, format="pt")
        )
        rows[".pt read (no torch, full validation)"] = _best_of(
            args.repeat, lambda: load_sidecar(pt)
        )
        sizes["pt"] = pt.stat().st_size
        assert load_sidecar(pt).state == load_sidecar(native).state == state

        if torch is not None:
            rows["torch.save"] = _best_of(args.repeat, lambda: torch.save(state, torch_path))
            rows["torch.load(weights_only=True)"] = _best_of(
                args.repeat, lambda: torch.load(torch_path, weights_only=True)
            )
            rows["torch.load + full validation"] = _best_of(
                args.repeat,
                lambda: validate_sidecar_state(torch.load(torch_path, weights_only=True)),
            )
            sizes["torch.save"] = torch_path.stat().st_size
            # Interop both ways: torch reads our .pt, we read torch's file.
            assert torch.load(pt, weights_only=True) == state
            assert load_sidecar(torch_path).state == state

    baseline = rows.get("torch.load(weights_only=True)")
    print(
        f"sidecar formats: {args.groups} groups x 16 siblings, {attempts} attempts; best of "
        f"{args.repeat}; Python {platform.python_version()}, "
        f"torch {torch.__version__ if torch is not None else 'not installed'}"
    )
    print()
    print("| case | seconds | vs torch.load |")
    print("|---|---:|---:|")
    for name, seconds in rows.items():
        ratio = f"{baseline / seconds:.1f}x faster" if baseline else "-"
        if baseline and seconds > baseline:
            ratio = f"{seconds / baseline:.1f}x slower"
        if not name.startswith(("native read", "native decode", ".pt read", "torch.load")):
            ratio = ""
        print(f"| {name} | {seconds:.3f} | {ratio} |")
    print()
    print("| file | bytes |")
    print("|---|---:|")
    for name, size in sizes.items():
        print(f"| {name} | {size:,} |")

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "groups": args.groups,
                "attempts": attempts,
                "repeat": args.repeat,
                "python": platform.python_version(),
                "torch": None if torch is None else torch.__version__,
                "cpus": os.cpu_count(),
                "seconds": rows,
                "bytes": sizes,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
