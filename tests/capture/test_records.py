"""Call records and staged-row headers: dict round trips and strict validation."""

from __future__ import annotations

import json
from typing import Any

import pytest
from capture_support import simple_rollout

from rollout_recovery.capture._records import CallRecord, StagedCallHeader
from rollout_recovery.errors import InvalidStateError


def _record_dict() -> dict[str, Any]:
    return simple_rollout().records[1].to_dict()


def test_record_dict_round_trips_through_json() -> None:
    record = simple_rollout().records[1]
    data = json.loads(json.dumps(record.to_dict()))
    assert CallRecord.from_dict(data) == record
    assert list(data) == [
        "model_call_id",
        "parent_call_id",
        "mode",
        "prev_len",
        "delta_len",
        "cum_len",
        "weight_version",
        "digest",
        "extras_digest",
        "chain_hash",
        "cumulative_hash",
        "schema_version",
        "digest_version",
        "extras_digest_version",
        "staging_key",
    ]


def test_records_are_frozen() -> None:
    record = simple_rollout().records[0]
    with pytest.raises(AttributeError):
        record.prev_len = 3  # type: ignore[misc]


def test_version_fields_default_when_absent() -> None:
    data = _record_dict()
    for name in ("schema_version", "digest_version", "extras_digest_version"):
        del data[name]
    assert CallRecord.from_dict(data).schema_version == 2


def test_mode_defaults_to_token_in_so_a_root_must_say_text() -> None:
    root = simple_rollout().records[0].to_dict()
    del root["mode"]
    with pytest.raises(InvalidStateError, match="token_in"):
        CallRecord.from_dict(root)
    child = _record_dict()
    del child["mode"]
    assert CallRecord.from_dict(child).mode == "token_in"


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("prev_len", True, "$.prev_len"),
        ("prev_len", 5.0, "$.prev_len"),
        ("weight_version", -1, "$.weight_version"),
        ("delta_len", 0, "$.delta_len"),
        ("digest", "A" * 64, "$.digest"),
        ("model_call_id", "a/b", "$.model_call_id"),
        ("model_call_id", "abc\n", "$.model_call_id"),
        ("mode", "chat", "$.mode"),
        ("staging_key", "r/c/d", "$.staging_key"),
        ("schema_version", 1, "$.schema_version"),
    ],
)
def test_from_dict_refuses_bad_fields_with_a_path(field: str, value: Any, path: str) -> None:
    data = _record_dict()
    data[field] = value
    with pytest.raises(InvalidStateError) as info:
        CallRecord.from_dict(data)
    assert info.value.path == path


def test_from_dict_refuses_unknown_and_missing_fields() -> None:
    with pytest.raises(InvalidStateError, match="unknown field"):
        CallRecord.from_dict({**_record_dict(), "logical_request_id": "x"})
    data = _record_dict()
    del data["chain_hash"]
    with pytest.raises(InvalidStateError, match="chain_hash"):
        CallRecord.from_dict(data)
    with pytest.raises(InvalidStateError, match="must be a dict"):
        CallRecord.from_dict([])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [
        {"cum_len": 99},
        {"parent_call_id": None},  # token_in without a parent
        {"mode": "text"},  # text with a parent
        {"prev_len": 0, "cum_len": 4},  # token_in with prev_len 0
    ],
)
def test_cross_field_rules(changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidStateError):
        CallRecord.from_dict({**_record_dict(), **changes})


def test_cross_field_rules_also_hold_for_direct_construction() -> None:
    data = _record_dict()
    data["cum_len"] = 1
    with pytest.raises(InvalidStateError, match="cum_len"):
        CallRecord(**data)


def test_staged_header_round_trips_and_names_its_rollout() -> None:
    built = simple_rollout("grp_g1_a9")
    header = StagedCallHeader.from_dict(built.rows()[2].metadata)
    assert header.rollout_id == "grp_g1_a9"
    assert header.to_dict() == dict(built.rows()[2].metadata)
    record = built.records[2]
    for name in ("model_call_id", "parent_call_id", "prev_len", "digest", "chain_hash"):
        assert getattr(header, name) == getattr(record, name)
    with pytest.raises(InvalidStateError, match="unknown field"):
        StagedCallHeader.from_dict({**header.to_dict(), "staging_key": record.staging_key})
