"""Child process for test_sidecar_crash.py: rewrites one sidecar file in a loop.

Usage: python crash_sidecar_writer.py PATH FORMAT PAUSE_AT [HOLD_AFTER]. Before each
write it prints ``start N``, after it ``done N``; write N stores batch_shortfall {0: N}.
During write number PAUSE_AT (0: never) the named crash point fires: the first half of the
file's bytes is written and flushed, ``mid-write N`` is printed, and the process blocks
until the parent SIGKILLs it, so a kill lands inside a write deterministically, whatever
the writer's strategy. After write number HOLD_AFTER (0: never) it blocks the same way, so
a kill "at done N" cannot land after write N+1 by a slow parent. Not a test module (no
``test_`` prefix).
"""

from __future__ import annotations

import builtins
import os
import sys
from typing import Any

from rollout_recovery import RolloutRecoveryLedger, build_rollout_recovery_state
from rollout_recovery.checkpoint import write_sidecar


class _Cut:
    def require_live(self) -> None:
        return None


def _ledger(groups: int) -> RolloutRecoveryLedger:
    cut = _Cut()
    ledger = RolloutRecoveryLedger()
    for index in range(groups):
        group_id = f"group-{index}"
        ledger.reserve_group(
            cut,
            prompt_id=str(index),
            prompt_payload={"idx": index},
            expected_generations=16,
            target_step=0,
            start_weight_version=0,
            group_id=group_id,
        )
        ledger.mark_group_dispatched(cut, group_id)
        record = ledger.get_group(group_id)
        for sibling in range(15):
            gate = record.gate_rollout_id(sibling)
            ledger.mark_sibling_sealed(
                cut,
                group_id,
                generation_index=sibling,
                gate_rollout_id=gate,
                receipt={"rollout_id": gate, "manifest": [{"staging_key": f"{gate}/c0"}]},
                reward=1.0,
                mask_sample=False,
            )
    return ledger


class _PausingFile:
    """Wraps a binary file opened for writing; pauses half-way through its first write."""

    def __init__(self, inner: Any, number: int) -> None:
        self._inner = inner
        self._number = number

    def write(self, data: bytes) -> int:
        half = len(data) // 2
        self._inner.write(data[:half])
        self._inner.flush()
        print(f"mid-write {self._number}", flush=True)
        sys.stdin.readline()  # blocks: the parent never writes, it kills
        return int(self._inner.write(data[half:])) + half

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __enter__(self) -> _PausingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.__exit__(*exc)


def _install_crash_point(current: list[int], pause_at: int) -> None:
    real_open, real_fdopen = builtins.open, os.fdopen

    def pausing(opened: Any, mode: str) -> Any:
        if current[0] == pause_at and "w" in mode and "b" in mode:
            return _PausingFile(opened, current[0])
        return opened

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        return pausing(real_open(file, mode, *args, **kwargs), mode)

    def fdopen(fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        return pausing(real_fdopen(fd, mode, *args, **kwargs), mode)

    builtins.open = open_  # type: ignore[assignment]
    os.fdopen = fdopen


def main() -> None:
    path, format, pause_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    hold_after = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    ledger = _ledger(400)  # a few MB per write
    current = [0]
    _install_crash_point(current, pause_at)
    for number in range(1, 10_000):
        current[0] = number
        state = build_rollout_recovery_state(
            ledger, batch_shortfall={0: number}, sampler_stamps_target_steps=True
        )
        print(f"start {number}", flush=True)
        write_sidecar(path, state, format=format, validate=False)  # type: ignore[arg-type]
        print(f"done {number}", flush=True)
        if number == hold_after:
            sys.stdin.readline()  # blocks: the parent never writes, it kills


if __name__ == "__main__":
    main()
