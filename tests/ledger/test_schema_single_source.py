"""The persisted schema is written once: every restated field set is pinned to the Structs."""

from __future__ import annotations

import msgspec
import pytest

from rollout_recovery import _bounds
from rollout_recovery.checkpoint import _native
from rollout_recovery.ledger import _constants, _storage


@pytest.mark.parametrize(
    ("restated", "storage"),
    [
        (_constants.GROUP_STATE_FIELDS, _storage.GroupState),
        (_constants.PROMPT_REF_STATE_FIELDS, _storage.PromptRefState),
        (_constants.SIBLING_STATE_FIELDS, _storage.SiblingState),
        (_constants.ATTEMPT_STATE_FIELDS, _storage.AttemptState),
        (_constants.REWARD_CHECKS_FIELDS, _storage.RewardChecksState),
    ],
)
def test_decode_field_sets_are_the_storage_fields(
    restated: frozenset[str], storage: type[msgspec.Struct]
) -> None:
    assert restated == frozenset(storage.__struct_fields__)


@pytest.mark.parametrize(
    ("native", "storage"),
    [
        (_native._Group, _storage.GroupState),
        (_native._PromptRef, _storage.PromptRefState),
        (_native._Sibling, _storage.SiblingState),
        (_native._Attempt, _storage.AttemptState),
        (_native._RewardChecks, _storage.RewardChecksState),
        (_native._RewardLogContext, _storage.RewardLogContextState),
    ],
)
def test_native_payload_records_have_the_storage_fields_in_order(
    native: type[msgspec.Struct], storage: type[msgspec.Struct]
) -> None:
    # The untyped-output decoder's records mirror the storage ones field for field.
    assert native.__struct_fields__ == storage.__struct_fields__


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
