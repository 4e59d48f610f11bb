"""Live transitions of the rollout-recovery ledger, against the seed's schema-3 contract.

Covers: the records' derived properties, every transition of the phase/status/attempt tables
(reference §3), every rejection of the API (§2.3) with its exception type and message start
and the proof that a refused call changes no state, copy semantics of returned records, the
runtime prompt payload kept by reference, and the format of ``state_dict``.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from ledger_support import (
    CHECKS,
    CUT,
    DEAD,
    DEAD_CUT_MESSAGE,
    LOG_CONTEXT,
    assert_primitive_tree,
    current_statuses,
    gate_id,
    make_receipt,
    payload,
    receipt_keys,
    reserve,
    seal,
    seal_results,
    snapshot,
    starts_with,
)

from rollout_recovery import (
    PromptGroupPhase,
    PromptGroupRecoveryRecord,
    PromptGroupStatus,
    PromptRef,
    RecoveryGranularity,
    RewardChecks,
    RewardLogContext,
    RolloutAttemptRecord,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    RolloutSiblingRecord,
    SiblingSealResult,
)

SIBLING = RecoveryGranularity.SIBLING
PROMPT_GROUP = RecoveryGranularity.PROMPT_GROUP
A = RolloutAttemptStatus
S = PromptGroupStatus


# --------------------------------------------------------------------------------------------
# ledger builders in each reachable state (group "g", prompt idx 7, N=2 unless told)


def fresh(**kw: Any) -> RolloutRecoveryLedger:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, **kw)
    return ledger


def dispatched(indices: list[int] | None = None, **kw: Any) -> RolloutRecoveryLedger:
    ledger = fresh(**kw)
    ledger.mark_group_dispatched(CUT, "g", generation_indices=indices)
    return ledger


def half_sealed(**kw: Any) -> RolloutRecoveryLedger:
    ledger = dispatched(**kw)
    seal(ledger, "g", 0, n_keys=2)
    return ledger


def ready(granularity: RecoveryGranularity = SIBLING, **kw: Any) -> RolloutRecoveryLedger:
    ledger = dispatched(granularity=granularity, **kw)
    if granularity is SIBLING:
        for index in range(ledger.get_group("g").expected_generations):
            seal(ledger, "g", index, n_keys=2)
    else:
        ledger.mark_group_sealed(CUT, "g", seal_results(ledger, "g", n_keys=2))
    return ledger


def finalizing(granularity: RecoveryGranularity = SIBLING) -> RolloutRecoveryLedger:
    ledger = ready(granularity)
    ledger.mark_finalization_started(CUT, "g")
    return ledger


def unknown(granularity: RecoveryGranularity = SIBLING) -> RolloutRecoveryLedger:
    ledger = finalizing(granularity)
    ledger.mark_finalization_unknown(CUT, "g")
    return ledger


def abandoned(granularity: RecoveryGranularity = SIBLING) -> RolloutRecoveryLedger:
    ledger = dispatched(granularity=granularity)
    ledger.abandon_unsealed(CUT, "g")
    return ledger


def seal_call(
    ledger: RolloutRecoveryLedger,
    index: int = 0,
    *,
    gate: str | None = None,
    receipt: Any = "default",
    reward: Any = 1.0,
    mask_sample: Any = False,
    reward_checks: RewardChecks | None = None,
    reward_log_context: RewardLogContext | None = None,
    group_id: str = "g",
    cut: Any = CUT,
) -> None:
    expected_gate = ledger.get_group(group_id).gate_rollout_id(index) if group_id in ledger else "x"
    gate = expected_gate if gate is None else gate
    if receipt == "default":
        receipt = make_receipt(expected_gate, 2)
    ledger.mark_sibling_sealed(
        cut,
        group_id,
        generation_index=index,
        gate_rollout_id=gate,
        receipt=receipt,
        reward=reward,
        mask_sample=mask_sample,
        reward_checks=reward_checks,
        reward_log_context=reward_log_context,
    )


# --------------------------------------------------------------------------------------------
# records and derived identities (§2.1, §2.2)


def test_prompt_ref_rejects_empty_sample_id() -> None:
    with pytest.raises(ValueError, match=starts_with("prompt sample_id must not be empty")):
        PromptRef(sample_id="")
    assert PromptRef(sample_id="7").task_name is None


def test_prompt_ref_is_frozen() -> None:
    ref = PromptRef(sample_id="7", task_name="math")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.sample_id = "8"  # type: ignore[misc]


def test_attempt_id_is_the_compact_uuid_hex() -> None:
    attempt_uuid = uuid.uuid4()
    record = RolloutAttemptRecord(attempt_uuid=attempt_uuid, status=A.RESERVED)
    assert record.attempt_id == attempt_uuid.hex
    assert record.receipt is None and record.reward is None and record.mask_sample is None
    assert record.reward_checks is None and record.reward_log_context is None
    assert record.staging_keys == []
    other = RolloutAttemptRecord(attempt_uuid=uuid.uuid4(), status=A.RESERVED)
    other.staging_keys.append("k")
    assert record.staging_keys == [], "staging_keys default must not be shared"


def test_current_attempt_is_the_last_attempt_and_requires_one() -> None:
    first = RolloutAttemptRecord(attempt_uuid=uuid.uuid4(), status=A.ABANDONED)
    second = RolloutAttemptRecord(attempt_uuid=uuid.uuid4(), status=A.RESERVED)
    assert RolloutSiblingRecord(generation_index=3, attempts=[first, second]).current_attempt is (
        second
    )
    empty = RolloutSiblingRecord(generation_index=3, attempts=[])
    with pytest.raises(RuntimeError, match=starts_with("generation index 3 has no attempts")):
        _ = empty.current_attempt


def test_group_record_derives_logical_and_gate_ids() -> None:
    ledger = fresh(n=3, group_id="grp")
    record = ledger.get_group("grp")
    assert record.logical_rollout_ids == ["grp_g0", "grp_g1", "grp_g2"]
    assert record.logical_rollout_id(5) == "grp_g5"
    expected = [
        f"grp_g{i}_a{sibling.current_attempt.attempt_uuid.hex}"
        for i, sibling in enumerate(record.siblings)
    ]
    assert record.gate_rollout_ids == expected
    assert [record.gate_rollout_id(i) for i in range(3)] == expected
    assert len(set(expected)) == 3


def test_gate_rollout_id_follows_the_current_attempt_after_retry() -> None:
    ledger = abandoned()
    before = ledger.get_group("g").gate_rollout_id(0)
    retried = ledger.prepare_incomplete_retry(CUT, "g")
    after = retried.gate_rollout_id(0)
    assert before != after
    assert after == f"g_g0_a{retried.siblings[0].attempts[-1].attempt_id}"
    assert retried.logical_rollout_id(0) == "g_g0"


def test_sealed_generation_indices_uses_current_attempts() -> None:
    ledger = half_sealed(n=3)
    assert ledger.get_group("g").sealed_generation_indices == [0]
    seal(ledger, "g", 2)
    assert ledger.get_group("g").sealed_generation_indices == [0, 2]


def test_prompt_payload_property_requires_a_runtime_prompt() -> None:
    ledger = fresh()
    record = ledger.get_group("g")
    assert record.prompt_payload == payload(7)
    unbound = dataclasses.replace(record, runtime_prompt_payload=None)
    with pytest.raises(
        RuntimeError,
        match=starts_with("recovery group 'g' has not rehydrated prompt sample_id='7'"),
    ):
        _ = unbound.prompt_payload


# --------------------------------------------------------------------------------------------
# reserve_group


def test_reserve_group_creates_reserved_attempts_and_returns_a_copy() -> None:
    ledger = RolloutRecoveryLedger()
    record = ledger.reserve_group(
        CUT,
        prompt_id="7",
        prompt_payload=payload(7, "math"),
        expected_generations=3,
        target_step=4,
        start_weight_version=2,
        task_source="genrm_compare",
        group_id="g",
        admission_id="batch-1",
    )
    assert isinstance(record, PromptGroupRecoveryRecord)
    assert record.group_id == "g"
    assert record.admission_id == "batch-1"
    assert record.prompt_id == "7"
    assert record.prompt_ref == PromptRef(sample_id="7", task_name="math")
    assert record.task_source == "genrm_compare"
    assert record.recovery_granularity is SIBLING
    assert record.expected_generations == 3
    assert record.target_step == 4
    assert record.start_weight_version == 2
    assert record.phase is PromptGroupPhase.ADMITTED
    assert record.status is S.GENERATING
    assert [s.generation_index for s in record.siblings] == [0, 1, 2]
    assert all(len(s.attempts) == 1 for s in record.siblings)
    assert all(s.current_attempt.status is A.RESERVED for s in record.siblings)
    uuids = {s.current_attempt.attempt_uuid for s in record.siblings}
    assert len(uuids) == 3
    assert all(isinstance(u, uuid.UUID) for u in uuids)
    assert len(ledger) == 1 and "g" in ledger
    assert ledger.get_group("g") == record
    assert ledger.expected_staging_keys() == set()


def test_reserve_group_defaults_group_and_admission_ids() -> None:
    ledger = RolloutRecoveryLedger()
    record = ledger.reserve_group(
        CUT,
        prompt_id="7",
        prompt_payload=payload(7),
        expected_generations=1,
        target_step=None,
        start_weight_version=0,
    )
    assert str(uuid.UUID(record.group_id)) == record.group_id
    assert record.admission_id == record.group_id
    assert record.recovery_granularity is SIBLING
    assert record.phase is PromptGroupPhase.ADMITTED
    assert record.task_source is None
    other = ledger.reserve_group(
        CUT,
        prompt_id="7",
        prompt_payload=payload(7),
        expected_generations=1,
        target_step=None,
        start_weight_version=0,
    )
    assert other.group_id != record.group_id


def test_reserve_group_empty_admission_id_falls_back_to_group_id() -> None:
    # Seed: ``admission_id = admission_id or group_id``; the empty-id error is unreachable.
    ledger = RolloutRecoveryLedger()
    record = reserve(ledger, admission_id="")
    assert record.admission_id == "g"


def test_reserve_group_uses_an_explicit_prompt_ref() -> None:
    ledger = RolloutRecoveryLedger()
    ref = PromptRef(sample_id="7", task_name="given")
    record = ledger.reserve_group(
        CUT,
        prompt_id="7",
        prompt_payload=payload(7, "other"),
        expected_generations=1,
        target_step=None,
        start_weight_version=0,
        group_id="g",
        prompt_ref=ref,
    )
    assert record.prompt_ref == ref


def test_reserve_group_does_not_validate_idx_until_checkpoint() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, prompt_payload={"task_name": None})
    with pytest.raises(
        ValueError,
        match=starts_with("recovery group 'g' prompt payload must contain an integer idx"),
    ):
        ledger.state_dict()


# --------------------------------------------------------------------------------------------
# §3.1 group phase


def test_reserve_unadmitted_then_admit_sets_step_and_weight_version() -> None:
    ledger = fresh(admitted=False, target_step=None, start_weight_version=0)
    before = ledger.get_group("g")
    assert before.phase is PromptGroupPhase.RESERVED
    ledger.mark_group_admitted(CUT, "g", target_step=11, start_weight_version=5)
    after = ledger.get_group("g")
    assert after.phase is PromptGroupPhase.ADMITTED
    assert after.target_step == 11
    assert after.start_weight_version == 5
    assert after.siblings == before.siblings, "admission must not replace sibling lineage"
    assert after.status is S.GENERATING


def test_reserved_group_can_be_admitted_exactly_once() -> None:
    ledger = fresh(admitted=False)
    ledger.mark_group_admitted(CUT, "g", target_step=3, start_weight_version=1)
    before = snapshot(ledger)
    with pytest.raises(ValueError, match=starts_with("recovery group 'g' is already admitted")):
        ledger.mark_group_admitted(CUT, "g", target_step=4, start_weight_version=2)
    assert snapshot(ledger) == before
    assert ledger.get_group("g").target_step == 3


def test_target_step_none_does_not_mean_unadmitted() -> None:
    ledger = fresh(admitted=True, target_step=None)
    assert ledger.get_group("g").phase is PromptGroupPhase.ADMITTED
    ledger.mark_group_dispatched(CUT, "g")
    assert current_statuses(ledger, "g") == ["dispatched", "dispatched"]
    assert ledger.state_dict()["groups"][0]["phase"] == "admitted"


def test_admission_has_no_status_check() -> None:
    # A RESERVED-phase group cannot be dispatched, so its status stays GENERATING; admission
    # leaves status untouched.
    ledger = fresh(admitted=False)
    ledger.abandon_unsealed(CUT, "g")
    ledger.mark_group_admitted(CUT, "g", target_step=None, start_weight_version=0)
    assert ledger.get_group("g").phase is PromptGroupPhase.ADMITTED
    assert current_statuses(ledger, "g") == ["abandoned", "abandoned"]


def test_dispatch_requires_admission_then_succeeds_after_it() -> None:
    ledger = fresh(admitted=False)
    with pytest.raises(
        ValueError, match=starts_with("cannot dispatch unadmitted recovery group 'g'")
    ):
        ledger.mark_group_dispatched(CUT, "g")
    ledger.mark_group_admitted(CUT, "g", target_step=1, start_weight_version=0)
    ledger.mark_group_dispatched(CUT, "g")
    assert current_statuses(ledger, "g") == ["dispatched", "dispatched"]


# --------------------------------------------------------------------------------------------
# §3.3 attempt status and §3.2 group status: dispatch and seal


def test_dispatch_all_siblings_by_default() -> None:
    ledger = dispatched(n=3)
    assert current_statuses(ledger, "g") == ["dispatched"] * 3
    assert ledger.get_group("g").status is S.GENERATING


def test_dispatch_a_subset_then_the_rest() -> None:
    ledger = dispatched(indices=[1], n=3)
    assert current_statuses(ledger, "g") == ["reserved", "dispatched", "reserved"]
    ledger.mark_group_dispatched(CUT, "g", generation_indices=[0, 2])
    assert current_statuses(ledger, "g") == ["dispatched"] * 3


def test_dispatch_of_an_empty_selection_is_a_no_op() -> None:
    ledger = fresh()
    before = snapshot(ledger)
    ledger.mark_group_dispatched(CUT, "g", generation_indices=[])
    assert snapshot(ledger) == before


def test_dispatch_keeps_attempt_identity() -> None:
    ledger = fresh()
    before = [s.current_attempt.attempt_uuid for s in ledger.get_group("g").siblings]
    ledger.mark_group_dispatched(CUT, "g")
    after = ledger.get_group("g")
    assert [s.current_attempt.attempt_uuid for s in after.siblings] == before
    assert all(len(s.attempts) == 1 for s in after.siblings)


def test_streamed_seal_records_the_receipt_and_readies_the_group_on_the_last_sibling() -> None:
    ledger = dispatched()
    gate0 = gate_id(ledger, "g", 0)
    seal(
        ledger,
        "g",
        0,
        n_keys=2,
        reward=-2.0,
        mask_sample=True,
        reward_checks=CHECKS,
        reward_log_context=LOG_CONTEXT,
    )
    record = ledger.get_group("g")
    attempt = record.siblings[0].current_attempt
    assert attempt.status is A.SEALED
    assert attempt.receipt == make_receipt(gate0, 2)
    assert attempt.reward == -2.0
    assert attempt.mask_sample is True
    assert attempt.reward_checks == CHECKS
    assert attempt.reward_log_context == LOG_CONTEXT
    assert attempt.staging_keys == receipt_keys(gate0, 2)
    assert record.status is S.GENERATING
    assert ledger.expected_staging_keys() == set(receipt_keys(gate0, 2))

    gate1 = gate_id(ledger, "g", 1)
    seal(ledger, "g", 1, n_keys=1)
    assert ledger.get_group("g").status is S.READY_TO_FINALIZE
    assert ledger.expected_staging_keys() == set(receipt_keys(gate0, 2) + receipt_keys(gate1, 1))


def test_seal_converts_an_integer_reward_to_float() -> None:
    ledger = dispatched()
    seal(ledger, "g", 0, reward=1)  # type: ignore[arg-type]
    reward = ledger.get_group("g").siblings[0].current_attempt.reward
    assert reward == 1.0 and type(reward) is float


def test_seal_with_a_missing_receipt_is_a_sealed_placeholder_without_staging_keys() -> None:
    ledger = dispatched()
    seal(ledger, "g", 0, missing_receipt=True, reward=0.0, mask_sample=True)
    attempt = ledger.get_group("g").siblings[0].current_attempt
    assert attempt.status is A.SEALED
    assert attempt.receipt is None
    assert attempt.staging_keys == []
    assert attempt.mask_sample is True
    assert ledger.expected_staging_keys() == set()


def test_staging_keys_keep_manifest_order_and_duplicates() -> None:
    ledger = dispatched()
    gate = gate_id(ledger, "g", 0)
    receipt = {
        "rollout_id": gate,
        "manifest": [
            {"staging_key": f"{gate}/b"},
            {"staging_key": f"{gate}/a"},
            {"staging_key": f"{gate}/b"},
        ],
    }
    seal_call(ledger, 0, receipt=receipt)
    assert ledger.get_group("g").siblings[0].current_attempt.staging_keys == [
        f"{gate}/b",
        f"{gate}/a",
        f"{gate}/b",
    ]


def test_empty_manifest_seals_with_no_staging_keys() -> None:
    ledger = dispatched()
    seal_call(ledger, 0, receipt={"rollout_id": gate_id(ledger, "g", 0), "manifest": []})
    attempt = ledger.get_group("g").siblings[0].current_attempt
    assert attempt.status is A.SEALED and attempt.staging_keys == []


def test_identical_duplicate_seal_is_a_no_op() -> None:
    ledger = dispatched()
    seal(ledger, "g", 0, n_keys=2, reward=1.0, reward_checks=CHECKS, reward_log_context=LOG_CONTEXT)
    before = snapshot(ledger)
    seal(ledger, "g", 0, n_keys=2, reward=1.0, reward_checks=CHECKS, reward_log_context=LOG_CONTEXT)
    # float(reward) is compared, so an equal int is the same seal
    seal(ledger, "g", 0, n_keys=2, reward=1, reward_checks=CHECKS, reward_log_context=LOG_CONTEXT)  # type: ignore[arg-type]
    assert snapshot(ledger) == before


def test_identical_duplicate_seal_is_a_no_op_after_the_group_is_ready_or_finalizing() -> None:
    ledger = ready()
    before = snapshot(ledger)
    seal(ledger, "g", 1, n_keys=2)
    assert snapshot(ledger) == before
    ledger.mark_finalization_started(CUT, "g")
    before = snapshot(ledger)
    seal(ledger, "g", 0, n_keys=2)
    assert snapshot(ledger) == before


def _conflicts() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("reward", {"reward": 2.0}),
        ("mask_sample", {"mask_sample": True}),
        ("receipt_none", {"receipt": None}),
        ("receipt_extra_field", {"receipt": "extra"}),
        ("receipt_fewer_keys", {"receipt": "fewer"}),
        ("reward_checks_added", {"reward_checks": CHECKS}),
        (
            "reward_checks_duplicated_reasoning",
            {
                "base_checks": True,
                "reward_checks": msgspec.structs.replace(CHECKS, duplicated_reasoning=False),
            },
        ),
        (
            "reward_checks_empty_final_answer",
            {
                "base_checks": True,
                "reward_checks": msgspec.structs.replace(CHECKS, empty_final_answer=False),
            },
        ),
        (
            "reward_checks_low_effort",
            {
                "base_checks": True,
                "reward_checks": msgspec.structs.replace(CHECKS, low_effort=False),
            },
        ),
        ("reward_log_context_added", {"reward_log_context": LOG_CONTEXT}),
        (
            "reward_log_context_agent",
            {"base_context": True, "reward_log_context": RewardLogContext(agent_name="other")},
        ),
    ]


@pytest.mark.parametrize(("name", "change"), _conflicts(), ids=[c[0] for c in _conflicts()])
def test_conflicting_duplicate_seal_is_rejected_and_changes_nothing(
    name: str, change: dict[str, Any]
) -> None:
    change = dict(change)
    base_checks = CHECKS if change.pop("base_checks", False) else None
    base_context = LOG_CONTEXT if change.pop("base_context", False) else None
    ledger = dispatched()
    gate = gate_id(ledger, "g", 0)
    seal_call(ledger, 0, reward_checks=base_checks, reward_log_context=base_context)
    before = snapshot(ledger)
    kwargs: dict[str, Any] = {"reward_checks": base_checks, "reward_log_context": base_context}
    kwargs.update(change)
    if kwargs.get("receipt") == "extra":
        kwargs["receipt"] = {**make_receipt(gate, 2), "extra": 1}
    elif kwargs.get("receipt") == "fewer":
        kwargs["receipt"] = make_receipt(gate, 1)
    with pytest.raises(ValueError, match=starts_with("conflicting duplicate seal for 'g_g0'")):
        seal_call(ledger, 0, **kwargs)
    assert snapshot(ledger) == before


def test_prompt_group_seal_seals_every_sibling_atomically() -> None:
    ledger = dispatched(granularity=PROMPT_GROUP, n=3)
    results = seal_results(
        ledger, "g", n_keys=2, missing=frozenset({1}), reward=0.5, mask_sample=True
    )
    ledger.mark_group_sealed(CUT, "g", results)
    record = ledger.get_group("g")
    assert record.status is S.READY_TO_FINALIZE
    assert current_statuses(ledger, "g") == ["sealed"] * 3
    for index, sibling in enumerate(record.siblings):
        attempt = sibling.current_attempt
        assert attempt.receipt == results[index].receipt
        assert attempt.reward == 0.5 and attempt.mask_sample is True
    assert record.siblings[1].current_attempt.staging_keys == []
    expected = set()
    for index in (0, 2):
        expected |= set(receipt_keys(record.gate_rollout_id(index), 2))
    assert ledger.expected_staging_keys() == expected


def test_prompt_group_seal_stores_reward_checks_and_context() -> None:
    ledger = dispatched(granularity=PROMPT_GROUP)
    record = ledger.get_group("g")
    results = {
        i: SiblingSealResult(
            gate_rollout_id=record.gate_rollout_id(i),
            receipt=make_receipt(record.gate_rollout_id(i)),
            reward=1,
            mask_sample=False,
            reward_checks=CHECKS,
            reward_log_context=LOG_CONTEXT,
        )
        for i in range(2)
    }
    ledger.mark_group_sealed(CUT, "g", results)
    for sibling in ledger.get_group("g").siblings:
        attempt = sibling.current_attempt
        assert attempt.reward_checks == CHECKS
        assert attempt.reward_log_context == LOG_CONTEXT
        assert attempt.reward == 1.0 and type(attempt.reward) is float


def test_prompt_group_seal_is_atomic() -> None:
    ledger = dispatched(granularity=PROMPT_GROUP)
    results = seal_results(ledger, "g")
    del results[1]
    before = snapshot(ledger)
    with pytest.raises(
        ValueError,
        match=starts_with(
            "prompt-group seal requires every logical sibling exactly once: "
            "expected=[0, 1], actual=[0]"
        ),
    ):
        ledger.mark_group_sealed(CUT, "g", results)
    assert snapshot(ledger) == before
    assert ledger.get_group("g").sealed_generation_indices == []


def test_prompt_group_seal_has_no_idempotent_duplicate() -> None:
    ledger = dispatched(granularity=PROMPT_GROUP)
    results = seal_results(ledger, "g")
    ledger.mark_group_sealed(CUT, "g", results)
    before = snapshot(ledger)
    with pytest.raises(
        ValueError, match=starts_with("cannot seal group 'g' from status 'ready_to_finalize'")
    ):
        ledger.mark_group_sealed(CUT, "g", results)
    assert snapshot(ledger) == before


# --------------------------------------------------------------------------------------------
# abandon, retry, restart


def test_abandon_unsealed_keeps_sealed_siblings_at_sibling_granularity() -> None:
    ledger = dispatched(n=3, indices=[0, 1])
    seal(ledger, "g", 0)
    kept = ledger.get_group("g").siblings[0]
    ledger.abandon_unsealed(CUT, "g")
    record = ledger.get_group("g")
    assert current_statuses(ledger, "g") == ["sealed", "abandoned", "abandoned"]
    assert record.siblings[0] == kept
    assert record.status is S.GENERATING
    assert all(len(s.attempts) == 1 for s in record.siblings)


def test_abandon_unsealed_is_idempotent() -> None:
    ledger = abandoned()
    before = snapshot(ledger)
    ledger.abandon_unsealed(CUT, "g")
    assert snapshot(ledger) == before


@pytest.mark.parametrize("granularity", [SIBLING, PROMPT_GROUP])
def test_abandon_unsealed_on_a_ready_group_keeps_it_ready(granularity: RecoveryGranularity) -> None:
    ledger = ready(granularity)
    before = snapshot(ledger)
    ledger.abandon_unsealed(CUT, "g")
    assert snapshot(ledger) == before
    assert ledger.get_group("g").status is S.READY_TO_FINALIZE


def test_abandon_unsealed_on_a_prompt_group_abandons_the_whole_cohort() -> None:
    ledger = dispatched(granularity=PROMPT_GROUP, indices=[0])
    ledger.abandon_unsealed(CUT, "g")
    assert current_statuses(ledger, "g") == ["abandoned", "abandoned"]
    assert ledger.get_group("g").status is S.GENERATING


def test_retry_of_a_fresh_group_is_a_no_op() -> None:
    ledger = fresh()
    before = snapshot(ledger)
    record = ledger.prepare_incomplete_retry(CUT, "g")
    assert snapshot(ledger) == before
    assert record == ledger.get_group("g")


def test_retry_preserves_logical_id_and_reuses_sealed_sibling() -> None:
    ledger = dispatched(n=3)
    seal(ledger, "g", 0, n_keys=2)
    sealed_attempt = ledger.get_group("g").siblings[0].current_attempt
    old = ledger.get_group("g")
    ledger.abandon_unsealed(CUT, "g")
    retried = ledger.prepare_incomplete_retry(CUT, "g")
    assert retried == ledger.get_group("g")
    assert retried.siblings[0].attempts == [sealed_attempt]
    for index in (1, 2):
        attempts = retried.siblings[index].attempts
        assert len(attempts) == 2
        assert attempts[0].status is A.ABANDONED
        assert attempts[0].attempt_uuid == old.siblings[index].current_attempt.attempt_uuid
        assert attempts[1].status is A.RESERVED
        assert attempts[1].attempt_uuid != attempts[0].attempt_uuid
        assert retried.logical_rollout_id(index) == old.logical_rollout_id(index)
        assert retried.gate_rollout_id(index) != old.gate_rollout_id(index)
    assert retried.status is S.GENERATING
    assert ledger.expected_staging_keys() == set(receipt_keys(old.gate_rollout_id(0), 2))


def test_retry_leaves_reserved_attempts_alone() -> None:
    ledger = abandoned(SIBLING)
    ledger.prepare_incomplete_retry(CUT, "g")
    before = snapshot(ledger)
    ledger.prepare_incomplete_retry(CUT, "g")
    assert snapshot(ledger) == before
    assert [len(s.attempts) for s in ledger.get_group("g").siblings] == [2, 2]


def test_prompt_group_retry_mints_a_fresh_cohort() -> None:
    ledger = abandoned(PROMPT_GROUP)
    retried = ledger.prepare_incomplete_retry(CUT, "g")
    assert [len(s.attempts) for s in retried.siblings] == [2, 2]
    assert current_statuses(ledger, "g") == ["reserved", "reserved"]
    ledger.mark_group_dispatched(CUT, "g")
    ledger.mark_group_sealed(CUT, "g", seal_results(ledger, "g"))
    assert ledger.get_group("g").status is S.READY_TO_FINALIZE


def test_stale_gate_id_of_an_abandoned_attempt_cannot_seal_the_retry() -> None:
    ledger = dispatched()
    stale = gate_id(ledger, "g", 0)
    ledger.abandon_unsealed(CUT, "g")
    ledger.prepare_incomplete_retry(CUT, "g")
    ledger.mark_group_dispatched(CUT, "g")
    fresh_gate = gate_id(ledger, "g", 0)
    before = snapshot(ledger)
    with pytest.raises(
        ValueError,
        match=starts_with(
            f"streamed rollout identity mismatch: result={stale!r}, expected={fresh_gate!r}"
        ),
    ):
        seal_call(ledger, 0, gate=stale, receipt=make_receipt(stale))
    assert snapshot(ledger) == before


def test_prepare_for_restart_preserves_sealed_and_abandons_inflight() -> None:
    ledger = dispatched(n=3, indices=[0, 1])
    seal(ledger, "g", 0, n_keys=2)
    reserve(ledger, 8, group_id="ready")
    ledger.mark_group_dispatched(CUT, "ready")
    seal(ledger, "ready", 0)
    seal(ledger, "ready", 1)
    ready_before = ledger.get_group("ready")
    keys_before = ledger.expected_staging_keys()
    ledger.prepare_for_restart(CUT)
    assert current_statuses(ledger, "g") == ["sealed", "abandoned", "abandoned"]
    assert ledger.get_group("g").status is S.GENERATING
    assert ledger.get_group("ready") == ready_before
    assert ledger.expected_staging_keys() == keys_before


def test_prepare_for_restart_on_a_prompt_group_clears_the_cohort() -> None:
    ledger = dispatched(granularity=PROMPT_GROUP, task_source="genrm_compare")
    ledger.prepare_for_restart(CUT)
    record = ledger.get_group("g")
    assert current_statuses(ledger, "g") == ["abandoned", "abandoned"]
    assert record.status is S.GENERATING
    assert ledger.expected_staging_keys() == set()


def test_prepare_for_restart_keeps_reserved_phase_groups_reserved() -> None:
    ledger = fresh(admitted=False)
    ledger.prepare_for_restart(CUT)
    record = ledger.get_group("g")
    assert record.phase is PromptGroupPhase.RESERVED
    assert current_statuses(ledger, "g") == ["abandoned", "abandoned"]


# --------------------------------------------------------------------------------------------
# finalization and discard


@pytest.mark.parametrize("granularity", [SIBLING, PROMPT_GROUP])
def test_finalization_started_then_unknown(granularity: RecoveryGranularity) -> None:
    ledger = ready(granularity)
    ledger.mark_finalization_started(CUT, "g")
    assert ledger.get_group("g").status is S.FINALIZING
    ledger.mark_finalization_unknown(CUT, "g")
    assert ledger.get_group("g").status is S.FINALIZATION_UNKNOWN
    assert current_statuses(ledger, "g") == ["sealed", "sealed"]


@pytest.mark.parametrize(
    "build", [fresh, dispatched, half_sealed, ready, finalizing, unknown, abandoned]
)
def test_discard_group_removes_a_group_in_any_status(
    build: Callable[[], RolloutRecoveryLedger],
) -> None:
    ledger = build()
    reserve(ledger, 9, group_id="other")
    other = ledger.get_group("other")
    ledger.discard_group(CUT, "g")
    assert "g" not in ledger
    assert len(ledger) == 1
    assert ledger.get_group("other") == other
    assert [g.group_id for g in ledger.groups()] == ["other"]
    with pytest.raises(ValueError, match=starts_with("unknown recovery group_id='g'")):
        ledger.get_group("g")


def test_discarding_a_finalizing_group_makes_the_ledger_checkpoint_safe_again() -> None:
    ledger = finalizing()
    with pytest.raises(RuntimeError):
        ledger.state_dict()
    ledger.discard_group(CUT, "g")
    assert ledger.state_dict() == {"schema_version": 3, "groups": []}


def test_canonical_groups_are_discarded_without_touching_unfinished_groups() -> None:
    ledger = ready()
    reserve(ledger, 9, group_id="unfinished")
    unfinished = ledger.get_group("unfinished")
    assert ledger.discard_canonical_groups(CUT, {"g", "not-owned"}) == 1
    assert "g" not in ledger and "unfinished" in ledger
    assert ledger.get_group("unfinished") == unfinished
    assert ledger.discard_canonical_groups(CUT, {"not-owned"}) == 0
    assert ledger.discard_canonical_groups(CUT, set()) == 0
    assert len(ledger) == 1


def test_discard_canonical_groups_counts_every_owned_group_in_any_status() -> None:
    ledger = unknown()
    reserve(ledger, 9, group_id="b")
    reserve(ledger, 10, group_id="c")
    assert ledger.discard_canonical_groups(CUT, {"g", "c", "zzz"}) == 2
    assert [g.group_id for g in ledger.groups()] == ["b"]


# --------------------------------------------------------------------------------------------
# container protocol and checkpoint safety


def test_len_contains_and_groups_in_reservation_order() -> None:
    ledger = RolloutRecoveryLedger()
    assert len(ledger) == 0 and ledger.groups() == []
    for idx, gid in ((3, "c"), (1, "a"), (2, "b")):
        reserve(ledger, idx, group_id=gid)
    assert len(ledger) == 3
    assert [g.group_id for g in ledger.groups()] == ["c", "a", "b"]
    assert "a" in ledger
    assert "z" not in ledger
    assert 1 not in ledger
    assert None not in ledger
    assert ["a"] not in ledger  # unhashable, still just "not contained"
    ledger.discard_group(CUT, "a")
    reserve(ledger, 1, group_id="a")
    assert [g.group_id for g in ledger.groups()] == ["c", "b", "a"]


@pytest.mark.parametrize("build", [finalizing, unknown], ids=["finalizing", "unknown"])
def test_checkpoint_rejects_ambiguous_finalization_state(
    build: Callable[[], RolloutRecoveryLedger],
) -> None:
    ledger = build()
    reserve(ledger, 9, group_id="other")
    with pytest.raises(
        RuntimeError,
        match=starts_with("rollout recovery contains checkpoint-unsafe group states: groups=['g']"),
    ):
        ledger.assert_checkpoint_safe()
    before = snapshot(ledger)
    with pytest.raises(
        RuntimeError,
        match=starts_with("rollout recovery contains checkpoint-unsafe group states: groups=['g']"),
    ):
        ledger.state_dict()
    assert snapshot(ledger) == before


def test_checkpoint_unsafe_error_lists_every_unsafe_group() -> None:
    ledger = finalizing()
    reserve(ledger, 9, group_id="h")
    ledger.mark_group_dispatched(CUT, "h")
    seal(ledger, "h", 0)
    seal(ledger, "h", 1)
    ledger.mark_finalization_started(CUT, "h")
    ledger.mark_finalization_unknown(CUT, "h")
    with pytest.raises(
        RuntimeError,
        match=starts_with(
            "rollout recovery contains checkpoint-unsafe group states: groups=['g', 'h']"
        ),
    ):
        ledger.assert_checkpoint_safe()


@pytest.mark.parametrize("build", [fresh, dispatched, half_sealed, ready, abandoned])
def test_assert_checkpoint_safe_accepts_every_other_status(
    build: Callable[[], RolloutRecoveryLedger],
) -> None:
    build().assert_checkpoint_safe()


# --------------------------------------------------------------------------------------------
# rejections: type, message start, and "a refused call changes no state"

Case = tuple[
    str,
    Callable[[], RolloutRecoveryLedger],
    Callable[[RolloutRecoveryLedger], Any],
    type[BaseException],
    Any,  # str, or callable(ledger) -> str evaluated before the call
]


def _reserve_kw(ledger: RolloutRecoveryLedger, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "prompt_id": "7",
        "prompt_payload": payload(7),
        "expected_generations": 2,
        "target_step": 1,
        "start_weight_version": 0,
        "group_id": "new",
    }
    args.update(kw)
    cut = args.pop("cut", CUT)
    return ledger.reserve_group(cut, **args)


def _gate(index: int) -> Callable[[RolloutRecoveryLedger], str]:
    return lambda ledger: gate_id(ledger, "g", index)


def _results_with(
    ledger: RolloutRecoveryLedger, index: int, **change: Any
) -> dict[int, SiblingSealResult]:
    results = seal_results(ledger, "g")
    results[index] = dataclasses.replace(results[index], **change)
    return results


REFUSALS: list[Case] = [
    # reserve_group
    (
        "reserve-empty-prompt-id",
        fresh,
        lambda ledger: _reserve_kw(ledger, prompt_id=""),
        ValueError,
        "prompt_id must not be empty",
    ),
    (
        "reserve-empty-prompt-id-checked-first",
        fresh,
        lambda ledger: _reserve_kw(ledger, prompt_id="", expected_generations=0, group_id="g"),
        ValueError,
        "prompt_id must not be empty",
    ),
    (
        "reserve-task-name-not-str",
        fresh,
        lambda ledger: _reserve_kw(ledger, prompt_payload=payload(7, 5)),
        TypeError,
        "prompt task_name must be a string or None",
    ),
    (
        "reserve-prompt-ref-mismatch",
        fresh,
        lambda ledger: _reserve_kw(ledger, prompt_ref=PromptRef(sample_id="8")),
        ValueError,
        "dataset prompt reference must match prompt_id: '8' != '7'",
    ),
    (
        "reserve-zero-generations",
        fresh,
        lambda ledger: _reserve_kw(ledger, expected_generations=0),
        ValueError,
        "expected_generations must be at least one",
    ),
    (
        "reserve-negative-generations",
        fresh,
        lambda ledger: _reserve_kw(ledger, expected_generations=-1),
        ValueError,
        "expected_generations must be at least one",
    ),
    (
        "reserve-duplicate-group-id",
        ready,
        lambda ledger: _reserve_kw(ledger, group_id="g"),
        ValueError,
        "duplicate recovery group_id='g'",
    ),
    # mark_group_admitted
    (
        "admit-already-admitted",
        fresh,
        lambda ledger: ledger.mark_group_admitted(CUT, "g", target_step=9, start_weight_version=9),
        ValueError,
        "recovery group 'g' is already admitted",
    ),
    # bind_runtime_prompt
    (
        "bind-missing-idx",
        fresh,
        lambda ledger: ledger.bind_runtime_prompt(CUT, "g", {"task_name": None}),
        ValueError,
        "recovery group 'g' prompt payload must contain an integer idx",
    ),
    (
        "bind-bool-idx",
        lambda: fresh(idx=1),
        lambda ledger: ledger.bind_runtime_prompt(CUT, "g", payload(True)),
        ValueError,
        "recovery group 'g' prompt payload must contain an integer idx",
    ),
    (
        "bind-str-idx",
        fresh,
        lambda ledger: ledger.bind_runtime_prompt(CUT, "g", payload("7")),
        ValueError,
        "recovery group 'g' prompt payload must contain an integer idx",
    ),
    (
        "bind-wrong-sample",
        fresh,
        lambda ledger: ledger.bind_runtime_prompt(CUT, "g", payload(8)),
        ValueError,
        "recovery group 'g' resolved sample_id=8; expected '7'",
    ),
    (
        "bind-task-name-not-str",
        fresh,
        lambda ledger: ledger.bind_runtime_prompt(CUT, "g", payload(7, 3)),
        TypeError,
        "prompt task_name must be a string or None",
    ),
    (
        "bind-wrong-task-name",
        fresh,
        lambda ledger: ledger.bind_runtime_prompt(CUT, "g", payload(7, "other")),
        ValueError,
        "recovery group 'g' resolved task_name='other'; expected None",
    ),
    (
        "bind-missing-task-name-when-expected",
        lambda: fresh(task_name="math"),
        lambda ledger: ledger.bind_runtime_prompt(CUT, "g", {"idx": 7}),
        ValueError,
        "recovery group 'g' resolved task_name=None; expected 'math'",
    ),
    # prepare_for_restart
    (
        "restart-finalizing",
        finalizing,
        lambda ledger: ledger.prepare_for_restart(CUT),
        RuntimeError,
        "rollout recovery contains checkpoint-unsafe group states: groups=['g']",
    ),
    (
        "restart-unknown",
        unknown,
        lambda ledger: ledger.prepare_for_restart(CUT),
        RuntimeError,
        "rollout recovery contains checkpoint-unsafe group states: groups=['g']",
    ),
    # prepare_incomplete_retry
    (
        "retry-ready",
        ready,
        lambda ledger: ledger.prepare_incomplete_retry(CUT, "g"),
        ValueError,
        "cannot retry group 'g' from status 'ready_to_finalize'",
    ),
    (
        "retry-finalizing",
        finalizing,
        lambda ledger: ledger.prepare_incomplete_retry(CUT, "g"),
        ValueError,
        "cannot retry group 'g' from status 'finalizing'",
    ),
    (
        "retry-unknown",
        unknown,
        lambda ledger: ledger.prepare_incomplete_retry(CUT, "g"),
        ValueError,
        "cannot retry group 'g' from status 'finalization_unknown'",
    ),
    (
        "retry-dispatched",
        dispatched,
        lambda ledger: ledger.prepare_incomplete_retry(CUT, "g"),
        ValueError,
        "cannot retry logical rollout 'g_g0' from status 'dispatched'",
    ),
    (
        "retry-dispatched-second-sibling",
        lambda: dispatched(indices=[1]),
        lambda ledger: ledger.prepare_incomplete_retry(CUT, "g"),
        ValueError,
        "cannot retry logical rollout 'g_g1' from status 'dispatched'",
    ),
    (
        "retry-prompt-group-dispatched",
        lambda: dispatched(granularity=PROMPT_GROUP),
        lambda ledger: ledger.prepare_incomplete_retry(CUT, "g"),
        ValueError,
        "cannot retry logical rollout 'g_g0' from status 'dispatched'",
    ),
    # mark_group_dispatched
    (
        "dispatch-unadmitted",
        lambda: fresh(admitted=False),
        lambda ledger: ledger.mark_group_dispatched(CUT, "g"),
        ValueError,
        "cannot dispatch unadmitted recovery group 'g'",
    ),
    (
        "dispatch-ready",
        ready,
        lambda ledger: ledger.mark_group_dispatched(CUT, "g"),
        ValueError,
        "cannot dispatch group 'g' from 'ready_to_finalize'",
    ),
    (
        "dispatch-finalizing",
        finalizing,
        lambda ledger: ledger.mark_group_dispatched(CUT, "g"),
        ValueError,
        "cannot dispatch group 'g' from 'finalizing'",
    ),
    (
        "dispatch-unknown",
        unknown,
        lambda ledger: ledger.mark_group_dispatched(CUT, "g"),
        ValueError,
        "cannot dispatch group 'g' from 'finalization_unknown'",
    ),
    (
        "dispatch-index-too-large",
        fresh,
        lambda ledger: ledger.mark_group_dispatched(CUT, "g", generation_indices=[0, 2]),
        ValueError,
        "generation_index=2 is outside group 'g'",
    ),
    (
        "dispatch-negative-index",
        fresh,
        lambda ledger: ledger.mark_group_dispatched(CUT, "g", generation_indices=[-1]),
        ValueError,
        "generation_index=-1 is outside group 'g'",
    ),
    (
        "dispatch-dispatched",
        dispatched,
        lambda ledger: ledger.mark_group_dispatched(CUT, "g"),
        ValueError,
        "only reserved rollout attempts may be dispatched",
    ),
    (
        "dispatch-is-all-or-nothing",
        lambda: dispatched(indices=[1]),
        lambda ledger: ledger.mark_group_dispatched(CUT, "g", generation_indices=[0, 1]),
        ValueError,
        "only reserved rollout attempts may be dispatched",
    ),
    (
        "dispatch-sealed",
        half_sealed,
        lambda ledger: ledger.mark_group_dispatched(CUT, "g", generation_indices=[0]),
        ValueError,
        "only reserved rollout attempts may be dispatched",
    ),
    (
        "dispatch-abandoned",
        abandoned,
        lambda ledger: ledger.mark_group_dispatched(CUT, "g"),
        ValueError,
        "only reserved rollout attempts may be dispatched",
    ),
    # mark_sibling_sealed
    (
        "seal-prompt-group-granularity",
        lambda: dispatched(granularity=PROMPT_GROUP),
        lambda ledger: seal_call(ledger, 0),
        ValueError,
        "prompt-group recovery must seal every sibling atomically",
    ),
    (
        "seal-granularity-checked-before-index",
        lambda: dispatched(granularity=PROMPT_GROUP),
        lambda ledger: ledger.mark_sibling_sealed(
            CUT,
            "g",
            generation_index=9,
            gate_rollout_id="x",
            receipt=None,
            reward=0.0,
            mask_sample=False,
        ),
        ValueError,
        "prompt-group recovery must seal every sibling atomically",
    ),
    (
        "seal-index-outside",
        dispatched,
        lambda ledger: ledger.mark_sibling_sealed(
            CUT,
            "g",
            generation_index=2,
            gate_rollout_id="x",
            receipt=None,
            reward=0.0,
            mask_sample=False,
        ),
        ValueError,
        "generation_index=2 is outside group 'g'",
    ),
    (
        "seal-negative-index",
        dispatched,
        lambda ledger: ledger.mark_sibling_sealed(
            CUT,
            "g",
            generation_index=-1,
            gate_rollout_id="x",
            receipt=None,
            reward=0.0,
            mask_sample=False,
        ),
        ValueError,
        "generation_index=-1 is outside group 'g'",
    ),
    (
        "seal-receipt-without-manifest",
        dispatched,
        lambda ledger: seal_call(ledger, 0, receipt={"rollout_id": gate_id(ledger, "g", 0)}),
        ValueError,
        "sealed rollout receipt must contain a manifest list",
    ),
    (
        "seal-manifest-not-list",
        dispatched,
        lambda ledger: seal_call(
            ledger, 0, receipt={"rollout_id": gate_id(ledger, "g", 0), "manifest": {"a": 1}}
        ),
        ValueError,
        "sealed rollout receipt must contain a manifest list",
    ),
    (
        "seal-manifest-entry-not-dict",
        dispatched,
        lambda ledger: seal_call(
            ledger, 0, receipt={"rollout_id": gate_id(ledger, "g", 0), "manifest": ["k"]}
        ),
        ValueError,
        "sealed rollout receipt manifest entries must contain string staging_key values",
    ),
    (
        "seal-manifest-entry-without-key",
        dispatched,
        lambda ledger: seal_call(
            ledger, 0, receipt={"rollout_id": gate_id(ledger, "g", 0), "manifest": [{"k": "v"}]}
        ),
        ValueError,
        "sealed rollout receipt manifest entries must contain string staging_key values",
    ),
    (
        "seal-manifest-entry-non-str-key",
        dispatched,
        lambda ledger: seal_call(
            ledger,
            0,
            receipt={"rollout_id": gate_id(ledger, "g", 0), "manifest": [{"staging_key": 3}]},
        ),
        ValueError,
        "sealed rollout receipt manifest entries must contain string staging_key values",
    ),
    (
        "seal-manifest-checked-before-mask",
        dispatched,
        lambda ledger: seal_call(
            ledger, 0, receipt={"rollout_id": gate_id(ledger, "g", 0)}, mask_sample=1
        ),
        ValueError,
        "sealed rollout receipt must contain a manifest list",
    ),
    (
        "seal-mask-not-bool",
        dispatched,
        lambda ledger: seal_call(ledger, 0, mask_sample=0),
        TypeError,
        "mask_sample must be a bool",
    ),
    (
        "seal-mask-none",
        dispatched,
        lambda ledger: seal_call(ledger, 0, mask_sample=None),
        TypeError,
        "mask_sample must be a bool",
    ),
    (
        "seal-mask-checked-before-identity",
        dispatched,
        lambda ledger: seal_call(ledger, 0, gate="wrong", mask_sample="yes"),
        TypeError,
        "mask_sample must be a bool",
    ),
    (
        "seal-gate-mismatch",
        dispatched,
        lambda ledger: seal_call(ledger, 0, gate="wrong"),
        ValueError,
        lambda ledger: (
            "streamed rollout identity mismatch: result='wrong', "
            f"expected={gate_id(ledger, 'g', 0)!r}"
        ),
    ),
    (
        "seal-gate-of-other-sibling",
        dispatched,
        lambda ledger: seal_call(ledger, 0, gate=gate_id(ledger, "g", 1), receipt=None),
        ValueError,
        lambda ledger: (
            f"streamed rollout identity mismatch: result={gate_id(ledger, 'g', 1)!r}, "
            f"expected={gate_id(ledger, 'g', 0)!r}"
        ),
    ),
    (
        "seal-receipt-identity-mismatch",
        dispatched,
        lambda ledger: seal_call(ledger, 0, receipt={"rollout_id": "other", "manifest": []}),
        ValueError,
        lambda ledger: (
            "receipt rollout identity mismatch: receipt='other', "
            f"expected={gate_id(ledger, 'g', 0)!r}"
        ),
    ),
    (
        "seal-receipt-without-rollout-id",
        dispatched,
        lambda ledger: seal_call(ledger, 0, receipt={"manifest": []}),
        ValueError,
        lambda ledger: (
            f"receipt rollout identity mismatch: receipt=None, expected={gate_id(ledger, 'g', 0)!r}"
        ),
    ),
    (
        "seal-identity-checked-before-duplicate",
        half_sealed,
        lambda ledger: seal_call(ledger, 0, gate="wrong"),
        ValueError,
        lambda ledger: (
            "streamed rollout identity mismatch: result='wrong', "
            f"expected={gate_id(ledger, 'g', 0)!r}"
        ),
    ),
    (
        "seal-from-reserved",
        fresh,
        lambda ledger: seal_call(ledger, 0),
        ValueError,
        "cannot seal logical rollout 'g_g0' from status 'reserved'",
    ),
    (
        "seal-from-reserved-unadmitted",
        lambda: fresh(admitted=False),
        lambda ledger: seal_call(ledger, 1),
        ValueError,
        "cannot seal logical rollout 'g_g1' from status 'reserved'",
    ),
    (
        "seal-from-abandoned",
        abandoned,
        lambda ledger: seal_call(ledger, 1),
        ValueError,
        "cannot seal logical rollout 'g_g1' from status 'abandoned'",
    ),
    (
        "seal-conflicting-duplicate",
        half_sealed,
        lambda ledger: seal_call(ledger, 0, reward=5.0),
        ValueError,
        "conflicting duplicate seal for 'g_g0'",
    ),
    # mark_group_sealed
    (
        "group-seal-sibling-granularity",
        dispatched,
        lambda ledger: ledger.mark_group_sealed(CUT, "g", seal_results(ledger, "g")),
        ValueError,
        "atomic group sealing requires prompt-group recovery granularity",
    ),
    (
        "group-seal-finalizing",
        lambda: finalizing(PROMPT_GROUP),
        lambda ledger: ledger.mark_group_sealed(CUT, "g", seal_results(ledger, "g")),
        ValueError,
        "cannot seal group 'g' from status 'finalizing'",
    ),
    (
        "group-seal-missing-sibling",
        lambda: dispatched(granularity=PROMPT_GROUP),
        lambda ledger: ledger.mark_group_sealed(CUT, "g", {1: seal_results(ledger, "g")[1]}),
        ValueError,
        "prompt-group seal requires every logical sibling exactly once: "
        "expected=[0, 1], actual=[1]",
    ),
    (
        "group-seal-extra-sibling",
        lambda: dispatched(granularity=PROMPT_GROUP),
        lambda ledger: ledger.mark_group_sealed(
            CUT, "g", {**seal_results(ledger, "g"), 2: seal_results(ledger, "g")[1]}
        ),
        ValueError,
        "prompt-group seal requires every logical sibling exactly once: "
        "expected=[0, 1], actual=[0, 1, 2]",
    ),
    (
        "group-seal-reserved-sibling",
        lambda: dispatched(granularity=PROMPT_GROUP, indices=[0]),
        lambda ledger: ledger.mark_group_sealed(CUT, "g", seal_results(ledger, "g")),
        ValueError,
        "cannot seal logical rollout 'g_g1' from status 'reserved'",
    ),
    (
        "group-seal-abandoned-cohort",
        lambda: abandoned(PROMPT_GROUP),
        lambda ledger: ledger.mark_group_sealed(CUT, "g", seal_results(ledger, "g")),
        ValueError,
        "cannot seal logical rollout 'g_g0' from status 'abandoned'",
    ),
    (
        "group-seal-gate-mismatch-on-last-sibling",
        lambda: dispatched(granularity=PROMPT_GROUP),
        lambda ledger: ledger.mark_group_sealed(
            CUT, "g", _results_with(ledger, 1, gate_rollout_id="wrong", receipt=None)
        ),
        ValueError,
        lambda ledger: (
            "streamed rollout identity mismatch: result='wrong', "
            f"expected={gate_id(ledger, 'g', 1)!r}"
        ),
    ),
    (
        "group-seal-receipt-mismatch-on-last-sibling",
        lambda: dispatched(granularity=PROMPT_GROUP),
        lambda ledger: ledger.mark_group_sealed(
            CUT, "g", _results_with(ledger, 1, receipt={"rollout_id": "r", "manifest": []})
        ),
        ValueError,
        lambda ledger: (
            f"receipt rollout identity mismatch: receipt='r', expected={gate_id(ledger, 'g', 1)!r}"
        ),
    ),
    (
        "group-seal-mask-not-bool-on-last-sibling",
        lambda: dispatched(granularity=PROMPT_GROUP),
        lambda ledger: ledger.mark_group_sealed(CUT, "g", _results_with(ledger, 1, mask_sample=1)),
        TypeError,
        "mask_sample must be a bool",
    ),
    (
        "group-seal-bad-manifest-on-last-sibling",
        lambda: dispatched(granularity=PROMPT_GROUP),
        lambda ledger: ledger.mark_group_sealed(
            CUT,
            "g",
            _results_with(ledger, 1, receipt={"rollout_id": gate_id(ledger, "g", 1)}),
        ),
        ValueError,
        "sealed rollout receipt must contain a manifest list",
    ),
    (
        "group-seal-bad-manifest-entry-on-last-sibling",
        lambda: dispatched(granularity=PROMPT_GROUP),
        lambda ledger: ledger.mark_group_sealed(
            CUT,
            "g",
            _results_with(
                ledger,
                1,
                receipt={
                    "rollout_id": gate_id(ledger, "g", 1),
                    "manifest": [{"staging_key": None}],
                },
            ),
        ),
        ValueError,
        "sealed rollout receipt manifest entries must contain string staging_key values",
    ),
    # abandon_unsealed
    (
        "abandon-finalizing",
        finalizing,
        lambda ledger: ledger.abandon_unsealed(CUT, "g"),
        ValueError,
        "cannot abandon group 'g' from 'finalizing'",
    ),
    (
        "abandon-unknown",
        unknown,
        lambda ledger: ledger.abandon_unsealed(CUT, "g"),
        ValueError,
        "cannot abandon group 'g' from 'finalization_unknown'",
    ),
    (
        "abandon-prompt-group-finalizing",
        lambda: finalizing(PROMPT_GROUP),
        lambda ledger: ledger.abandon_unsealed(CUT, "g"),
        ValueError,
        "cannot abandon group 'g' from 'finalizing'",
    ),
    # finalization
    (
        "start-finalization-generating",
        half_sealed,
        lambda ledger: ledger.mark_finalization_started(CUT, "g"),
        ValueError,
        "cannot start finalization group 'g' from 'generating'",
    ),
    (
        "start-finalization-finalizing",
        finalizing,
        lambda ledger: ledger.mark_finalization_started(CUT, "g"),
        ValueError,
        "cannot start finalization group 'g' from 'finalizing'",
    ),
    (
        "start-finalization-unknown",
        unknown,
        lambda ledger: ledger.mark_finalization_started(CUT, "g"),
        ValueError,
        "cannot start finalization group 'g' from 'finalization_unknown'",
    ),
    (
        "finalization-unknown-from-ready",
        ready,
        lambda ledger: ledger.mark_finalization_unknown(CUT, "g"),
        ValueError,
        "cannot mark finalization unknown group 'g' from 'ready_to_finalize'",
    ),
    (
        "finalization-unknown-from-generating",
        fresh,
        lambda ledger: ledger.mark_finalization_unknown(CUT, "g"),
        ValueError,
        "cannot mark finalization unknown group 'g' from 'generating'",
    ),
    (
        "finalization-unknown-is-terminal",
        unknown,
        lambda ledger: ledger.mark_finalization_unknown(CUT, "g"),
        ValueError,
        "cannot mark finalization unknown group 'g' from 'finalization_unknown'",
    ),
    (
        "group-seal-unknown-is-terminal",
        lambda: unknown(PROMPT_GROUP),
        lambda ledger: ledger.mark_group_sealed(CUT, "g", seal_results(ledger, "g")),
        ValueError,
        "cannot seal group 'g' from status 'finalization_unknown'",
    ),
    # state_dict / load_state_dict
    (
        "state-dict-before-rehydration",
        lambda: _unbound_ledger(),
        lambda ledger: ledger.state_dict(),
        RuntimeError,
        "cannot checkpoint recovery group 'g' before its prompt is rehydrated",
    ),
    (
        "state-dict-finalizing",
        finalizing,
        lambda ledger: ledger.state_dict(),
        RuntimeError,
        "rollout recovery contains checkpoint-unsafe group states: groups=['g']",
    ),
    (
        "state-dict-payload-identity-changed",
        lambda: _ledger_with_mutated_payload(),
        lambda ledger: ledger.state_dict(),
        ValueError,
        "recovery group 'g' resolved sample_id=8; expected '7'",
    ),
    (
        "load-into-non-empty-ledger",
        fresh,
        lambda ledger: ledger.load_state_dict(CUT, {"schema_version": 3, "groups": []}),
        RuntimeError,
        "cannot restore into a non-empty rollout recovery ledger",
    ),
    (
        "load-into-non-empty-ledger-even-with-valid-state",
        fresh,
        lambda ledger: ledger.load_state_dict(CUT, fresh(idx=9, group_id="h").state_dict()),
        RuntimeError,
        "cannot restore into a non-empty rollout recovery ledger",
    ),
]


def _unbound_ledger() -> RolloutRecoveryLedger:
    state = half_sealed().state_dict()
    return RolloutRecoveryLedger.from_state_dict(state)


def _ledger_with_mutated_payload() -> RolloutRecoveryLedger:
    prompt = payload(7)
    ledger = RolloutRecoveryLedger()
    reserve(ledger, prompt_payload=prompt)
    prompt["idx"] = 8  # the ledger holds the payload by reference
    return ledger


@pytest.mark.parametrize(
    ("build", "call", "error", "message"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
def test_refused_call_raises_the_seed_error_and_changes_no_state(
    build: Callable[[], RolloutRecoveryLedger],
    call: Callable[[RolloutRecoveryLedger], Any],
    error: type[BaseException],
    message: Any,
) -> None:
    ledger = build()
    text = message(ledger) if callable(message) else message
    before = snapshot(ledger)
    with pytest.raises(error, match=starts_with(text)):
        call(ledger)
    assert snapshot(ledger) == before


def _dead_cut_calls() -> list[
    tuple[str, Callable[[], RolloutRecoveryLedger], Callable[[Any], Any]]
]:
    """Calls that would succeed with a live cut, so the dead cut is the only fault."""
    return [
        ("reserve_group", fresh, lambda ledger: _reserve_kw(ledger, cut=DEAD)),
        (
            "mark_group_admitted",
            lambda: fresh(admitted=False),
            lambda ledger: ledger.mark_group_admitted(
                DEAD, "g", target_step=1, start_weight_version=1
            ),
        ),
        (
            "bind_runtime_prompt",
            fresh,
            lambda ledger: ledger.bind_runtime_prompt(DEAD, "g", payload(7)),
        ),
        ("prepare_for_restart", dispatched, lambda ledger: ledger.prepare_for_restart(DEAD)),
        (
            "prepare_incomplete_retry",
            abandoned,
            lambda ledger: ledger.prepare_incomplete_retry(DEAD, "g"),
        ),
        ("mark_group_dispatched", fresh, lambda ledger: ledger.mark_group_dispatched(DEAD, "g")),
        ("mark_sibling_sealed", dispatched, lambda ledger: seal_call(ledger, 0, cut=DEAD)),
        (
            "mark_group_sealed",
            lambda: dispatched(granularity=PROMPT_GROUP),
            lambda ledger: ledger.mark_group_sealed(DEAD, "g", seal_results(ledger, "g")),
        ),
        ("abandon_unsealed", dispatched, lambda ledger: ledger.abandon_unsealed(DEAD, "g")),
        (
            "mark_finalization_started",
            ready,
            lambda ledger: ledger.mark_finalization_started(DEAD, "g"),
        ),
        (
            "mark_finalization_unknown",
            finalizing,
            lambda ledger: ledger.mark_finalization_unknown(DEAD, "g"),
        ),
        ("discard_group", ready, lambda ledger: ledger.discard_group(DEAD, "g")),
        (
            "discard_canonical_groups",
            ready,
            lambda ledger: ledger.discard_canonical_groups(DEAD, {"g"}),
        ),
        (
            "load_state_dict",
            RolloutRecoveryLedger,
            lambda ledger: ledger.load_state_dict(DEAD, ready().state_dict()),
        ),
    ]


@pytest.mark.parametrize(
    ("build", "call"), [c[1:] for c in _dead_cut_calls()], ids=[c[0] for c in _dead_cut_calls()]
)
def test_ledger_rejects_an_expired_mutation_cut(
    build: Callable[[], RolloutRecoveryLedger], call: Callable[[Any], Any]
) -> None:
    ledger = build()
    before = snapshot(ledger)
    with pytest.raises(RuntimeError, match=starts_with(DEAD_CUT_MESSAGE)):
        call(ledger)
    assert snapshot(ledger) == before


def test_cut_is_checked_before_any_other_validation() -> None:
    ledger = RolloutRecoveryLedger()
    with pytest.raises(RuntimeError, match=starts_with(DEAD_CUT_MESSAGE)):
        ledger.mark_group_dispatched(DEAD, "unknown-group")
    with pytest.raises(RuntimeError, match=starts_with(DEAD_CUT_MESSAGE)):
        _reserve_kw(ledger, cut=DEAD, prompt_id="")
    with pytest.raises(RuntimeError, match=starts_with(DEAD_CUT_MESSAGE)):
        ledger.load_state_dict(DEAD, "not a state")  # type: ignore[arg-type]


def test_any_object_with_require_live_is_accepted_as_a_cut() -> None:
    calls: list[str] = []

    class CountingCut:
        def require_live(self) -> None:
            calls.append("live")

    ledger = RolloutRecoveryLedger()
    reserve(ledger, cut=CountingCut())
    ledger.mark_group_dispatched(CountingCut(), "g")
    assert calls == ["live", "live"]


_UNKNOWN_GROUP_CALLS: list[tuple[str, Callable[[RolloutRecoveryLedger], Any]]] = [
    (
        "mark_group_admitted",
        lambda ledger: ledger.mark_group_admitted(
            CUT, "nope", target_step=1, start_weight_version=0
        ),
    ),
    ("bind_runtime_prompt", lambda ledger: ledger.bind_runtime_prompt(CUT, "nope", payload(7))),
    ("prepare_incomplete_retry", lambda ledger: ledger.prepare_incomplete_retry(CUT, "nope")),
    ("mark_group_dispatched", lambda ledger: ledger.mark_group_dispatched(CUT, "nope")),
    ("mark_sibling_sealed", lambda ledger: seal_call(ledger, 0, group_id="nope", receipt=None)),
    ("mark_group_sealed", lambda ledger: ledger.mark_group_sealed(CUT, "nope", {})),
    ("abandon_unsealed", lambda ledger: ledger.abandon_unsealed(CUT, "nope")),
    ("mark_finalization_started", lambda ledger: ledger.mark_finalization_started(CUT, "nope")),
    ("mark_finalization_unknown", lambda ledger: ledger.mark_finalization_unknown(CUT, "nope")),
    ("discard_group", lambda ledger: ledger.discard_group(CUT, "nope")),
    ("get_group", lambda ledger: ledger.get_group("nope")),
]


@pytest.mark.parametrize(
    "call", [c[1] for c in _UNKNOWN_GROUP_CALLS], ids=[c[0] for c in _UNKNOWN_GROUP_CALLS]
)
def test_unknown_group_is_rejected(call: Callable[[RolloutRecoveryLedger], Any]) -> None:
    ledger = half_sealed()
    before = snapshot(ledger)
    with pytest.raises(ValueError, match=starts_with("unknown recovery group_id='nope'")):
        call(ledger)
    assert snapshot(ledger) == before


# --------------------------------------------------------------------------------------------
# identity validation on bind


def test_bind_runtime_prompt_accepts_changed_content_with_the_same_identity() -> None:
    ledger = fresh(task_name="math")
    replacement = payload(7, "math", message_log=["changed"], extra_env_info={"x": 1})
    ledger.bind_runtime_prompt(CUT, "g", replacement)
    assert ledger.get_group("g").runtime_prompt_payload is replacement


def test_bind_runtime_prompt_rejects_the_wrong_dataset_sample() -> None:
    ledger = fresh()
    with pytest.raises(ValueError, match="expected '7'"):
        ledger.bind_runtime_prompt(CUT, "g", payload(8))


def test_bind_runtime_prompt_has_no_status_check() -> None:
    for build in (ready, finalizing, unknown):
        ledger = build()
        replacement = payload(7)
        ledger.bind_runtime_prompt(CUT, "g", replacement)
        assert ledger.get_group("g").runtime_prompt_payload is replacement


# --------------------------------------------------------------------------------------------
# copy semantics: returned records cannot change ledger state


def _mutate_record(record: PromptGroupRecoveryRecord) -> None:
    sibling = record.siblings[0]
    attempt = sibling.current_attempt
    if attempt.receipt is not None:
        attempt.receipt["rollout_id"] = "mutated"
        attempt.receipt["manifest"].append({"staging_key": "mutated"})
    attempt.staging_keys.append("mutated")
    attempt.status = A.FAILED
    attempt.reward = 99.0
    attempt.attempt_uuid = uuid.uuid4()
    sibling.attempts.append(RolloutAttemptRecord(attempt_uuid=uuid.uuid4(), status=A.RESERVED))
    record.siblings.append(RolloutSiblingRecord(generation_index=9, attempts=[]))
    record.siblings[1].attempts.clear()
    record.status = S.FINALIZATION_UNKNOWN
    record.phase = PromptGroupPhase.RESERVED
    record.target_step = -1


@pytest.mark.parametrize(
    "getter",
    [
        lambda ledger: ledger.get_group("g"),
        lambda ledger: ledger.groups()[0],
    ],
    ids=["get_group", "groups"],
)
def test_returned_records_are_copies(getter: Callable[[RolloutRecoveryLedger], Any]) -> None:
    ledger = half_sealed()
    before = snapshot(ledger)
    _mutate_record(getter(ledger))
    assert snapshot(ledger) == before


def test_reserve_and_retry_return_copies() -> None:
    ledger = RolloutRecoveryLedger()
    _mutate_record(reserve(ledger))
    assert current_statuses(ledger, "g") == ["reserved", "reserved"]
    ledger.mark_group_dispatched(CUT, "g")
    seal(ledger, "g", 0)
    ledger.abandon_unsealed(CUT, "g")
    retried = ledger.prepare_incomplete_retry(CUT, "g")
    before = snapshot(ledger)
    _mutate_record(retried)
    assert snapshot(ledger) == before


def test_sealed_receipt_is_copied_from_the_caller() -> None:
    ledger = dispatched()
    gate = gate_id(ledger, "g", 0)
    receipt = make_receipt(gate, 2)
    seal_call(ledger, 0, receipt=receipt)
    before = snapshot(ledger)
    receipt["manifest"].append({"staging_key": "late"})
    receipt["extra"] = True
    assert snapshot(ledger) == before
    # the stored receipt still equals the original one, so the identical re-seal is a no-op
    seal_call(ledger, 0, receipt=make_receipt(gate, 2))
    assert snapshot(ledger) == before


def test_group_seal_receipts_are_copied_from_the_results() -> None:
    ledger = dispatched(granularity=PROMPT_GROUP)
    results = seal_results(ledger, "g", n_keys=2)
    ledger.mark_group_sealed(CUT, "g", results)
    before = snapshot(ledger)
    for result in results.values():
        assert result.receipt is not None
        result.receipt["manifest"].clear()
        result.receipt["rollout_id"] = "changed"
    assert snapshot(ledger) == before


def test_state_dict_is_a_copy() -> None:
    ledger = half_sealed()
    state = ledger.state_dict()
    reference = copy.deepcopy(state)
    group = state["groups"][0]
    group["status"] = "finalizing"
    group["prompt_ref"]["sample_id"] = "8"
    attempt = group["siblings"][0]["attempts"][0]
    attempt["receipt"]["manifest"].append({"staging_key": "x"})
    attempt["receipt"]["rollout_id"] = "x"
    attempt["staging_keys"].append("x")
    group["siblings"][1]["attempts"].append({})
    state["groups"].append({})
    assert ledger.state_dict() == reference


def test_records_compare_equal_across_copies() -> None:
    ledger = half_sealed()
    assert ledger.get_group("g") == ledger.get_group("g")
    assert ledger.groups() == [ledger.get_group("g")]


# --------------------------------------------------------------------------------------------
# the runtime prompt payload is kept by reference, never deep-copied, never serialized


class ExplodingPayload(dict):  # type: ignore[type-arg]
    """A dataloader sample that refuses to be copied or pickled."""

    def __deepcopy__(self, memo: Any) -> Any:
        raise AssertionError("the runtime prompt payload must never be deep-copied")

    def __copy__(self) -> Any:
        raise AssertionError("the runtime prompt payload must never be copied")

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise AssertionError("the runtime prompt payload must never be serialized")


def test_state_dict_excludes_runtime_prompt_payload() -> None:
    prompt = ExplodingPayload(idx=7, task_name=None, message_log=["very long prompt"])
    ledger = RolloutRecoveryLedger()
    returned = reserve(ledger, prompt_payload=prompt)
    assert returned.runtime_prompt_payload is prompt
    assert ledger.get_group("g").runtime_prompt_payload is prompt
    assert ledger.get_group("g").prompt_payload is prompt
    assert ledger.groups()[0].runtime_prompt_payload is prompt
    ledger.mark_group_dispatched(CUT, "g")
    seal(ledger, "g", 0)
    ledger.abandon_unsealed(CUT, "g")
    assert ledger.prepare_incomplete_retry(CUT, "g").runtime_prompt_payload is prompt
    state = ledger.state_dict()
    pickle.dumps(state)  # nothing in the state refers to the payload
    assert_primitive_tree(state)
    group = state["groups"][0]
    assert "runtime_prompt_payload" not in group and "prompt_payload" not in group
    assert group["prompt_ref"] == {"sample_id": "7", "task_name": None}
    assert "very long prompt" not in repr(state)
    ledger.prepare_for_restart(CUT)
    assert ledger.get_group("g").runtime_prompt_payload is prompt


def test_bound_payload_is_kept_by_reference() -> None:
    restored = _unbound_ledger()
    prompt = ExplodingPayload(idx=7, task_name=None)
    restored.bind_runtime_prompt(CUT, "g", prompt)
    assert restored.get_group("g").runtime_prompt_payload is prompt
    assert restored.groups()[0].runtime_prompt_payload is prompt
    restored.state_dict()


def test_state_dict_stores_a_prompt_ref_without_the_full_payload() -> None:
    ledger = fresh(task_name="math")
    group = ledger.state_dict()["groups"][0]
    assert group["prompt_ref"] == {"sample_id": "7", "task_name": "math"}
    assert set(group) == {
        "group_id",
        "admission_id",
        "prompt_id",
        "prompt_ref",
        "task_source",
        "recovery_granularity",
        "expected_generations",
        "target_step",
        "start_weight_version",
        "status",
        "phase",
        "siblings",
    }


# --------------------------------------------------------------------------------------------
# state_dict format


def test_state_dict_format() -> None:
    ledger = dispatched(n=2, task_name="math", task_source="src", admission_id="batch")
    gate0 = gate_id(ledger, "g", 0)
    seal(ledger, "g", 0, n_keys=2, reward=1, reward_checks=CHECKS, reward_log_context=LOG_CONTEXT)  # type: ignore[arg-type]
    record = ledger.get_group("g")
    state = ledger.state_dict()
    assert_primitive_tree(state)
    assert state == {
        "schema_version": 3,
        "groups": [
            {
                "group_id": "g",
                "admission_id": "batch",
                "prompt_id": "7",
                "prompt_ref": {"sample_id": "7", "task_name": "math"},
                "task_source": "src",
                "recovery_granularity": "sibling",
                "expected_generations": 2,
                "target_step": 7,
                "start_weight_version": 0,
                "status": "generating",
                "phase": "admitted",
                "siblings": [
                    {
                        "generation_index": 0,
                        "attempts": [
                            {
                                "attempt_uuid": record.siblings[
                                    0
                                ].current_attempt.attempt_uuid.bytes,
                                "status": "sealed",
                                "receipt": make_receipt(gate0, 2),
                                "reward": 1.0,
                                "mask_sample": False,
                                "reward_checks": {
                                    "duplicated_reasoning": True,
                                    "empty_final_answer": True,
                                    "low_effort": True,
                                },
                                "reward_log_context": {
                                    "agent_name": "agent",
                                    "full_result_json": '{"ok": true}',
                                },
                                "staging_keys": receipt_keys(gate0, 2),
                            }
                        ],
                    },
                    {
                        "generation_index": 1,
                        "attempts": [
                            {
                                "attempt_uuid": record.siblings[
                                    1
                                ].current_attempt.attempt_uuid.bytes,
                                "status": "dispatched",
                                "receipt": None,
                                "reward": None,
                                "mask_sample": None,
                                "reward_checks": None,
                                "reward_log_context": None,
                                "staging_keys": [],
                            }
                        ],
                    },
                ],
            }
        ],
    }
    assert type(state["groups"][0]["siblings"][0]["attempts"][0]["reward"]) is float


def test_state_dict_attempt_uuids_are_16_raw_bytes_including_history() -> None:
    ledger = abandoned()
    ledger.prepare_incomplete_retry(CUT, "g")
    state = ledger.state_dict()
    record = ledger.get_group("g")
    for sibling_state, sibling in zip(state["groups"][0]["siblings"], record.siblings, strict=True):
        raw = [a["attempt_uuid"] for a in sibling_state["attempts"]]
        assert all(type(b) is bytes and len(b) == 16 for b in raw)
        assert raw == [a.attempt_uuid.bytes for a in sibling.attempts]
        assert [a["status"] for a in sibling_state["attempts"]] == ["abandoned", "reserved"]


def test_state_dict_preserves_insertion_order() -> None:
    ledger = RolloutRecoveryLedger()
    order = ["m", "b", "z", "a"]
    for idx, gid in enumerate(order):
        reserve(ledger, idx, group_id=gid)
    assert [g["group_id"] for g in ledger.state_dict()["groups"]] == order
    restored = RolloutRecoveryLedger.from_state_dict(ledger.state_dict())
    assert [g.group_id for g in restored.groups()] == order


def test_state_dict_serializes_enums_as_plain_strings() -> None:
    group = fresh(granularity=PROMPT_GROUP, admitted=False).state_dict()["groups"][0]
    for key in ("recovery_granularity", "status", "phase"):
        assert type(group[key]) is str
    assert group["recovery_granularity"] == "prompt_group"
    assert group["phase"] == "reserved"
    assert type(group["siblings"][0]["attempts"][0]["status"]) is str


def test_expected_staging_keys_tracks_only_sealed_current_attempts() -> None:
    ledger = dispatched(n=3)
    assert ledger.expected_staging_keys() == set()
    seal(ledger, "g", 0, n_keys=2)
    seal(ledger, "g", 1, missing_receipt=True)
    reserve(ledger, 8, group_id="h", granularity=PROMPT_GROUP)
    ledger.mark_group_dispatched(CUT, "h")
    ledger.mark_group_sealed(CUT, "h", seal_results(ledger, "h", n_keys=1))
    g = ledger.get_group("g")
    h = ledger.get_group("h")
    expected = set(receipt_keys(g.gate_rollout_id(0), 2))
    expected |= {k for i in range(2) for k in receipt_keys(h.gate_rollout_id(i), 1)}
    assert ledger.expected_staging_keys() == expected
    ledger.mark_finalization_started(CUT, "h")
    assert ledger.expected_staging_keys() == expected, "finalizing groups still own their rows"
    ledger.discard_group(CUT, "h")
    assert ledger.expected_staging_keys() == set(receipt_keys(g.gate_rollout_id(0), 2))
    result = ledger.expected_staging_keys()
    result.add("caller-owned")
    assert "caller-owned" not in ledger.expected_staging_keys()
