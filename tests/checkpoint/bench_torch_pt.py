"""Time the torch-free codec against torch.save / torch.load(weights_only=True).

Not collected by pytest. Run: ``python tests/checkpoint/bench_torch_pt.py [groups] [siblings]``
(torch optional: without it only our codec is timed).
"""

from __future__ import annotations

import copy
import io
import sys
import time
from collections.abc import Callable
from typing import Any

from make_golden_pt import _group, sidecar_v3

from rollout_recovery.checkpoint._torch_pt import decode_torch_pt, encode_torch_pt


def big_sidecar(groups: int, siblings: int) -> dict[str, Any]:
    state = sidecar_v3()
    state["groups"] = []
    for index in range(groups):
        group = _group(f"g-{index:06d}", index % 50, first_uuid=index * 64)
        # _group makes 2 siblings; repeat them up to `siblings`, deep-copied so that no
        # container is shared (shared ones would let torch's pickler emit memo references).
        template = group["siblings"]
        group["siblings"] = [
            {**copy.deepcopy(template[g % 2]), "generation_index": g} for g in range(siblings)
        ]
        group["expected_generations"] = siblings
        state["groups"].append(group)
    return state


def best(fn: Callable[[], object], repeat: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return min(samples) if samples else float("nan")


def main() -> None:
    groups = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    siblings = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    state = big_sidecar(groups, siblings)
    ours = encode_torch_pt(state)
    assert decode_torch_pt(ours) == state
    print(f"{groups} groups x {siblings} siblings x 2 attempts")
    print(
        f"ours : {len(ours) / 1e6:.2f} MB  write {best(lambda: encode_torch_pt(state)):.3f} s"
        f"  read {best(lambda: decode_torch_pt(ours)):.3f} s"
    )
    try:
        import torch
    except ImportError:
        return

    def save() -> bytes:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        return buffer.getvalue()

    theirs = save()
    assert torch.load(io.BytesIO(ours), weights_only=True) == state
    load = best(lambda: torch.load(io.BytesIO(theirs), weights_only=True))
    print(
        f"torch: {len(theirs) / 1e6:.2f} MB  write {best(save):.3f} s  read {load:.3f} s"
        f"  (weights_only=True)"
    )
    print(
        f"ours reading torch's file: {best(lambda: decode_torch_pt(theirs)):.3f} s;"
        f" torch reading ours: "
        f"{best(lambda: torch.load(io.BytesIO(ours), weights_only=True)):.3f} s"
    )


if __name__ == "__main__":
    main()
