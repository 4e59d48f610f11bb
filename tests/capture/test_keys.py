"""Staging keys: build and parse, both parts validated."""

from __future__ import annotations

import pytest
from capture_support import identifiers
from hypothesis import given

from rollout_recovery.capture._keys import (
    is_identifier,
    new_model_call_id,
    parse_staging_key,
    staging_key,
)
from rollout_recovery.errors import InvalidArgumentError, InvalidStateError


@given(identifiers, identifiers)
def test_build_then_parse_round_trips(rollout_id: str, model_call_id: str) -> None:
    key = staging_key(rollout_id, model_call_id)
    assert key == f"{rollout_id}/{model_call_id}"
    assert parse_staging_key(key) == (rollout_id, model_call_id)


def test_gate_rollout_id_with_hyphenated_group_uuid_is_accepted() -> None:
    rollout_id = "3f2c9a1e-0b7d-4c2e-9a1e-5b0e7c41aa00_g3_a5b0ec41"
    assert parse_staging_key(staging_key(rollout_id, "9d4f1ae2")) == (rollout_id, "9d4f1ae2")


BAD_PARTS = ["", "a/b", ".hidden", "-lead", "with space", "trailing\n", "é", "_x"]


@pytest.mark.parametrize("bad", BAD_PARTS)
def test_build_refuses_a_bad_rollout_id(bad: str) -> None:
    with pytest.raises(InvalidArgumentError, match="rollout_id") as info:
        staging_key(bad, "call")
    assert info.value.path == "$.rollout_id"


@pytest.mark.parametrize("bad", BAD_PARTS)
def test_build_refuses_a_bad_model_call_id(bad: str) -> None:
    with pytest.raises(InvalidArgumentError, match="model_call_id"):
        staging_key("rollout", bad)


@pytest.mark.parametrize(
    "key", ["", "no-slash", "a/b/c", "/call", "rollout/", ".r/c", "r/.c", "r/c\n"]
)
def test_parse_refuses_malformed_keys(key: str) -> None:
    with pytest.raises(InvalidStateError):
        parse_staging_key(key)


def test_parse_refuses_non_strings() -> None:
    with pytest.raises(InvalidStateError):
        parse_staging_key(b"r/c")  # type: ignore[arg-type]


def test_build_refuses_non_strings() -> None:
    with pytest.raises(InvalidArgumentError):
        staging_key("r", 7)  # type: ignore[arg-type]
    assert not is_identifier(7)


def test_new_model_call_ids_are_fresh_identifiers() -> None:
    ids = {new_model_call_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(is_identifier(i) for i in ids)
