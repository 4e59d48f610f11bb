"""The persisted schema is written once: every restated field set is pinned to the Structs."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from rollout_recovery import _bounds
from rollout_recovery.checkpoint import _native
from rollout_recovery.ledger import _constants, _storage
from rollout_recovery.rewards import RewardChecks


@pytest.mark.parametrize(
    ("restated", "storage"),
    [
        (_constants.GROUP_STATE_FIELDS, _storage.GroupState),
        (_constants.PROMPT_REF_STATE_FIELDS, _storage.PromptRefState),
        (_constants.SIBLING_STATE_FIELDS, _storage.SiblingState),
        (_constants.ATTEMPT_STATE_FIELDS, _storage.AttemptState),
        (_constants.REWARD_CHECKS_FIELDS, RewardChecks),
    ],
)
def test_decode_field_sets_are_the_storage_fields(
    restated: frozenset[str], storage: type[msgspec.Struct]
) -> None:
    assert restated == frozenset(storage.__struct_fields__)


def test_native_payload_is_the_storage_structs() -> None:
    # The fast-load payload is the storage itself; the as-written payload is derived from it
    # with three leaf rules relaxed (enum -> str, float -> int | float, any dict key type).
    written = _native._as_written_struct(_storage.GroupState)
    group_fields = dict(
        zip(written.__struct_fields__, msgspec.structs.fields(written), strict=True)
    )
    assert written.__struct_fields__ == _storage.GroupState.__struct_fields__
    assert group_fields["status"].type is str
    assert group_fields["prompt_ref"].type is _storage.PromptRefState
    sibling = _native._as_written_struct(_storage.SiblingState)
    attempt = _native._as_written_struct(_storage.AttemptState)
    assert group_fields["siblings"].type == list[sibling]
    assert sibling.__struct_fields__ == _storage.SiblingState.__struct_fields__
    assert attempt.__struct_fields__ == _storage.AttemptState.__struct_fields__
    attempt_fields = {field.name: field.type for field in msgspec.structs.fields(attempt)}
    assert attempt_fields["reward"] == int | float | None
    assert attempt_fields["receipt"] == dict[Any, Any] | None
    assert attempt_fields["reward_checks"] == RewardChecks | None
    assert attempt_fields["reward_log_context"] == _storage.RewardLogContextState | None
    for untouched in (
        _storage.PromptRefState,
        RewardChecks,
        _storage.RewardLogContextState,
    ):
        assert _native._as_written_struct(untouched) is untouched


def test_native_sidecar_fields_are_the_sidecar_state_fields() -> None:
    assert frozenset(_native._Sidecar.__struct_fields__) == _constants.SIDECAR_STATE_FIELDS


def test_bounds_have_one_definition() -> None:
    from rollout_recovery.capture import _keys
    from rollout_recovery.checkpoint import _torch_pt

    assert _keys.IDENTIFIER_PATTERN is _bounds.IDENTIFIER_PATTERN
    assert _torch_pt.DEFAULT_MAX_DEPTH == (
        _bounds.MAX_PLAIN_DEPTH + _bounds.RECEIPT_DEPTH_IN_SIDECAR
    )
    assert _native.ROLLOUT_RECOVERY_SCHEMA_VERSION is _constants.ROLLOUT_RECOVERY_SCHEMA_VERSION


def test_reward_checks_are_one_type_in_the_ledger_the_journal_and_the_rewards() -> None:
    # One shape for the one fact (issue 25 item 4): no converters between look-alikes.
    from rollout_recovery.history import records

    seal_fields = {field.name: field.type for field in msgspec.structs.fields(records.Seal)}
    stored = {field.name: field.type for field in msgspec.structs.fields(_storage.AttemptState)}
    assert seal_fields["reward_checks"] == stored["reward_checks"] == RewardChecks | None
    checks = RewardChecks(duplicated_reasoning=True, empty_final_answer=False, low_effort=True)
    # The journal and the ledger's state hold the same three keys.
    assert msgspec.to_builtins(checks) == {
        "duplicated_reasoning": True,
        "empty_final_answer": False,
        "low_effort": True,
    }
