"""Which error comes first when several apply: the seed's order, pinned case by case.

Each case is one the differential fuzz (``test_seed_differential.py``) found; these run
without the seed oracle. The rule: the seed's checks run in the seed's order (arguments,
then state); ours, stricter, run after all of them, so a call the seed refuses is refused
with the seed's builtin exception type, and a refused call changes nothing.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
from ledger_support import CUT, gate_id, make_receipt, payload, reserve, snapshot

from rollout_recovery import (
    FinalizedReward,
    RecoveryGranularity,
    RolloutRecoveryLedger,
    SiblingSealResult,
    build_rollout_recovery_state,
    parse_rollout_recovery_state,
)
from rollout_recovery.errors import BareStringError, RolloutRecoveryError


def _reserve_call(ledger: RolloutRecoveryLedger, **overrides: Any) -> None:
    arguments: dict[str, Any] = {
        "prompt_id": "7",
        "prompt_payload": payload(7),
        "expected_generations": 2,
        "target_step": 0,
        "start_weight_version": 0,
        "group_id": "g",
    }
    arguments.update(overrides)
    ledger.reserve_group(CUT, **arguments)


def _refused(error_type: type[BaseException], ledger: RolloutRecoveryLedger, call: Any) -> Any:
    before = snapshot(ledger)
    with pytest.raises(error_type) as raised:
        call()
    assert snapshot(ledger) == before
    return raised.value


# ------------------------------------------------------------------------ reserve_group


def test_a_payloads_task_name_type_comes_before_the_count() -> None:
    ledger = RolloutRecoveryLedger()
    error = _refused(
        TypeError,
        ledger,
        lambda: _reserve_call(ledger, prompt_payload=payload(7, 5), expected_generations=0),
    )
    assert str(error).startswith("prompt task_name must be a string or None")


def test_the_duplicate_id_comes_before_ours_stricter_checks() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, group_id="g")
    for stricter in (
        {"target_step": "3"},
        {"start_weight_version": -1},
        {"recovery_granularity": "sibling"},
        {"task_source": 5},
        {"admission_id": 5},
        {"prompt_id": 7, "prompt_payload": payload(7)},
        {"expected_generations": True},
    ):
        error = _refused(ValueError, ledger, lambda s=stricter: _reserve_call(ledger, **s))
        assert str(error).startswith("duplicate recovery group_id='g'"), stricter


def test_a_prompt_ref_that_only_reads_like_one_is_refused_after_the_seeds_checks() -> None:
    ledger = RolloutRecoveryLedger()
    duck = SimpleNamespace(sample_id="7", task_name=None)
    _refused(
        TypeError, ledger, lambda: _reserve_call(ledger, prompt_ref=duck, expected_generations="2")
    )
    error = _refused(ValueError, ledger, lambda: _reserve_call(ledger, prompt_ref=duck))
    assert str(error).startswith("prompt_ref must be a PromptRef")


def test_a_float_count_is_the_type_error_the_seeds_range_raises() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, group_id="g")
    _refused(ValueError, ledger, lambda: _reserve_call(ledger, expected_generations=2.0))
    error = _refused(
        TypeError,
        ledger,
        lambda: _reserve_call(ledger, expected_generations=2.0, group_id=5),
    )
    assert str(error).startswith("expected_generations must be an int")


def test_a_granularity_that_is_not_a_member_is_refused() -> None:
    # The seed stores the raw value, then treats it as neither granularity; ours refuses it.
    ledger = RolloutRecoveryLedger()
    for value in ("prompt_group", "sibling", None):
        error = _refused(
            TypeError, ledger, lambda v=value: _reserve_call(ledger, recovery_granularity=v)
        )
        assert isinstance(error, RolloutRecoveryError)
    _reserve_call(ledger, recovery_granularity=RecoveryGranularity.PROMPT_GROUP)


# --------------------------------------------------------------------------------- seals


def _dispatched(granularity: RecoveryGranularity = RecoveryGranularity.SIBLING) -> Any:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, group_id="g", granularity=granularity)
    ledger.mark_group_dispatched(CUT, "g")
    return ledger


def _seal(ledger: RolloutRecoveryLedger, index: int = 0, **overrides: Any) -> None:
    gate = gate_id(ledger, "g", index)
    arguments: dict[str, Any] = {
        "generation_index": index,
        "gate_rollout_id": gate,
        "receipt": make_receipt(gate),
        "reward": 1.0,
        "mask_sample": False,
    }
    arguments.update(overrides)
    ledger.mark_sibling_sealed(CUT, "g", **arguments)


def test_a_seals_reward_is_converted_after_the_status_check() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, group_id="g")  # RESERVED, not dispatched
    error = _refused(ValueError, ledger, lambda: _seal(ledger, reward=None))
    assert "from status 'reserved'" in str(error)
    ledger.mark_group_dispatched(CUT, "g")
    _refused(TypeError, ledger, lambda: _seal(ledger, reward=None))
    _refused(ValueError, ledger, lambda: _seal(ledger, reward="x"))


def test_a_seals_stricter_checks_come_after_the_status_check() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, group_id="g")
    for stricter in (
        {"reward_checks": {"low_effort": True}},
        {"reward_log_context": "agent"},
        {"reward": "1.5"},
    ):
        error = _refused(ValueError, ledger, lambda s=stricter: _seal(ledger, **s))
        assert "from status 'reserved'" in str(error), stricter


def test_a_duplicate_seal_converts_its_reward_only_when_its_receipt_matches() -> None:
    ledger = _dispatched()
    gate = gate_id(ledger, "g", 0)
    _seal(ledger)
    _seal(ledger)  # an exact redelivery is a no-op
    _refused(TypeError, ledger, lambda: _seal(ledger, reward=None))
    error = _refused(
        ValueError, ledger, lambda: _seal(ledger, reward=None, receipt=make_receipt(gate, 2))
    )
    assert str(error).startswith("conflicting duplicate seal")


def test_a_redelivered_receipt_with_a_tuple_is_a_duplicate() -> None:
    # Ours stores the tuple as a list; the redelivery still equals it, as in the seed.
    ledger = _dispatched()
    receipt = {**make_receipt(gate_id(ledger, "g", 0)), "pair": (1, "x")}
    _seal(ledger, receipt=receipt)
    _seal(ledger, receipt=copy.deepcopy(receipt))
    assert ledger.get_group("g").siblings[0].current_attempt.receipt["pair"] == [1, "x"]


def test_a_group_seal_converts_rewards_after_validating_every_sibling() -> None:
    ledger = _dispatched(RecoveryGranularity.PROMPT_GROUP)
    gates = ledger.get_group("g").gate_rollout_ids
    results = {
        0: SiblingSealResult(gates[0], make_receipt(gates[0]), None, False),  # type: ignore[arg-type]
        1: SiblingSealResult("bogus", None, 1.0, False),
    }
    error = _refused(ValueError, ledger, lambda: ledger.mark_group_sealed(CUT, "g", results))
    assert str(error).startswith("streamed rollout identity mismatch")
    results[1] = SiblingSealResult(gates[1], None, 1.0, False, reward_checks={"x": 1})  # type: ignore[arg-type]
    _refused(TypeError, ledger, lambda: ledger.mark_group_sealed(CUT, "g", results))


def test_discarding_a_non_collection_is_a_project_type_error() -> None:
    ledger = RolloutRecoveryLedger()
    error = _refused(TypeError, ledger, lambda: ledger.discard_canonical_groups(CUT, None))  # type: ignore[arg-type]
    assert isinstance(error, RolloutRecoveryError)


# ------------------------------------------------------------------------------ sidecars


def _split_admission() -> RolloutRecoveryLedger:
    """Two groups of one admission batch that disagree: the seed writes, then cannot read."""
    ledger = RolloutRecoveryLedger()
    reserve(ledger, 1, group_id="g1", admission_id="a", admitted=False)
    reserve(ledger, 2, group_id="g2", admission_id="a", admitted=True)
    return ledger


def _build(ledger: RolloutRecoveryLedger, **overrides: Any) -> Any:
    arguments: dict[str, Any] = {"batch_shortfall": {}, "sampler_stamps_target_steps": True}
    arguments.update(overrides)
    return build_rollout_recovery_state(ledger, **arguments)


def test_controller_fields_come_before_the_admission_rule() -> None:
    ledger = _split_admission()
    with pytest.raises(TypeError, match="batch_shortfall must be a dictionary"):
        _build(ledger, batch_shortfall=[])
    with pytest.raises(ValueError, match="finalizer_metrics_by_group must be a mapping"):
        _build(ledger, finalizer_metrics_by_group=[1])
    # The stricter rule stays: a sidecar the seed's own restore refuses is never written.
    with pytest.raises(ValueError, match="disagree on phase or target_step"):
        _build(ledger)
    with pytest.raises(ValueError, match="disagree on phase or target_step"):
        ledger.state_dict()


def test_the_seeds_field_errors_come_before_ours_stricter_ones() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, group_id="g0")
    with pytest.raises(ValueError, match="batch_shortfall entries must contain") as raised:
        _build(ledger, canonical_group_ids="g0", batch_shortfall={-1: 1})
    assert not isinstance(raised.value, BareStringError)
    with pytest.raises(BareStringError):
        _build(ledger, canonical_group_ids="g0")
    with pytest.raises(TypeError, match="FinalizedReward"):
        _build(ledger, batch_shortfall={1: 2**63}, finalizer_rewards_by_group={"g0": [None]})
    with pytest.raises(ValueError, match="fit in 64 bits"):
        _build(ledger, batch_shortfall={1: 2**63})


def _sidecar(**overrides: Any) -> dict[str, Any]:
    row = FinalizedReward(sample_id="3", rollout_id="r", reward=1.0).state_dict()
    state: dict[str, Any] = {
        "schema_version": 3,
        "groups": [],
        "batch_shortfall": {1: 2},
        "sampler_stamps_target_steps": True,
        "finalizer_metrics_by_group": {"g0": {"m": 1.0}},
        "finalizer_rewards_by_group": {"g0": [row]},
        "reward_settings": None,
    }
    state.update(overrides)
    return state


def test_a_lone_surrogate_in_a_finalized_reward_is_refused_after_the_seeds_checks() -> None:
    rows = {"g0": [{"sample_id": "\ud800", "rollout_id": "r", "reward": 1.0, "log_context": None}]}
    with pytest.raises(TypeError, match="batch_shortfall must be a dictionary"):
        parse_rollout_recovery_state(
            _sidecar(finalizer_rewards_by_group=rows, batch_shortfall=None)
        )
    with pytest.raises(ValueError, match="UTF-8") as raised:
        parse_rollout_recovery_state(_sidecar(finalizer_rewards_by_group=rows))
    assert getattr(raised.value, "path", None) == "$.finalizer_rewards_by_group['g0'][0].sample_id"
    # The seed's own row checks still come first for such a row.
    bad = {"g0": [{**rows["g0"][0], "reward": "1"}]}
    with pytest.raises(ValueError, match="finalized reward must be numeric"):
        parse_rollout_recovery_state(_sidecar(finalizer_rewards_by_group=bad, batch_shortfall=None))


# ------------------------------------------------------------------------------ restores


def test_an_equal_non_int_generation_index_restores_as_its_position() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, group_id="g", n=2)
    state = ledger.state_dict()
    hostile = copy.deepcopy(state)
    hostile["groups"][0]["siblings"][0]["generation_index"] = False
    hostile["groups"][0]["siblings"][1]["generation_index"] = 1.0
    restored = RolloutRecoveryLedger.from_state_dict(hostile)
    record = restored.get_group("g")
    assert [type(s.generation_index) for s in record.siblings] == [int, int]
    assert record.gate_rollout_ids == ledger.get_group("g").gate_rollout_ids
    restored.bind_runtime_prompt(CUT, "g", payload(7))
    assert restored.state_dict() == state
