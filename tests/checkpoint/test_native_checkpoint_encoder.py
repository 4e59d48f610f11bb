"""encode_native_checkpoint: the same file as build + encode, without building dicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_native_fast_load import CUT, _ledger

from rollout_recovery import (
    FinalizedReward,
    RewardLogContext,
    RolloutRecoveryLedger,
    build_rollout_recovery_state,
)
from rollout_recovery.checkpoint import load_sidecar
from rollout_recovery.checkpoint._native import encode_native, encode_native_checkpoint
from rollout_recovery.checkpoint._sidecar_io import decode_sidecar
from rollout_recovery.errors import CheckpointUnsafeError, InvalidStateError, InvalidStateTypeError
from rollout_recovery.rewards import CaptureRewardSettings

CONTROLLER: dict[str, Any] = {
    "batch_shortfall": {3: 1, 0: 2},
    "sampler_stamps_target_steps": True,
    "finalizer_metrics_by_group": {"g9": {"finalize/reward_count": 1, "x": 0.5}, "g8": {}},
    "finalizer_rewards_by_group": {
        "g9": [
            FinalizedReward(
                sample_id="g9_g0",
                rollout_id="g9_g0_a" + "0" * 32,
                reward=1.0,
                log_context=RewardLogContext(agent_name="a", full_result_json='{"k": 1}'),
            )
        ]
    },
    "reward_settings": CaptureRewardSettings.from_configs(
        penalties={"penalize_unwanted_tokens": True, "token_ids": {"unwanted": [7, 3]}}
    ),
}


@pytest.mark.parametrize("canonical", [None, set(), {"g1", "g9"}])
def test_reads_back_to_exactly_the_built_sidecar(canonical: set[str] | None) -> None:
    ledger = _ledger()
    built = build_rollout_recovery_state(ledger, canonical_group_ids=canonical, **CONTROLLER)
    data = encode_native_checkpoint(ledger, canonical_group_ids=canonical, **CONTROLLER)
    assert decode_sidecar(data) == ("native", built)
    # Byte for byte the file the dict path writes: same payload, same envelope.
    assert data == encode_native(built)


def test_loads_as_a_checkpoint(tmp_path: Path) -> None:
    ledger = _ledger()
    (tmp_path / "s").write_bytes(encode_native_checkpoint(ledger, **CONTROLLER))
    loaded = load_sidecar(tmp_path / "s")
    assert loaded.parsed.batch_shortfall == {3: 1, 0: 2}
    assert [g.group_id for g in loaded.ledger.groups()] == ["g0", "g1", "g2"]


def test_refuses_what_the_builder_refuses() -> None:
    unbound = RolloutRecoveryLedger.from_state_dict(_ledger().state_dict())
    with pytest.raises(RuntimeError, match="before its prompt is rehydrated"):
        encode_native_checkpoint(unbound, **CONTROLLER)
    unsafe = _ledger()
    unsafe.abandon_unsealed(CUT, "g0")
    group = unsafe.get_group("g0")
    for index in (0, 1, 2):
        if group.siblings[index].current_attempt.status.value != "sealed":
            unsafe.prepare_incomplete_retry(CUT, "g0")
            break
    unsafe.mark_group_dispatched(CUT, "g0", generation_indices=[2])
    gate = unsafe.get_group("g0").gate_rollout_id(2)
    unsafe.mark_sibling_sealed(
        CUT,
        "g0",
        generation_index=2,
        gate_rollout_id=gate,
        receipt=None,
        reward=0.0,
        mask_sample=True,
    )
    unsafe.mark_finalization_started(CUT, "g0")
    with pytest.raises(CheckpointUnsafeError):
        encode_native_checkpoint(unsafe, **CONTROLLER)
    with pytest.raises(InvalidStateTypeError, match="sampler_stamps_target_steps"):
        encode_native_checkpoint(_ledger(), **{**CONTROLLER, "sampler_stamps_target_steps": 1})
    with pytest.raises(InvalidStateError, match="batch_shortfall"):
        encode_native_checkpoint(_ledger(), **{**CONTROLLER, "batch_shortfall": {-1: 1}})


def test_the_same_bad_input_raises_the_same_error_as_the_builder() -> None:
    unbound = RolloutRecoveryLedger.from_state_dict(_ledger().state_dict())
    bad = {**CONTROLLER, "batch_shortfall": {"x": 1}}
    for encode in (build_rollout_recovery_state, encode_native_checkpoint):
        with pytest.raises(RuntimeError, match="before its prompt is rehydrated"):
            encode(unbound, **bad)  # type: ignore[operator]
    for encode in (build_rollout_recovery_state, encode_native_checkpoint):
        with pytest.raises(InvalidStateError, match="batch_shortfall"):
            encode(_ledger(), **{**CONTROLLER, "batch_shortfall": {0: 2**70}})  # type: ignore[operator]


def _half_admitted_batch() -> RolloutRecoveryLedger:
    ledger = RolloutRecoveryLedger()
    for index, group_id in enumerate(("a", "b")):
        ledger.reserve_group(
            CUT,
            prompt_id=str(index),
            prompt_payload={"idx": index},
            expected_generations=1,
            target_step=None,
            start_weight_version=0,
            admitted=False,
            group_id=group_id,
            admission_id="batch",
        )
    ledger.mark_group_admitted(CUT, "a", target_step=3, start_weight_version=0)
    return ledger


def test_a_half_admitted_batch_is_refused_before_writing_naming_both_groups() -> None:
    ledger = _half_admitted_batch()
    with pytest.raises(InvalidStateError, match="admission_id='batch'") as raised:
        encode_native_checkpoint(ledger, batch_shortfall={}, sampler_stamps_target_steps=True)
    assert "'a'" in str(raised.value) and "'b'" in str(raised.value)
    assert raised.value.path == "$.groups[1].admission_id"
    # The loader's check is the same function, with the same message.
    ledger.mark_group_admitted(CUT, "b", target_step=3, start_weight_version=0)
    state = build_rollout_recovery_state(
        ledger, batch_shortfall={}, sampler_stamps_target_steps=True
    )
    state["groups"][1]["target_step"] = 4
    with pytest.raises(InvalidStateError, match="group 'a' is admitted with target_step=3"):
        RolloutRecoveryLedger.from_state_dict({"schema_version": 3, "groups": state["groups"]})


def test_a_whole_admitted_batch_checkpoints_and_loads(tmp_path: Path) -> None:
    ledger = _half_admitted_batch()
    ledger.mark_group_admitted(CUT, "b", target_step=3, start_weight_version=0)
    data = encode_native_checkpoint(ledger, batch_shortfall={}, sampler_stamps_target_steps=True)
    (tmp_path / "s").write_bytes(data)
    assert [g.group_id for g in load_sidecar(tmp_path / "s").ledger.groups()] == ["a", "b"]


def test_the_excluded_canonical_group_is_not_held_to_the_batch_rule() -> None:
    ledger = _half_admitted_batch()
    encode_native_checkpoint(
        ledger, batch_shortfall={}, sampler_stamps_target_steps=True, canonical_group_ids={"b"}
    )
