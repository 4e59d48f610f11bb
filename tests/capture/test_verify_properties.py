"""Property tests: random multi-call rollouts round-trip; any single corruption is caught."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
from capture_support import Built, call_id, forge, rollouts, with_row
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rollout_recovery.capture import LinearizedRollout, Rejection
from rollout_recovery.capture._verify import fetch_and_verify, verify_and_linearize

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _assert_matches_oracle(result: object, built: Built) -> None:
    assert isinstance(result, LinearizedRollout), getattr(result, "reason", result)
    assert result.rollout_id == built.rollout_id
    assert result.token_ids.dtype == np.int32
    assert result.token_mask.dtype == np.float32
    assert result.logprobs.dtype == np.float32
    assert result.token_ids.tolist() == built.expected_tokens
    assert result.token_mask.tolist() == built.expected_mask
    assert result.logprobs.tolist() == built.expected_logprobs
    assert result.call_ids == tuple(call_id(i) for i in built.expected_chain)
    root = built.specs[built.expected_chain[0]]
    assert result.prompt_len == len(root.carried)
    # Spans tile the row exactly, each with its call's stamped version.
    position = 0
    for link, span, index in zip(
        result.link_spans, result.weight_version_spans, built.expected_chain, strict=True
    ):
        spec = built.specs[index]
        assert link == (call_id(index), len(spec.carried), len(spec.generated))
        assert span.start == position
        position = span.end
        assert span.end - span.start == link.carry_len + link.generated_len
        assert span.weight_version == spec.weight_version
    assert position == len(built.expected_tokens)
    versions = [spec.weight_version for spec in built.specs]
    assert (result.min_weight_version, result.max_weight_version) == (min(versions), max(versions))
    assert result.staging_keys == tuple(r.staging_key for r in built.records)


@SETTINGS
@given(rollouts())
def test_write_receipt_verify_round_trips_exactly(built: Built) -> None:
    # Through the stored dict form, JSON and back: that is how a receipt reaches the
    # finalizer after a restart.
    receipt = json.loads(json.dumps(built.receipt))
    result = verify_and_linearize(receipt, built.rows(), expected_rollout_id=built.rollout_id)
    _assert_matches_oracle(result, built)
    _assert_matches_oracle(fetch_and_verify(receipt, built.data_plane), built)


@SETTINGS
@given(rollouts(), st.data())
def test_flipping_any_single_staged_token_is_a_digest_mismatch(
    built: Built, data: st.DataObject
) -> None:
    rows = built.rows()
    index = data.draw(st.integers(0, len(rows) - 1), label="row")
    tokens = rows[index].token_ids.copy()
    position = data.draw(st.integers(0, tokens.size - 1), label="position")
    new_value = data.draw(st.integers(0, 2**31 - 1).filter(lambda v: v != tokens[position]))
    tokens[position] = new_value
    rows[index] = with_row(rows[index], token_ids=tokens)
    result = verify_and_linearize(built.receipt, rows)
    assert isinstance(result, Rejection)
    assert result.code == "digest_mismatch", result.reason


@SETTINGS
@given(rollouts(min_calls=2), st.data())
def test_reordering_the_manifest_against_its_rows_is_rejected(
    built: Built, data: st.DataObject
) -> None:
    count = len(built.records)
    order = data.draw(st.permutations(range(count)), label="order")
    assume(list(order) != list(range(count)))
    receipt = copy.deepcopy(built.receipt)
    receipt["manifest"] = [receipt["manifest"][i] for i in order]
    result = verify_and_linearize(receipt, built.rows())
    assert isinstance(result, Rejection)
    assert result.code == "staging_key_mismatch", result.reason


@SETTINGS
@given(rollouts(min_calls=2), st.data())
def test_a_reordered_manifest_with_refetched_rows_is_rejected_iff_a_child_precedes_its_parent(
    built: Built, data: st.DataObject
) -> None:
    count = len(built.records)
    order = data.draw(st.permutations(range(count)), label="order")
    receipt = copy.deepcopy(built.receipt)
    receipt["manifest"] = [receipt["manifest"][i] for i in order]
    position = {index: slot for slot, index in enumerate(order)}
    breaks_order = any(
        spec.parent is not None and position[spec.parent] > position[index]
        for index, spec in enumerate(built.specs)
    )
    result = fetch_and_verify(receipt, built.data_plane)
    if breaks_order:
        assert isinstance(result, Rejection)
        assert (result.code, result.rebuild_code) == ("rebuild_failed", "manifest_order")
    else:
        # Commit order among siblings carries no meaning; the linearization is the same.
        assert isinstance(result, LinearizedRollout), result
        assert result.token_ids.tolist() == built.expected_tokens


def _children(built: Built) -> list[int]:
    return [i for i, spec in enumerate(built.specs) if spec.parent is not None]


@SETTINGS
@given(rollouts(min_calls=2), st.data())
def test_breaking_a_parent_link_in_the_receipt_is_a_parent_call_id_mismatch(
    built: Built, data: st.DataObject
) -> None:
    children = _children(built)
    assume(children)
    index = data.draw(st.sampled_from(children), label="child")
    current = built.records[index].parent_call_id
    others = [call_id(i) for i in range(len(built.records)) if call_id(i) != current]
    new_parent = data.draw(st.sampled_from([*others, "ghost"]), label="new parent")
    receipt = copy.deepcopy(built.receipt)
    receipt["manifest"][index]["parent_call_id"] = new_parent
    result = verify_and_linearize(receipt, built.rows())
    assert isinstance(result, Rejection)
    assert result.code == "parent_call_id_mismatch", result.reason


@SETTINGS
@given(rollouts(min_calls=2), st.data())
def test_breaking_a_parent_link_in_the_receipt_by_dropping_it_is_an_invalid_receipt(
    built: Built, data: st.DataObject
) -> None:
    children = _children(built)
    assume(children)
    index = data.draw(st.sampled_from(children), label="child")
    receipt = copy.deepcopy(built.receipt)
    receipt["manifest"][index]["parent_call_id"] = None
    result = verify_and_linearize(receipt, built.rows())
    assert isinstance(result, Rejection)
    assert result.code == "invalid_receipt", result.reason


@SETTINGS
@given(rollouts(min_calls=2), st.data())
def test_a_consistently_forged_relink_is_caught_by_the_lineage_checks(
    built: Built, data: st.DataObject
) -> None:
    # Row header and manifest agree and carry a valid digest: only the chain hash, the
    # parent's length or the manifest order can tell the link is wrong.
    children = _children(built)
    assume(children)
    index = data.draw(st.sampled_from(children), label="child")
    current = built.records[index].parent_call_id
    others = [call_id(i) for i in range(len(built.records)) if call_id(i) != current]
    new_parent = data.draw(st.sampled_from([*others, "ghost"]), label="new parent")
    receipt, rows = forge(built.receipt, built.rows(), index, parent_call_id=new_parent)
    result = verify_and_linearize(receipt, rows)
    twin = next((r for r in built.records if r.model_call_id == new_parent), None)
    parent_record = next(r for r in built.records if r.model_call_id == current)
    twin_listed_first = twin is not None and built.records.index(twin) < index
    if twin is not None and twin.chain_hash == parent_record.chain_hash and twin_listed_first:
        # The new parent is token-for-token identical to the old one (same ancestry content)
        # and listed before the child: nothing observable changed, so the row is the same.
        # (A twin listed after the child is still refused, by manifest order.)
        assert isinstance(result, LinearizedRollout), result
        assert result.token_ids.tolist() == built.expected_tokens
        return
    assert isinstance(result, Rejection)
    assert result.code == "rebuild_failed", result.reason
    assert result.rebuild_code in {
        "missing_parent",
        "manifest_order",
        "parent_length_mismatch",
        "chain_hash_mismatch",
    }


# ------------------------------------------------------------ hostile input never raises

json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for position, item in enumerate(value):
            found += _paths(item, (*prefix, position))
    return found


def _replace_at(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, *rest = path
    value[head] = _replace_at(value[head], tuple(rest), new)
    return value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rollouts(), st.data())
def test_hostile_receipts_and_row_headers_are_rejected_never_raised(
    built: Built, data: st.DataObject
) -> None:
    receipt = copy.deepcopy(built.receipt)
    rows = built.rows()
    if data.draw(st.booleans(), label="corrupt the receipt"):
        path = data.draw(st.sampled_from(_paths(receipt)), label="path")
        receipt = _replace_at(receipt, path, data.draw(json_values, label="value"))
    else:
        index = data.draw(st.integers(0, len(rows) - 1), label="row")
        header = copy.deepcopy(dict(rows[index].metadata))
        path = data.draw(st.sampled_from(_paths(header)), label="path")
        rows[index] = with_row(
            rows[index], metadata=_replace_at(header, path, data.draw(json_values, label="value"))
        )
    result = verify_and_linearize(receipt, rows, expected_rollout_id=built.rollout_id)
    # A replacement can coincide with the original value; then the rollout is still valid.
    assert isinstance(result, LinearizedRollout | Rejection)
    if isinstance(result, LinearizedRollout):
        assert result.token_ids.tolist() == built.expected_tokens


@SETTINGS
@given(rollouts(), st.data())
def test_hostile_row_arrays_are_rejected_never_raised(built: Built, data: st.DataObject) -> None:
    rows = built.rows()
    index = data.draw(st.integers(0, len(rows) - 1), label="row")
    field = data.draw(st.sampled_from(["token_ids", "token_mask", "logprobs"]), label="field")
    dtype = data.draw(
        st.sampled_from(["int8", "int64", "uint64", "float16", "float64", "bool", "object", "U3"])
    )
    size = data.draw(st.integers(0, 6), label="size")
    raw = data.draw(st.lists(st.integers(-5, 5), min_size=size, max_size=size), label="values")
    array = np.array(raw).astype(dtype)
    rows[index] = with_row(rows[index], **{field: array})
    result = verify_and_linearize(built.receipt, rows)
    assert isinstance(result, LinearizedRollout | Rejection)
