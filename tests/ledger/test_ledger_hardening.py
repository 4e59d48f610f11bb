"""Refusals beyond the seed that keep every later checkpoint loadable.

Each case was once accepted and then broke something later: a half-sealed cohort, a
receipt no sidecar could hold, a target step the replay index refuses after the canonical
rows were written.
"""

from __future__ import annotations

import datetime
import re
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
from rollout_recovery.checkpoint._sidecar_io import decode_sidecar, encode_sidecar
from rollout_recovery.errors import InvalidStateError, InvalidTransitionError

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
    assert caught.value.path is not None and caught.value.path.startswith(f"$.receipt{where}")
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


# --- a value the checkpoint loader would refuse is refused by the call that brings it in


def _reserve_with(**overrides: Any) -> RolloutRecoveryLedger:
    ledger = RolloutRecoveryLedger()
    arguments: dict[str, Any] = {
        "prompt_id": "7",
        "prompt_payload": {"idx": 7},
        "expected_generations": 2,
        "target_step": 0,
        "start_weight_version": 0,
        "group_id": "g",
    }
    arguments.update(overrides)
    ledger.reserve_group(CUT, **arguments)
    return ledger


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("group_id", 5),
        ("group_id", True),
        ("group_id", "g\ud800"),
        ("admission_id", 5),
        ("admission_id", "a\udc00"),
        ("task_source", 5),
        ("task_source", False),
        ("task_source", "\ud800"),
        ("prompt_id", 7),
        ("expected_generations", True),
    ],
)
def test_reserve_refuses_a_value_the_loader_would_refuse(field: str, value: Any) -> None:
    ledger = _reserve_with(group_id="other", prompt_id="8", prompt_payload={"idx": 8})
    before = snapshot(ledger)
    with pytest.raises(InvalidTransitionError, match=f"^{re.escape(field)}") as raised:
        ledger.reserve_group(
            CUT,
            **{
                "prompt_id": "7",
                "prompt_payload": {"idx": 7},
                "expected_generations": 2,
                "target_step": 0,
                "start_weight_version": 0,
                "group_id": "g",
                field: value,
            },
        )
    assert isinstance(raised.value, ValueError)
    assert snapshot(ledger) == before


def test_reserve_refuses_a_lone_surrogate_task_name() -> None:
    with pytest.raises(InvalidTransitionError, match=r"^prompt_ref\.task_name"):
        _reserve_with(prompt_payload={"idx": 7, "task_name": "m\ud800"})


def test_reserve_still_generates_ids_for_none_and_empty() -> None:
    ledger = _reserve_with(group_id="", admission_id="", task_source="")
    (group,) = ledger.groups()
    assert group.group_id and group.admission_id == group.group_id
    assert group.task_source == ""


# --- a bare string where a collection of group ids belongs is refused, never iterated


def _three_groups() -> RolloutRecoveryLedger:
    ledger = RolloutRecoveryLedger()
    for index, group_id in enumerate(("a", "b", "ab")):
        ledger.reserve_group(
            CUT,
            prompt_id=str(index),
            prompt_payload={"idx": index},
            expected_generations=1,
            target_step=0,
            start_weight_version=0,
            group_id=group_id,
        )
    return ledger


def test_discard_canonical_groups_refuses_a_bare_string() -> None:
    from rollout_recovery.errors import BareStringError

    ledger = _three_groups()
    with pytest.raises(BareStringError, match="group_ids must be a collection of str"):
        ledger.discard_canonical_groups(CUT, "ab")
    assert [g.group_id for g in ledger.groups()] == ["a", "b", "ab"]
    assert ledger.discard_canonical_groups(CUT, ["ab"]) == 1


@pytest.mark.parametrize("canonical", ["ab", b"ab"])
def test_checkpoints_refuse_a_bare_string_of_canonical_ids(canonical: Any) -> None:
    from rollout_recovery.checkpoint._native import encode_native_checkpoint
    from rollout_recovery.errors import BareStringError

    ledger = _three_groups()
    controller: dict[str, Any] = {"batch_shortfall": {}, "sampler_stamps_target_steps": True}
    with pytest.raises(BareStringError):
        build_rollout_recovery_state(ledger, canonical_group_ids=canonical, **controller)
    with pytest.raises(BareStringError):
        encode_native_checkpoint(ledger, canonical_group_ids=canonical, **controller)
    with pytest.raises(BareStringError):
        ledger.checkpoint_groups(exclude=canonical)
