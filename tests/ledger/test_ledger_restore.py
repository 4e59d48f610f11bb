"""Restoring the ledger from a schema-3 state: round trips, restarts and every load invariant.

Reference §4.1 numbers the invariants; each ``test_load_rejects_*`` case names its rule. A
rejected state never produces a ledger, and ``load_state_dict`` leaves the target empty.
"""

from __future__ import annotations

import copy
import dataclasses
import random
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
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    PromptGroupPhase,
    PromptGroupRecoveryRecord,
    PromptGroupStatus,
    PromptRef,
    RecoveryGranularity,
    RolloutAttemptRecord,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    RolloutSiblingRecord,
)

SIBLING = RecoveryGranularity.SIBLING
PROMPT_GROUP = RecoveryGranularity.PROMPT_GROUP
A = RolloutAttemptStatus
S = PromptGroupStatus

V2_MIRROR_FIELDS = {
    "canonical_meta",
    "group_min_weight_version",
    "group_max_weight_version",
    "claimed_train_step",
    "open_train_step",
}


def restore(state: Any) -> RolloutRecoveryLedger:
    ledger = RolloutRecoveryLedger()
    ledger.load_state_dict(CUT, state)
    return ledger


def rebind_all(
    ledger: RolloutRecoveryLedger, dataset: Callable[[PromptRef], Any] | None = None
) -> None:
    for record in ledger.groups():
        ref = record.prompt_ref
        prompt = dataset(ref) if dataset else payload(int(ref.sample_id), ref.task_name)
        ledger.bind_runtime_prompt(CUT, record.group_id, prompt)


def round_trip(ledger: RolloutRecoveryLedger) -> RolloutRecoveryLedger:
    restored = restore(ledger.state_dict())
    rebind_all(restored)
    return restored


def base_ledger() -> RolloutRecoveryLedger:
    """Group "g" (N=2, SIBLING): sibling 0 sealed with 2 staging keys, sibling 1 dispatched."""
    ledger = RolloutRecoveryLedger()
    reserve(ledger, task_name="math", task_source="src")
    ledger.mark_group_dispatched(CUT, "g")
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
    return ledger


def base_state() -> dict[str, Any]:
    return base_ledger().state_dict()


def ready_state() -> dict[str, Any]:
    ledger = base_ledger()
    seal(ledger, "g", 1)
    return ledger.state_dict()


def group(state: dict[str, Any], index: int = 0) -> dict[str, Any]:
    return state["groups"][index]


def attempt(state: dict[str, Any], sibling: int = 0, position: int = -1) -> dict[str, Any]:
    return state["groups"][0]["siblings"][sibling]["attempts"][position]


# --------------------------------------------------------------------------------------------
# round trips (§6.1)


def test_ledger_round_trip_preserves_group_ownership() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, idx=7, n=2, target_step=7, group_id="g7", admitted=False)
    state = ledger.state_dict()
    assert not V2_MIRROR_FIELDS & set(state)
    assert not V2_MIRROR_FIELDS & set(group(state))

    restored = restore(state)
    record = restored.get_group("g7")
    assert record.runtime_prompt_payload is None
    with pytest.raises(RuntimeError, match=starts_with("recovery group 'g7' has not rehydrated")):
        _ = record.prompt_payload
    with pytest.raises(
        RuntimeError,
        match=starts_with("cannot checkpoint recovery group 'g7' before its prompt is rehydrated"),
    ):
        restored.state_dict()

    prompt = payload(7)
    restored.bind_runtime_prompt(CUT, "g7", prompt)
    assert restored.get_group("g7").prompt_payload is prompt
    assert restored.state_dict() == state
    assert restored.get_group("g7").phase is PromptGroupPhase.RESERVED
    assert restored.get_group("g7").target_step == 7


def test_from_state_dict_and_load_state_dict_agree() -> None:
    state = base_state()
    a = RolloutRecoveryLedger.from_state_dict(state)
    b = restore(state)
    assert isinstance(a, RolloutRecoveryLedger)
    assert a.groups() == b.groups()
    assert len(a) == len(b) == 1 and "g" in a


def test_restored_records_equal_the_originals_except_for_the_payload() -> None:
    ledger = base_ledger()
    restored = restore(ledger.state_dict())
    original = ledger.get_group("g")
    assert restored.get_group("g") == dataclasses.replace(original, runtime_prompt_payload=None)


def _rich_ledger() -> RolloutRecoveryLedger:
    """Groups in every checkpoint-safe status, both granularities, with attempt history."""
    ledger = RolloutRecoveryLedger()
    reserve(ledger, 1, group_id="fresh", admitted=False, target_step=None, admission_id="batch")
    reserve(ledger, 2, group_id="reserved2", admitted=False, target_step=None, admission_id="batch")
    reserve(ledger, 3, group_id="mixed", n=3, task_name="t", task_source="ts")
    ledger.mark_group_dispatched(CUT, "mixed")
    seal(ledger, "mixed", 0, n_keys=2, reward_checks=CHECKS, reward_log_context=LOG_CONTEXT)
    seal(ledger, "mixed", 2, missing_receipt=True, mask_sample=True)
    ledger.abandon_unsealed(CUT, "mixed")
    ledger.prepare_incomplete_retry(CUT, "mixed")
    ledger.mark_group_dispatched(CUT, "mixed", generation_indices=[1])
    reserve(ledger, 4, group_id="pg", granularity=PROMPT_GROUP, n=3)
    ledger.mark_group_dispatched(CUT, "pg")
    ledger.abandon_unsealed(CUT, "pg")
    ledger.prepare_incomplete_retry(CUT, "pg")
    ledger.mark_group_dispatched(CUT, "pg")
    ledger.mark_group_sealed(
        CUT, "pg", seal_results(ledger, "pg", n_keys=2, missing=frozenset({1}))
    )
    reserve(ledger, 5, group_id="ready", n=1, start_weight_version=3)
    ledger.mark_group_dispatched(CUT, "ready")
    seal(ledger, "ready", 0, reward=0.25)
    return ledger


def test_rich_ledger_round_trips_identically() -> None:
    ledger = _rich_ledger()
    state = ledger.state_dict()
    assert_primitive_tree(state)
    restored = round_trip(ledger)
    assert restored.state_dict() == state
    assert restored.expected_staging_keys() == ledger.expected_staging_keys()
    assert [g.group_id for g in restored.groups()] == [g.group_id for g in ledger.groups()]
    for original, copy_ in zip(ledger.groups(), restored.groups(), strict=True):
        assert copy_.siblings == original.siblings
        assert copy_.status is original.status and copy_.phase is original.phase
    # and again, from the restored ledger's own state
    assert round_trip(restored).state_dict() == state


def test_restored_ledger_keeps_working() -> None:
    restored = round_trip(base_ledger())
    seal(restored, "g", 1)
    assert restored.get_group("g").status is S.READY_TO_FINALIZE
    restored.mark_finalization_started(CUT, "g")
    restored.discard_group(CUT, "g")
    assert len(restored) == 0


def test_load_does_not_alias_the_input_state() -> None:
    state = base_state()
    ledger = restore(state)
    before = snapshot(ledger)
    a = attempt(state)
    a["receipt"]["manifest"].append({"staging_key": "late"})
    a["receipt"]["rollout_id"] = "changed"
    a["staging_keys"].append("late")
    a["status"] = "abandoned"
    group(state)["status"] = "finalizing"
    group(state)["siblings"][1]["attempts"].append({})
    group(state)["prompt_ref"]["task_name"] = "changed"
    state["groups"].append({})
    assert snapshot(ledger) == before


def test_loaded_integer_reward_becomes_float() -> None:
    state = base_state()
    attempt(state)["reward"] = 3
    ledger = restore(state)
    reward = ledger.get_group("g").siblings[0].current_attempt.reward
    assert reward == 3.0 and type(reward) is float
    rebind_all(ledger)
    assert type(attempt(ledger.state_dict())["reward"]) is float


def test_loaded_records_have_typed_fields() -> None:
    record = restore(base_state()).get_group("g")
    assert isinstance(record, PromptGroupRecoveryRecord)
    assert record.recovery_granularity is SIBLING
    assert record.phase is PromptGroupPhase.ADMITTED
    assert record.status is S.GENERATING
    assert record.prompt_ref == PromptRef(sample_id="7", task_name="math")
    sealed = record.siblings[0].current_attempt
    assert isinstance(sealed.attempt_uuid, uuid.UUID)
    assert sealed.status is A.SEALED
    assert sealed.reward_checks == CHECKS
    assert sealed.reward_log_context == LOG_CONTEXT
    assert sealed.staging_keys == receipt_keys(record.gate_rollout_id(0), 2)


def test_serialized_state_fields_match_recovery_dataclasses() -> None:
    def names(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    ledger = _rich_ledger()
    state = ledger.state_dict()
    assert set(state) == {"schema_version", "groups"}
    for group_state in state["groups"]:
        assert set(group_state) == names(PromptGroupRecoveryRecord) - {"runtime_prompt_payload"}
        assert set(group_state["prompt_ref"]) == names(PromptRef)
        for sibling_state in group_state["siblings"]:
            assert set(sibling_state) == names(RolloutSiblingRecord)
            for attempt_state in sibling_state["attempts"]:
                assert set(attempt_state) == names(RolloutAttemptRecord)


def test_absent_optional_fields_read_as_none_like_the_seed() -> None:
    # The seed decodes with ``dict.get``: an absent optional key reads as None.
    state = base_state()
    del group(state)["task_source"]
    del group(state)["target_step"]
    del group(state)["prompt_ref"]["task_name"]
    unsealed = attempt(state, sibling=1)
    for key in ("receipt", "reward", "mask_sample", "reward_checks", "reward_log_context"):
        del unsealed[key]
    sealed = attempt(state, sibling=0)
    del sealed["reward_checks"]
    del sealed["reward_log_context"]
    record = RolloutRecoveryLedger.from_state_dict(state).get_group("g")
    assert record.task_source is None and record.target_step is None
    assert record.prompt_ref.task_name is None
    assert record.siblings[0].current_attempt.reward_checks is None
    assert record.siblings[1].current_attempt.receipt is None


def test_prompt_ref_rehydrates_through_a_restored_shuffled_dataloader() -> None:
    dataset = [payload(i, "task", message_log=[f"prompt {i}"]) for i in range(12)]
    order = list(range(12))
    random.Random(123).shuffle(order)
    taken = dataset[order[4]]
    ledger = RolloutRecoveryLedger()
    reserve(ledger, taken["idx"], task_name="task", group_id="g", prompt_payload=taken)
    restored = restore(ledger.state_dict())
    ref = restored.get_group("g").prompt_ref
    rehydrated = dataset[int(ref.sample_id)]
    assert rehydrated == taken
    restored.bind_runtime_prompt(CUT, "g", rehydrated)
    assert restored.get_group("g").prompt_payload is rehydrated
    assert restored.state_dict() == ledger.state_dict()


# --------------------------------------------------------------------------------------------
# restart scenarios (§6.1)


def test_restart_preserves_sealed_sibling_and_retries_only_interrupted_one() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, n=2)
    ledger.mark_group_dispatched(CUT, "g")
    seal(ledger, "g", 0, n_keys=2)
    sealed_id = ledger.get_group("g").siblings[0].current_attempt.attempt_id
    sealed_keys = set(receipt_keys(gate_id(ledger, "g", 0), 2))

    restored = restore(ledger.state_dict())
    restored.prepare_for_restart(CUT)
    assert current_statuses(restored, "g") == ["sealed", "abandoned"]
    assert restored.expected_staging_keys() == sealed_keys
    rebind_all(restored)
    retried = restored.prepare_incomplete_retry(CUT, "g")
    assert retried.siblings[0].current_attempt.attempt_id == sealed_id
    assert len(retried.siblings[0].attempts) == 1
    assert retried.siblings[1].current_attempt.status is A.RESERVED
    assert len(retried.siblings[1].attempts) == 2
    assert restored.expected_staging_keys() == sealed_keys


@pytest.mark.parametrize("granularity", [SIBLING, PROMPT_GROUP])
def test_missing_receipt_is_a_restart_safe_sealed_placeholder(
    granularity: RecoveryGranularity,
) -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, n=2, granularity=granularity)
    ledger.mark_group_dispatched(CUT, "g")
    if granularity is SIBLING:
        seal(ledger, "g", 0, missing_receipt=True, reward=0.0, mask_sample=True)
        seal(ledger, "g", 1, n_keys=1, reward=1.5, mask_sample=False)
    else:
        results = seal_results(ledger, "g", n_keys=1, missing=frozenset({0}))
        results[0] = dataclasses.replace(results[0], reward=0.0, mask_sample=True)
        results[1] = dataclasses.replace(results[1], reward=1.5, mask_sample=False)
        ledger.mark_group_sealed(CUT, "g", results)
    state = ledger.state_dict()
    assert attempt(state, 0)["receipt"] is None and attempt(state, 0)["staging_keys"] == []

    restored = restore(state)
    restored.prepare_for_restart(CUT)
    record = restored.get_group("g")
    assert record.status is S.READY_TO_FINALIZE
    first, second = (s.current_attempt for s in record.siblings)
    assert (first.receipt, first.reward, first.mask_sample) == (None, 0.0, True)
    assert second.receipt == make_receipt(record.gate_rollout_id(1), 1)
    assert (second.reward, second.mask_sample) == (1.5, False)
    assert restored.expected_staging_keys() == set(receipt_keys(record.gate_rollout_id(1), 1))

    future = copy.deepcopy(state)
    future["schema_version"] = ROLLOUT_RECOVERY_SCHEMA_VERSION + 1
    with pytest.raises(
        ValueError, match=starts_with("Unsupported rollout-recovery schema version: 4")
    ):
        RolloutRecoveryLedger.from_state_dict(future)


def test_prompt_group_restart_retries_every_sibling_when_one_is_unfinished() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, n=2, granularity=PROMPT_GROUP, task_source="genrm_compare")
    ledger.mark_group_dispatched(CUT, "g")
    restored = restore(ledger.state_dict())
    restored.prepare_for_restart(CUT)
    assert current_statuses(restored, "g") == ["abandoned", "abandoned"]
    assert restored.expected_staging_keys() == set()
    retried = restored.prepare_incomplete_retry(CUT, "g")
    assert [s.current_attempt.status for s in retried.siblings] == [A.RESERVED, A.RESERVED]
    assert [len(s.attempts) for s in retried.siblings] == [2, 2]
    assert retried.task_source == "genrm_compare"


def test_prompt_group_restart_keeps_a_fully_sealed_group() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, n=2, granularity=PROMPT_GROUP)
    ledger.mark_group_dispatched(CUT, "g")
    ledger.mark_group_sealed(CUT, "g", seal_results(ledger, "g", n_keys=2))
    keys = ledger.expected_staging_keys()
    assert len(keys) == 4
    restored = restore(ledger.state_dict())
    restored.prepare_for_restart(CUT)
    assert restored.get_group("g").status is S.READY_TO_FINALIZE
    assert current_statuses(restored, "g") == ["sealed", "sealed"]
    assert restored.expected_staging_keys() == keys


def test_prompt_group_restart_clears_a_partially_sealed_loaded_cohort() -> None:
    # Not reachable live (the cohort seals atomically) but loadable: the restart drops the seal.
    state = base_state()
    group(state)["recovery_granularity"] = "prompt_group"
    restored = restore(state)
    assert restored.expected_staging_keys()
    restored.prepare_for_restart(CUT)
    cleared = restored.get_group("g").siblings[0].current_attempt
    assert cleared.status is A.ABANDONED
    assert (cleared.receipt, cleared.reward, cleared.mask_sample) == (None, None, None)
    assert (cleared.reward_checks, cleared.reward_log_context) == (None, None)
    assert cleared.staging_keys == []
    assert restored.get_group("g").status is S.GENERATING
    assert restored.expected_staging_keys() == set()
    rebind_all(restored)
    assert attempt(restored.state_dict(), 0)["receipt"] is None


@pytest.mark.parametrize("granularity", [SIBLING, PROMPT_GROUP])
def test_reward_checks_seals_and_survives_checkpoint(granularity: RecoveryGranularity) -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, n=2, granularity=granularity)
    ledger.mark_group_dispatched(CUT, "g")
    if granularity is SIBLING:
        for index in range(2):
            seal(ledger, "g", index, reward=-2.0, reward_checks=CHECKS)
    else:
        results = {
            i: dataclasses.replace(r, reward=-2.0, reward_checks=CHECKS)
            for i, r in seal_results(ledger, "g").items()
        }
        ledger.mark_group_sealed(CUT, "g", results)
    state = ledger.state_dict()
    assert attempt(state, 1)["reward_checks"] == msgspec.structs.asdict(CHECKS)
    restored = round_trip(ledger)
    assert restored.state_dict() == state
    for sibling in restored.get_group("g").siblings:
        assert sibling.current_attempt.reward_checks == CHECKS
        assert sibling.current_attempt.reward == -2.0
    if granularity is SIBLING:
        before = snapshot(restored)
        seal(restored, "g", 0, reward=-2.0, reward_checks=CHECKS)
        assert snapshot(restored) == before
        for flag in ("duplicated_reasoning", "empty_final_answer", "low_effort"):
            with pytest.raises(
                ValueError, match=starts_with("conflicting duplicate seal for 'g_g0'")
            ):
                seal(
                    restored,
                    "g",
                    0,
                    reward=-2.0,
                    reward_checks=msgspec.structs.replace(CHECKS, **{flag: False}),
                )
            assert snapshot(restored) == before
    bad = copy.deepcopy(state)
    attempt(bad, 1)["reward_checks"]["low_effort"] = 1
    with pytest.raises(ValueError, match=starts_with("reward checks must be booleans")):
        RolloutRecoveryLedger.from_state_dict(bad)


def test_failed_attempts_load_and_are_retryable() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, n=2)
    ledger.mark_group_dispatched(CUT, "g")
    state = ledger.state_dict()
    attempt(state, 0)["status"] = "failed"
    restored = restore(state)
    assert current_statuses(restored, "g") == ["failed", "dispatched"]
    restored.abandon_unsealed(CUT, "g")
    assert current_statuses(restored, "g") == ["abandoned", "abandoned"]

    restored = restore(state)
    restored.prepare_for_restart(CUT)
    assert current_statuses(restored, "g") == ["abandoned", "abandoned"]

    attempt(state, 1)["status"] = "reserved"
    restored = restore(state)
    retried = restored.prepare_incomplete_retry(CUT, "g")
    assert [len(s.attempts) for s in retried.siblings] == [2, 1]
    assert current_statuses(restored, "g") == ["reserved", "reserved"]
    assert retried.siblings[0].attempts[0].status is A.FAILED


def test_prompt_group_retry_accepts_a_failed_and_abandoned_cohort() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, n=2, granularity=PROMPT_GROUP)
    ledger.mark_group_dispatched(CUT, "g")
    ledger.abandon_unsealed(CUT, "g")
    state = ledger.state_dict()
    attempt(state, 1)["status"] = "failed"
    restored = restore(state)
    retried = restored.prepare_incomplete_retry(CUT, "g")
    assert [len(s.attempts) for s in retried.siblings] == [2, 2]


@pytest.mark.parametrize(
    ("statuses", "message"),
    [
        (
            ("abandoned", "reserved"),
            "prompt-group retry requires every sibling attempt to be abandoned or failed together",
        ),
        (
            ("reserved", "failed"),
            "prompt-group retry requires every sibling attempt to be abandoned or failed together",
        ),
        (
            ("failed", "dispatched"),
            "prompt-group retry requires every sibling attempt to be abandoned or failed together",
        ),
    ],
)
def test_prompt_group_retry_refuses_a_mixed_cohort(statuses: tuple[str, str], message: str) -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, n=2, granularity=PROMPT_GROUP)
    state = ledger.state_dict()
    for index, status in enumerate(statuses):
        attempt(state, index)["status"] = status
    restored = restore(state)
    rebind_all(restored)
    before = snapshot(restored)
    with pytest.raises(ValueError, match=starts_with(message)):
        restored.prepare_incomplete_retry(CUT, "g")
    assert snapshot(restored) == before


def test_prompt_group_retry_refuses_a_sealed_sibling() -> None:
    # A loaded PROMPT_GROUP GENERATING group with a sealed and a reserved sibling: no sibling is
    # abandoned/failed, so the per-sibling check refuses the sealed one.
    state = base_state()
    group(state)["recovery_granularity"] = "prompt_group"
    attempt(state, 1)["status"] = "reserved"
    restored = restore(state)
    rebind_all(restored)
    before = snapshot(restored)
    with pytest.raises(
        ValueError, match=starts_with("cannot retry logical rollout 'g_g0' from status 'sealed'")
    ):
        restored.prepare_incomplete_retry(CUT, "g")
    assert snapshot(restored) == before


def test_refused_retry_changes_no_state_even_after_an_earlier_retryable_sibling() -> None:
    # Seed note: NeMo-RL appends to sibling 0 before refusing sibling 1 (not atomic). This
    # project guarantees that a refused call changes no state.
    ledger = RolloutRecoveryLedger()
    reserve(ledger, n=2)
    ledger.mark_group_dispatched(CUT, "g")
    state = ledger.state_dict()
    attempt(state, 0)["status"] = "failed"
    restored = restore(state)
    rebind_all(restored)
    before = snapshot(restored)
    with pytest.raises(
        ValueError,
        match=starts_with("cannot retry logical rollout 'g_g1' from status 'dispatched'"),
    ):
        restored.prepare_incomplete_retry(CUT, "g")
    assert snapshot(restored) == before


# --------------------------------------------------------------------------------------------
# what the loader deliberately does not check (§4.1, last paragraph)


@pytest.mark.parametrize("status", ["finalizing", "finalization_unknown"])
def test_checkpoint_unsafe_groups_load_but_cannot_restart_or_checkpoint(status: str) -> None:
    state = ready_state()
    group(state)["status"] = status
    restored = restore(state)
    assert restored.get_group("g").status.value == status
    rebind_all(restored)
    with pytest.raises(
        RuntimeError,
        match=starts_with("rollout recovery contains checkpoint-unsafe group states: groups=['g']"),
    ):
        restored.prepare_for_restart(CUT)
    with pytest.raises(
        RuntimeError,
        match=starts_with("rollout recovery contains checkpoint-unsafe group states: groups=['g']"),
    ):
        restored.state_dict()


def test_expected_staging_keys_ignore_historical_sealed_attempts() -> None:
    # A historical SEALED attempt is loadable; only the current attempt owns staging rows.
    state = base_state()
    sibling = group(state)["siblings"][0]
    old_gate = gate_id(base_ledger(), "g", 0)  # any gate, replaced below
    historical = sibling["attempts"][0]
    new_uuid = uuid.uuid4()
    current = {
        "attempt_uuid": new_uuid.bytes,
        "status": "reserved",
        "receipt": None,
        "reward": None,
        "mask_sample": None,
        "reward_checks": None,
        "reward_log_context": None,
        "staging_keys": [],
    }
    sibling["attempts"].append(current)
    restored = restore(state)
    assert restored.expected_staging_keys() == set()
    record = restored.get_group("g")
    assert record.siblings[0].attempts[0].status is A.SEALED
    assert record.siblings[0].attempts[0].staging_keys == historical["staging_keys"]
    assert record.gate_rollout_id(0) == f"g_g0_a{new_uuid.hex}"
    assert old_gate != record.gate_rollout_id(0)


def test_load_does_not_check_phase_against_attempts() -> None:
    state = base_state()
    group(state)["phase"] = "reserved"
    restored = restore(state)
    assert restored.get_group("g").phase is PromptGroupPhase.RESERVED


def test_groups_sharing_admission_agree_and_load() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, 1, group_id="a", admission_id="batch", admitted=False, target_step=None)
    reserve(ledger, 2, group_id="b", admission_id="batch", admitted=False, target_step=None)
    restored = restore(ledger.state_dict())
    assert [g.admission_id for g in restored.groups()] == ["batch", "batch"]


def test_empty_ledger_round_trips() -> None:
    ledger = RolloutRecoveryLedger()
    assert ledger.state_dict() == {"schema_version": 3, "groups": []}
    assert len(restore(ledger.state_dict())) == 0


# --------------------------------------------------------------------------------------------
# load invariants (§4.1): type, message start, and no ledger


def _set(
    path: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any
) -> Callable[[dict[str, Any]], Any]:
    def mutate(state: dict[str, Any]) -> None:
        path(state)[key] = value

    return mutate


def _delete(
    path: Callable[[dict[str, Any]], dict[str, Any]], key: str
) -> Callable[[dict[str, Any]], Any]:
    def mutate(state: dict[str, Any]) -> None:
        del path(state)[key]

    return mutate


def _top(state: dict[str, Any]) -> dict[str, Any]:
    return state


def _group0(state: dict[str, Any]) -> dict[str, Any]:
    return group(state)


def _ref0(state: dict[str, Any]) -> dict[str, Any]:
    return group(state)["prompt_ref"]


def _sibling0(state: dict[str, Any]) -> dict[str, Any]:
    return group(state)["siblings"][0]


def _sealed(state: dict[str, Any]) -> dict[str, Any]:
    return attempt(state, 0)


def _unsealed(state: dict[str, Any]) -> dict[str, Any]:
    return attempt(state, 1)


@dataclasses.dataclass(frozen=True)
class Replace:
    """Returned by a mutation that replaces the whole state instead of editing it."""

    value: Any


def _replace_state(value: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda state: Replace(value)


def _swap_siblings(state: dict[str, Any]) -> None:
    siblings = group(state)["siblings"]
    siblings.reverse()


def _copy_uuid_between_siblings(state: dict[str, Any]) -> None:
    attempt(state, 1)["attempt_uuid"] = attempt(state, 0)["attempt_uuid"]


def _copy_uuid_into_history(state: dict[str, Any]) -> None:
    unsealed = attempt(state, 1)
    duplicate = dict(unsealed)
    unsealed["status"] = "abandoned"
    group(state)["siblings"][1]["attempts"].append(duplicate)


def _copy_uuid_across_groups(state: dict[str, Any]) -> None:
    other = copy.deepcopy(group(state))
    other["group_id"] = "h"
    other["admission_id"] = "h"
    state["groups"].append(other)


def _duplicate_group_id(state: dict[str, Any]) -> None:
    other = RolloutRecoveryLedger()
    reserve(other, group_id="g")
    state["groups"].append(other.state_dict()["groups"][0])


def _disagreeing_admission(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(state: dict[str, Any]) -> None:
        other = RolloutRecoveryLedger()
        reserve(other, 8, group_id="h", admission_id="g")
        other_group = other.state_dict()["groups"][0]
        other_group[field] = value
        state["groups"].append(other_group)

    return mutate


def _all_sealed_generating(state: dict[str, Any]) -> None:
    ready = ready_state()
    ready["groups"][0]["status"] = "generating"
    state.clear()
    state.update(ready)


def _seal_receipt_keys_reordered(state: dict[str, Any]) -> None:
    _sealed(state)["staging_keys"].reverse()


def _receipt_identity(state: dict[str, Any]) -> None:
    _sealed(state)["receipt"]["rollout_id"] = "g_g0_a" + "0" * 32


def _receipt_without_manifest(state: dict[str, Any]) -> None:
    del _sealed(state)["receipt"]["manifest"]


def _receipt_bad_manifest_entry(state: dict[str, Any]) -> None:
    _sealed(state)["receipt"]["manifest"][0] = {"staging_key": 1}


def _missing_receipt_with_keys(state: dict[str, Any]) -> None:
    _sealed(state)["receipt"] = None


def _history_with_receipt_data(state: dict[str, Any]) -> None:
    sibling = group(state)["siblings"][1]
    old = sibling["attempts"][0]
    old["status"] = "abandoned"
    old["reward"] = 1.0
    sibling["attempts"].append(
        {**old, "attempt_uuid": uuid.uuid4().bytes, "status": "reserved", "reward": None}
    )


BAD_STATES: list[tuple[str, Callable[[dict[str, Any]], Any], type[BaseException], str]] = [
    # 1
    (
        "r1-list",
        _replace_state([]),
        TypeError,
        "rollout recovery state must be a dictionary, got list",
    ),
    (
        "r1-none",
        _replace_state(None),
        TypeError,
        "rollout recovery state must be a dictionary, got NoneType",
    ),
    (
        "r1-str",
        _replace_state("state"),
        TypeError,
        "rollout recovery state must be a dictionary, got str",
    ),
    # 2
    (
        "r2-unknown-top-level",
        _set(_top, "unexpected", 1),
        ValueError,
        "rollout recovery state contains unknown fields: ['unexpected']",
    ),
    (
        "r2-v2-open-train-step",
        _set(_top, "open_train_step", None),
        ValueError,
        "rollout recovery state contains unknown fields: ['open_train_step']",
    ),
    # 3
    (
        "r3-schema-2",
        _set(_top, "schema_version", 2),
        ValueError,
        "Unsupported rollout-recovery schema version: 2",
    ),
    (
        "r3-schema-4",
        _set(_top, "schema_version", 4),
        ValueError,
        "Unsupported rollout-recovery schema version: 4",
    ),
    (
        "r3-schema-bool",
        _set(_top, "schema_version", True),
        ValueError,
        "Unsupported rollout-recovery schema version: True",
    ),
    (
        "r3-schema-str",
        _set(_top, "schema_version", "3"),
        ValueError,
        "Unsupported rollout-recovery schema version: '3'",
    ),
    (
        "r3-schema-float",
        _set(_top, "schema_version", 3.0),
        ValueError,
        "Unsupported rollout-recovery schema version: 3.0",
    ),
    (
        "r3-schema-missing",
        _delete(_top, "schema_version"),
        ValueError,
        "Unsupported rollout-recovery schema version: None",
    ),
    # 4
    (
        "r4-groups-dict",
        _set(_top, "groups", {}),
        ValueError,
        "rollout-recovery state must contain a groups list",
    ),
    (
        "r4-groups-tuple",
        _set(_top, "groups", ()),
        ValueError,
        "rollout-recovery state must contain a groups list",
    ),
    (
        "r4-groups-missing",
        _delete(_top, "groups"),
        ValueError,
        "rollout-recovery state must contain a groups list",
    ),
    # 5
    (
        "r5-group-not-mapping",
        _set(_top, "groups", [["g"]]),
        ValueError,
        "rollout-recovery group must be a mapping",
    ),
    (
        "r5-group-unknown-field",
        _set(_group0, "unexpected", 1),
        ValueError,
        "rollout-recovery group contains unknown fields: ['unexpected']",
    ),
    (
        "r5-group-v2-field",
        _set(_group0, "canonical_meta", None),
        ValueError,
        "rollout-recovery group contains unknown fields: ['canonical_meta']",
    ),
    # 6
    (
        "r6-group-id-empty",
        _set(_group0, "group_id", ""),
        ValueError,
        "group_id must be a non-empty string",
    ),
    (
        "r6-group-id-int",
        _set(_group0, "group_id", 7),
        ValueError,
        "group_id must be a non-empty string",
    ),
    (
        "r6-group-id-missing",
        _delete(_group0, "group_id"),
        ValueError,
        "group_id must be a non-empty string",
    ),
    (
        "r6-admission-id-empty",
        _set(_group0, "admission_id", ""),
        ValueError,
        "admission_id must be a non-empty string",
    ),
    (
        "r6-admission-id-missing",
        _delete(_group0, "admission_id"),
        ValueError,
        "admission_id must be a non-empty string",
    ),
    (
        "r6-prompt-id-empty",
        _set(_group0, "prompt_id", ""),
        ValueError,
        "prompt_id must be a non-empty string",
    ),
    (
        "r6-prompt-id-int",
        _set(_group0, "prompt_id", 7),
        ValueError,
        "prompt_id must be a non-empty string",
    ),
    # 7
    (
        "r7-task-source-int",
        _set(_group0, "task_source", 1),
        ValueError,
        "task_source must be a string or None",
    ),
    # 8
    (
        "r8-granularity-missing",
        _delete(_group0, "recovery_granularity"),
        ValueError,
        "recovery_granularity must be a string",
    ),
    (
        "r8-granularity-int",
        _set(_group0, "recovery_granularity", 1),
        ValueError,
        "recovery_granularity must be a string",
    ),
    (
        "r8-granularity-unknown",
        _set(_group0, "recovery_granularity", "atomic"),
        ValueError,
        "invalid recovery_granularity='atomic'",
    ),
    (
        "r8-granularity-enum-name",
        _set(_group0, "recovery_granularity", "SIBLING"),
        ValueError,
        "invalid recovery_granularity='SIBLING'",
    ),
    # 9
    (
        "r9-generations-zero",
        _set(_group0, "expected_generations", 0),
        ValueError,
        "expected_generations must be a positive integer",
    ),
    (
        "r9-generations-str",
        _set(_group0, "expected_generations", "2"),
        ValueError,
        "expected_generations must be a positive integer",
    ),
    (
        "r9-generations-missing",
        _delete(_group0, "expected_generations"),
        ValueError,
        "expected_generations must be a positive integer",
    ),
    # 10
    (
        "r10-too-few-siblings",
        _set(_group0, "expected_generations", 3),
        ValueError,
        "recovery group 'g' must contain 3 siblings",
    ),
    (
        "r10-siblings-not-list",
        _set(_group0, "siblings", {}),
        ValueError,
        "recovery group 'g' must contain 2 siblings",
    ),
    (
        "r10-siblings-missing",
        _delete(_group0, "siblings"),
        ValueError,
        "recovery group 'g' must contain 2 siblings",
    ),
    # 11
    (
        "r11-status-unknown",
        _set(_group0, "status", "finalized"),
        ValueError,
        "invalid prompt group status='finalized'",
    ),
    (
        "r11-status-missing",
        _delete(_group0, "status"),
        ValueError,
        "invalid prompt group status=None",
    ),
    ("r11-status-int", _set(_group0, "status", 1), ValueError, "invalid prompt group status=1"),
    (
        "r11-phase-unknown",
        _set(_group0, "phase", "claimed"),
        ValueError,
        "invalid prompt group phase='claimed'",
    ),
    ("r11-phase-missing", _delete(_group0, "phase"), ValueError, "invalid prompt group phase=None"),
    # 12
    (
        "r12-sibling-not-mapping",
        lambda s: group(s)["siblings"].__setitem__(0, []),
        ValueError,
        "rollout-recovery sibling must be a mapping",
    ),
    (
        "r12-sibling-unknown-field",
        _set(_sibling0, "unexpected", 1),
        ValueError,
        "rollout-recovery sibling contains unknown fields: ['unexpected']",
    ),
    ("r12-indices-swapped", _swap_siblings, ValueError, "generation indices must be contiguous"),
    (
        "r12-index-missing",
        _delete(_sibling0, "generation_index"),
        ValueError,
        "generation indices must be contiguous",
    ),
    (
        "r12-no-attempts",
        _set(_sibling0, "attempts", []),
        ValueError,
        "logical rollout 'g_g0' has no attempts",
    ),
    (
        "r12-attempts-not-list",
        _set(_sibling0, "attempts", {}),
        ValueError,
        "logical rollout 'g_g0' has no attempts",
    ),
    # 13
    (
        "r13-attempt-not-mapping",
        lambda s: _sibling0(s).__setitem__("attempts", [None]),
        ValueError,
        "rollout-recovery attempt must be a mapping",
    ),
    (
        "r13-attempt-unknown-field",
        _set(_unsealed, "unexpected", 1),
        ValueError,
        "rollout-recovery attempt contains unknown fields: ['unexpected']",
    ),
    # 14
    (
        "r14-uuid-15-bytes",
        _set(_sealed, "attempt_uuid", b"x" * 15),
        ValueError,
        "attempt_uuid must contain exactly 16 bytes",
    ),
    (
        "r14-uuid-17-bytes",
        _set(_sealed, "attempt_uuid", b"x" * 17),
        ValueError,
        "attempt_uuid must contain exactly 16 bytes",
    ),
    (
        "r14-uuid-hex-str",
        _set(_sealed, "attempt_uuid", uuid.uuid4().hex),
        ValueError,
        "attempt_uuid must contain exactly 16 bytes",
    ),
    (
        "r14-uuid-object",
        _set(_sealed, "attempt_uuid", uuid.uuid4()),
        ValueError,
        "attempt_uuid must contain exactly 16 bytes",
    ),
    (
        "r14-uuid-missing",
        _delete(_sealed, "attempt_uuid"),
        ValueError,
        "attempt_uuid must contain exactly 16 bytes",
    ),
    (
        "r14-duplicate-between-siblings",
        _copy_uuid_between_siblings,
        ValueError,
        "duplicate rollout attempt identity",
    ),
    (
        "r14-duplicate-in-history",
        _copy_uuid_into_history,
        ValueError,
        "duplicate rollout attempt identity",
    ),
    (
        "r14-duplicate-across-groups",
        _copy_uuid_across_groups,
        ValueError,
        "duplicate rollout attempt identity",
    ),
    # 15
    (
        "r15-status-unknown",
        _set(_unsealed, "status", "running"),
        ValueError,
        "invalid rollout attempt status='running'",
    ),
    (
        "r15-status-missing",
        _delete(_unsealed, "status"),
        ValueError,
        "invalid rollout attempt status=None",
    ),
    (
        "r15-status-upper",
        _set(_unsealed, "status", "SEALED"),
        ValueError,
        "invalid rollout attempt status='SEALED'",
    ),
    # 16
    (
        "r16-checks-missing-key",
        lambda s: _sealed(s)["reward_checks"].pop("low_effort"),
        ValueError,
        "invalid reward_checks record",
    ),
    (
        "r16-checks-extra-key",
        lambda s: _sealed(s)["reward_checks"].__setitem__("x", True),
        ValueError,
        "invalid reward_checks record",
    ),
    (
        "r16-checks-list",
        _set(_sealed, "reward_checks", [True, True, True]),
        ValueError,
        "invalid reward_checks record",
    ),
    (
        "r16-checks-not-bool",
        lambda s: _sealed(s)["reward_checks"].__setitem__("low_effort", 1),
        ValueError,
        "reward checks must be booleans",
    ),
    # 17
    (
        "r17-log-context-extra-key",
        lambda s: _sealed(s)["reward_log_context"].__setitem__("x", 1),
        ValueError,
        "invalid reward log context",
    ),
    (
        "r17-log-context-missing-key",
        lambda s: _sealed(s)["reward_log_context"].pop("full_result_json"),
        ValueError,
        "invalid reward log context",
    ),
    (
        "r17-log-context-str",
        _set(_sealed, "reward_log_context", "agent"),
        ValueError,
        "invalid reward log context",
    ),
    (
        "r17-log-context-empty-agent",
        lambda s: _sealed(s)["reward_log_context"].__setitem__("agent_name", ""),
        ValueError,
        "reward log agent_name must be a nonempty string",
    ),
    (
        "r17-log-context-json-array",
        lambda s: _sealed(s)["reward_log_context"].__setitem__("full_result_json", "[1]"),
        ValueError,
        "reward log full_result_json must encode an object",
    ),
    # 18
    (
        "r18-staging-keys-missing",
        _delete(_unsealed, "staging_keys"),
        ValueError,
        "staging_keys must be a list of strings",
    ),
    (
        "r18-staging-keys-tuple",
        _set(_unsealed, "staging_keys", ()),
        ValueError,
        "staging_keys must be a list of strings",
    ),
    (
        "r18-staging-keys-non-str",
        lambda s: _sealed(s)["staging_keys"].__setitem__(0, 1),
        ValueError,
        "staging_keys must be a list of strings",
    ),
    # 19
    (
        "r19-sealed-reward-none",
        _set(_sealed, "reward", None),
        ValueError,
        "sealed attempts require a reward",
    ),
    (
        "r19-sealed-reward-str",
        _set(_sealed, "reward", "1.0"),
        ValueError,
        "sealed attempts require a reward",
    ),
    (
        "r19-sealed-mask-none",
        _set(_sealed, "mask_sample", None),
        ValueError,
        "sealed attempts require a boolean mask_sample",
    ),
    (
        "r19-sealed-mask-int",
        _set(_sealed, "mask_sample", 1),
        ValueError,
        "sealed attempts require a boolean mask_sample",
    ),
    (
        "r19-missing-receipt-owns-keys",
        _missing_receipt_with_keys,
        ValueError,
        "sealed missing-receipt attempt cannot own staging keys",
    ),
    ("r19-receipt-identity", _receipt_identity, ValueError, "sealed receipt identity mismatch"),
    (
        "r19-receipt-identity-missing",
        lambda s: _sealed(s)["receipt"].pop("rollout_id"),
        ValueError,
        "sealed receipt identity mismatch",
    ),
    (
        "r19-manifest-reordered",
        _seal_receipt_keys_reordered,
        ValueError,
        "sealed receipt staging manifest mismatch",
    ),
    (
        "r19-manifest-extra-key",
        lambda s: _sealed(s)["staging_keys"].append("extra"),
        ValueError,
        "sealed receipt staging manifest mismatch",
    ),
    (
        "r19-manifest-missing",
        _receipt_without_manifest,
        ValueError,
        "sealed rollout receipt must contain a manifest list",
    ),
    (
        "r19-manifest-entry",
        _receipt_bad_manifest_entry,
        ValueError,
        "sealed rollout receipt manifest entries must contain string staging_key values",
    ),
    (
        "r19-receipt-str",
        _set(_sealed, "receipt", "receipt"),
        ValueError,
        "sealed attempt receipt must be a mapping or None",
    ),
    (
        "r19-receipt-list",
        _set(_sealed, "receipt", []),
        ValueError,
        "sealed attempt receipt must be a mapping or None",
    ),
    # 20
    (
        "r20-unsealed-receipt",
        _set(_unsealed, "receipt", {}),
        ValueError,
        "only sealed attempts may retain receipt data",
    ),
    (
        "r20-unsealed-reward",
        _set(_unsealed, "reward", 0.0),
        ValueError,
        "only sealed attempts may retain receipt data",
    ),
    (
        "r20-unsealed-mask",
        _set(_unsealed, "mask_sample", False),
        ValueError,
        "only sealed attempts may retain receipt data",
    ),
    (
        "r20-unsealed-checks",
        _set(_unsealed, "reward_checks", msgspec.structs.asdict(CHECKS)),
        ValueError,
        "only sealed attempts may retain receipt data",
    ),
    (
        "r20-unsealed-log-context",
        _set(_unsealed, "reward_log_context", dataclasses.asdict(LOG_CONTEXT)),
        ValueError,
        "only sealed attempts may retain receipt data",
    ),
    (
        "r20-unsealed-staging-keys",
        _set(_unsealed, "staging_keys", ["k"]),
        ValueError,
        "only sealed attempts may retain receipt data",
    ),
    (
        "r20-historical-attempt",
        _history_with_receipt_data,
        ValueError,
        "only sealed attempts may retain receipt data",
    ),
    # 21
    (
        "r21-prompt-ref-not-mapping",
        _set(_group0, "prompt_ref", "7"),
        ValueError,
        "prompt_ref must be a mapping",
    ),
    (
        "r21-prompt-ref-missing",
        _delete(_group0, "prompt_ref"),
        ValueError,
        "prompt_ref must be a mapping",
    ),
    (
        "r21-prompt-ref-unknown-field",
        _set(_ref0, "unexpected", 1),
        ValueError,
        "rollout-recovery prompt_ref contains unknown fields: ['unexpected']",
    ),
    (
        "r21-sample-id-empty",
        _set(_ref0, "sample_id", ""),
        ValueError,
        "prompt_ref sample_id must be a non-empty string",
    ),
    (
        "r21-sample-id-int",
        _set(_ref0, "sample_id", 7),
        ValueError,
        "prompt_ref sample_id must be a non-empty string",
    ),
    (
        "r21-task-name-int",
        _set(_ref0, "task_name", 1),
        ValueError,
        "prompt_ref task_name must be a string or None",
    ),
    (
        "r21-sample-id-mismatch",
        _set(_ref0, "sample_id", "8"),
        ValueError,
        "prompt_ref sample_id must match prompt_id",
    ),
    # 22
    (
        "r22-target-step-str",
        _set(_group0, "target_step", "7"),
        ValueError,
        "target_step must be an integer or None",
    ),
    (
        "r22-target-step-float",
        _set(_group0, "target_step", 7.0),
        ValueError,
        "target_step must be an integer or None",
    ),
    (
        "r22-start-weight-none",
        _set(_group0, "start_weight_version", None),
        ValueError,
        "start_weight_version must be an integer",
    ),
    (
        "r22-start-weight-missing",
        _delete(_group0, "start_weight_version"),
        ValueError,
        "start_weight_version must be an integer",
    ),
    # 23
    (
        "r23-generating-all-sealed",
        _all_sealed_generating,
        ValueError,
        "generating group must retain an unfinished sibling",
    ),
    (
        "r23-ready-unsealed",
        _set(_group0, "status", "ready_to_finalize"),
        ValueError,
        "group state 'ready_to_finalize' requires every sibling to be sealed",
    ),
    (
        "r23-finalizing-unsealed",
        _set(_group0, "status", "finalizing"),
        ValueError,
        "group state 'finalizing' requires every sibling to be sealed",
    ),
    (
        "r23-unknown-unsealed",
        _set(_group0, "status", "finalization_unknown"),
        ValueError,
        "group state 'finalization_unknown' requires every sibling to be sealed",
    ),
    # 24
    ("r24-duplicate-group-id", _duplicate_group_id, ValueError, "duplicate recovery group_id='g'"),
    # 25
    (
        "r25-admission-phase",
        _disagreeing_admission("phase", "reserved"),
        ValueError,
        "rollout recovery groups sharing admission_id='g' disagree on phase or target_step",
    ),
    (
        "r25-admission-target-step",
        _disagreeing_admission("target_step", 8),
        ValueError,
        "rollout recovery groups sharing admission_id='g' disagree on phase or target_step",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "error", "message"), [c[1:] for c in BAD_STATES], ids=[c[0] for c in BAD_STATES]
)
def test_load_rejects_an_invalid_state(
    mutate: Callable[[dict[str, Any]], Any], error: type[BaseException], message: str
) -> None:
    state: Any = base_state()
    result = mutate(state)
    if isinstance(result, Replace):
        state = result.value
    with pytest.raises(error, match=starts_with(message)):
        RolloutRecoveryLedger.from_state_dict(state)
    target = RolloutRecoveryLedger()
    with pytest.raises(error, match=starts_with(message)):
        target.load_state_dict(CUT, state)
    assert len(target) == 0 and target.groups() == []
    assert target.state_dict() == {"schema_version": 3, "groups": []}


def test_load_failure_after_a_valid_group_loads_nothing() -> None:
    state = _rich_ledger().state_dict()
    state["groups"][-1]["status"] = "bogus"
    target = RolloutRecoveryLedger()
    with pytest.raises(ValueError, match=starts_with("invalid prompt group status='bogus'")):
        target.load_state_dict(CUT, state)
    assert len(target) == 0
    # the ledger is still usable and still empty
    target.load_state_dict(CUT, _rich_ledger().state_dict())
    assert len(target) == 5


def _decoded_groups(state: dict[str, Any]) -> list[Any]:
    import msgspec

    from rollout_recovery.ledger.codec_support import GroupState

    return msgspec.convert(state["groups"], list[GroupState])


def test_load_decoded_groups_is_the_fast_load_state_dict_and_takes_the_cut() -> None:
    state = _rich_ledger().state_dict()
    target = RolloutRecoveryLedger()
    with pytest.raises(RuntimeError, match=DEAD_CUT_MESSAGE):
        target.load_decoded_groups(DEAD, _decoded_groups(state))
    assert len(target) == 0
    target.load_decoded_groups(CUT, _decoded_groups(state))
    expected = RolloutRecoveryLedger.from_state_dict(state).groups()
    assert target.groups() == expected
    assert RolloutRecoveryLedger.from_decoded_groups(_decoded_groups(state)).groups() == expected
    with pytest.raises(RuntimeError, match="non-empty"):
        target.load_decoded_groups(CUT, _decoded_groups(state))
