"""Property: every checkpoint the encoder accepts loads back equal.

Random sequences of ledger calls, good and bad (ints and bools where strings or counts
belong, lone surrogates, admission batches admitted one group at a time), then the native
checkpoint encoder. A refused call must raise a project error; an accepted checkpoint must
load with ``load_sidecar`` and give back exactly the state that was written.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_recovery import (
    RecoveryGranularity,
    RolloutRecoveryLedger,
    SiblingSealResult,
    build_rollout_recovery_state,
)
from rollout_recovery.checkpoint import load_sidecar
from rollout_recovery.checkpoint._native import encode_native_checkpoint
from rollout_recovery.errors import InvalidStateError, RolloutRecoveryError


class _Cut:
    def require_live(self) -> None:
        return None


CUT = _Cut()
LONE = "\ud800"
GROUP_IDS: list[Any] = ["a", "b", "c", "d", 5, True, LONE, None]
ADMISSIONS: list[Any] = [None, "A", "A", "B", 7, False, "x" + LONE]
TASK_SOURCES: list[Any] = [None, "t", 3, True, LONE]
TARGET_STEPS: list[Any] = [None, 0, 1, 2, True, -1, 2**64]
GENERATIONS: list[Any] = [1, 2, 2, 3, True, 0, 2.0]
REWARDS: list[Any] = [0.0, 1.0, -2.5, math.nan, math.inf, 3, True, 2**1100, "1"]

# Refusals of bad arguments: project errors, plus the builtin TypeError/ValueError the seed
# raises for a few argument types (a wrong enum value, a non-int generation index).
REFUSED = (RolloutRecoveryError, TypeError, ValueError)


def _receipt(gate: str, kind: int) -> dict[str, Any] | None:
    if kind == 0:
        return None
    receipt: dict[str, Any] = {
        "rollout_id": gate,
        "manifest": [{"staging_key": f"{gate}/c{k}"} for k in range(kind)],
    }
    if kind == 3:
        receipt["note"] = "bad " + LONE
    return receipt


def _apply(ledger: RolloutRecoveryLedger, data: st.DataObject) -> None:
    op = data.draw(
        st.sampled_from(
            [
                "reserve",
                "reserve",
                "admit",
                "dispatch",
                "seal",
                "seal_group",
                "abandon",
                "retry",
                "discard",
            ]
        )
    )
    ids = [g.group_id for g in ledger.groups()]
    if op == "reserve":
        idx = data.draw(st.integers(0, 3))
        ledger.reserve_group(
            CUT,
            prompt_id=str(idx),
            prompt_payload={"idx": idx, "task_name": data.draw(st.sampled_from([None, "m"]))},
            expected_generations=data.draw(st.sampled_from(GENERATIONS)),
            target_step=data.draw(st.sampled_from(TARGET_STEPS)),
            start_weight_version=data.draw(st.sampled_from([0, 3])),
            task_source=data.draw(st.sampled_from(TASK_SOURCES)),
            recovery_granularity=data.draw(st.sampled_from(list(RecoveryGranularity))),
            admitted=data.draw(st.booleans()),
            group_id=data.draw(st.sampled_from(GROUP_IDS)),
            admission_id=data.draw(st.sampled_from(ADMISSIONS)),
        )
        return
    if not ids:
        return
    group_id = data.draw(st.sampled_from(ids))
    group = ledger.get_group(group_id)
    if op == "admit":
        ledger.mark_group_admitted(
            CUT,
            group_id,
            target_step=data.draw(st.sampled_from(TARGET_STEPS)),
            start_weight_version=0,
        )
    elif op == "dispatch":
        ledger.mark_group_dispatched(CUT, group_id)
    elif op == "seal":
        index = data.draw(st.integers(0, group.expected_generations - 1))
        gate = group.gate_rollout_id(index)
        ledger.mark_sibling_sealed(
            CUT,
            group_id,
            generation_index=index,
            gate_rollout_id=gate,
            receipt=_receipt(gate, data.draw(st.integers(0, 3))),
            reward=data.draw(st.sampled_from(REWARDS)),
            mask_sample=data.draw(st.booleans()),
        )
    elif op == "seal_group":
        results = {
            i: SiblingSealResult(
                gate_rollout_id=group.gate_rollout_id(i),
                receipt=_receipt(group.gate_rollout_id(i), data.draw(st.integers(0, 3))),
                reward=data.draw(st.sampled_from(REWARDS)),
                mask_sample=False,
            )
            for i in range(group.expected_generations)
        }
        ledger.mark_group_sealed(CUT, group_id, results)
    elif op == "abandon":
        ledger.abandon_unsealed(CUT, group_id)
    elif op == "retry":
        ledger.prepare_incomplete_retry(CUT, group_id)
    else:
        ledger.discard_group(CUT, group_id)


def _plain(state: dict[Any, Any]) -> bytes:
    # Byte equality of the MessagePack image: exact, and NaN equals NaN.
    return msgspec.msgpack.encode(state)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_checkpoint_the_encoder_accepts_loads_back_equal(
    data: st.DataObject, tmp_path: Path
) -> None:
    ledger = RolloutRecoveryLedger()
    for _ in range(data.draw(st.integers(1, 14))):
        with contextlib.suppress(*REFUSED):
            _apply(ledger, data)
    ids = [g.group_id for g in ledger.groups()]
    canonical = data.draw(st.none() | st.sets(st.sampled_from(ids)) if ids else st.none())
    controller: dict[str, Any] = {"batch_shortfall": {1: 2}, "sampler_stamps_target_steps": True}
    try:
        encoded = encode_native_checkpoint(ledger, canonical_group_ids=canonical, **controller)
    except InvalidStateError as error:
        # The only checkpoint-time refusal left: an admission batch caught mid-admission.
        assert "disagree on phase or target_step" in str(error)
        return
    path = tmp_path / "sidecar"
    path.write_bytes(encoded)
    loaded = load_sidecar(path)
    built = build_rollout_recovery_state(ledger, canonical_group_ids=canonical, **controller)
    assert _plain(loaded.state) == _plain(built)
    assert [g.group_id for g in loaded.ledger.groups()] == [g["group_id"] for g in built["groups"]]
