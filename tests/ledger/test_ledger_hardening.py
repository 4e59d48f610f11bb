"""Refusals beyond the seed that keep every later checkpoint loadable.

Each case was once accepted and then broke something later: a half-sealed cohort, a
receipt no sidecar could hold, a target step the replay index refuses after the canonical
rows were written.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from ledger_support import LiveCut, reserve, snapshot

from rollout_recovery import (
    RecoveryGranularity,
    RolloutRecoveryLedger,
    SiblingSealResult,
    build_rollout_recovery_state,
)
from rollout_recovery.checkpoint import decode_sidecar, encode_sidecar
from rollout_recovery.errors import InvalidStateError

CUT = LiveCut()


def _dispatched(granularity: RecoveryGranularity, n: int = 3) -> RolloutRecoveryLedger:
    ledger = RolloutRecoveryLedger()
    ledger.reserve_group(
        CUT,
        prompt_id="7",
        prompt_payload={"idx": 7},
        expected_generations=n,
        target_step=0,
        start_weight_version=0,
        recovery_granularity=granularity,
        group_id="g",
    )
    ledger.mark_group_dispatched(CUT, "g")
    return ledger


def test_a_group_seal_with_one_bad_reward_seals_nothing() -> None:
    ledger = _dispatched(RecoveryGranularity.PROMPT_GROUP)
    group = ledger.get_group("g")
    results = {
        i: SiblingSealResult(
            gate_rollout_id=group.gate_rollout_id(i),
            receipt=None,
            reward="bad" if i == 2 else 1.0,  # type: ignore[arg-type]
            mask_sample=False,
        )
        for i in range(3)
    }
    before = snapshot(ledger)
    with pytest.raises(ValueError, match="reward for 'g_g2' must be a number"):
        ledger.mark_group_sealed(CUT, "g", results)
    assert snapshot(ledger) == before


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({3}, "['x']"),
        (datetime.datetime(2026, 1, 1), "['x']"),
        (uuid.UUID(int=5), "['x']"),
        (2**70, "['x']"),
        ({1.5: "float key"}, "['x']"),
        ({7: "int key"}, "['x']"),  # native storage types receipt keys as str
        ("lone \udc80 surrogate", "['x']"),
        ([[object()]], "['x'][0][0]"),
    ],
)
def test_a_receipt_no_sidecar_could_hold_is_refused_at_seal(value: Any, where: str) -> None:
    ledger = _dispatched(RecoveryGranularity.SIBLING)
    gate = ledger.get_group("g").gate_rollout_id(0)
    before = snapshot(ledger)
    with pytest.raises(InvalidStateError, match="plain data only") as caught:
        ledger.mark_sibling_sealed(
            CUT,
            "g",
            generation_index=0,
            gate_rollout_id=gate,
            receipt={"rollout_id": gate, "manifest": [], "x": value},
            reward=1.0,
            mask_sample=False,
        )
    assert caught.value.path is not None and caught.value.path.startswith(f"receipt{where}")
    assert snapshot(ledger) == before


def test_tuples_in_a_receipt_become_lists_and_checkpoint_in_both_formats() -> None:
    ledger = _dispatched(RecoveryGranularity.SIBLING)
    gate = ledger.get_group("g").gate_rollout_id(0)
    receipt = {"rollout_id": gate, "manifest": [], "t": (1, (2, 3))}
    ledger.mark_sibling_sealed(
        CUT,
        "g",
        generation_index=0,
        gate_rollout_id=gate,
        receipt=receipt,
        reward=1.0,
        mask_sample=False,
    )
    stored = ledger.get_group("g").siblings[0].current_attempt.receipt
    assert stored is not None and stored["t"] == [1, [2, 3]]
    state = build_rollout_recovery_state(
        ledger, batch_shortfall={}, sampler_stamps_target_steps=True
    )
    for format in ("native", "pt"):
        assert decode_sidecar(encode_sidecar(state, format=format))[1] == state


@pytest.mark.parametrize("target_step", [-1, True, "3", 1.0])
def test_reserve_refuses_a_target_step_the_replay_index_would_refuse(target_step: Any) -> None:
    ledger = RolloutRecoveryLedger()
    with pytest.raises(TypeError, match="target_step must be a non-negative int or None"):
        reserve(ledger, target_step=target_step)
    assert len(ledger) == 0


def test_admission_refuses_a_negative_weight_version_and_changes_nothing() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, admitted=False)
    before = snapshot(ledger)
    with pytest.raises(TypeError, match="start_weight_version must be a non-negative int"):
        ledger.mark_group_admitted(CUT, "g", target_step=1, start_weight_version=-1)
    assert snapshot(ledger) == before


def test_a_string_reward_is_refused_not_parsed() -> None:
    ledger = _dispatched(RecoveryGranularity.SIBLING)
    gate = ledger.get_group("g").gate_rollout_id(0)
    before = snapshot(ledger)
    with pytest.raises(ValueError, match="must be a number"):
        ledger.mark_sibling_sealed(
            CUT,
            "g",
            generation_index=0,
            gate_rollout_id=gate,
            receipt=None,
            reward="1.5",
            mask_sample=False,  # type: ignore[arg-type]
        )
    assert snapshot(ledger) == before


def test_a_redelivered_nan_seal_is_a_duplicate_not_a_conflict() -> None:
    ledger = _dispatched(RecoveryGranularity.SIBLING)
    gate = ledger.get_group("g").gate_rollout_id(0)
    for _ in range(2):
        ledger.mark_sibling_sealed(
            CUT,
            "g",
            generation_index=0,
            gate_rollout_id=gate,
            receipt=None,
            reward=float("nan"),
            mask_sample=True,
        )


@pytest.mark.parametrize("value", [2**63, 2**64])
def test_scheduling_values_beyond_64_bits_are_refused(value: int) -> None:
    ledger = RolloutRecoveryLedger()
    with pytest.raises(TypeError, match="target_step"):
        reserve(ledger, target_step=value)
    with pytest.raises(TypeError, match="start_weight_version"):
        reserve(ledger, start_weight_version=value)
    assert len(ledger) == 0
