"""One example per rejection reason of ``verify_and_linearize``, plus the happy path."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from capture_support import Built, DictDataPlane, forge, simple_rollout, with_row

from rollout_recovery.capture import (
    CaptureWriter,
    LinearizedRollout,
    Receipt,
    Rejection,
)
from rollout_recovery.capture._extras import EMPTY_EXTRAS_DIGEST
from rollout_recovery.capture._receipt import CaptureFailure, assemble_receipt
from rollout_recovery.capture._result import (
    FIELD_MISMATCH_FIELDS,
    LinkSpan,
    RebuildCode,
    RejectionCode,
    WeightVersionSpan,
)
from rollout_recovery.capture._verify import fetch_and_verify, verify_and_linearize
from rollout_recovery.dataplane._protocol import Row

RID = "grp1_g0_aabc123"


def _rejected(result: object, code: str, rebuild_code: str | None = None) -> Rejection:
    assert isinstance(result, Rejection), result
    assert result.code == code, result.reason
    assert result.rebuild_code == rebuild_code, result.reason
    return result


@pytest.fixture
def built() -> Built:
    return simple_rollout(RID)


def _receipt(built: Built) -> dict[str, Any]:
    return copy.deepcopy(built.receipt)


# ------------------------------------------------------------------------ happy path


def test_valid_rollout_linearizes_the_terminal_chain(built: Built) -> None:
    result = verify_and_linearize(built.receipt, built.rows(), expected_rollout_id=RID)
    assert isinstance(result, LinearizedRollout)
    # root: carried 11 12 13, generated 21 22; child: carried 31, generated 41 42 43;
    # grandchild: generated 51. The dead branch (call03) is verified but not linearized.
    assert result.token_ids.tolist() == [11, 12, 13, 21, 22, 31, 41, 42, 43, 51]
    assert result.token_mask.tolist() == [0, 0, 0, 1, 1, 0, 1, 1, 1, 1]
    assert result.logprobs.dtype == np.float32
    assert result.logprobs.tolist() == pytest.approx(
        [0, 0, 0, -0.5, -1.25, 0, -0.1, -0.2, -0.3, -2.0]
    )
    assert result.prompt_len == 3
    assert result.call_ids == ("call00", "call01", "call02")
    assert result.link_spans == (
        LinkSpan("call00", 3, 2),
        LinkSpan("call01", 1, 3),
        LinkSpan("call02", 0, 1),
    )
    assert result.weight_version_spans == (
        WeightVersionSpan("call00", 0, 5, 3),
        WeightVersionSpan("call01", 5, 9, 3),
        WeightVersionSpan("call02", 9, 10, 4),
    )
    assert result.staging_keys == tuple(f"{RID}/call0{i}" for i in range(4))
    assert (result.min_weight_version, result.max_weight_version) == (3, 4)
    assert result.terminal_model_call_id == "call02"


def test_fetch_and_verify_reads_rows_from_the_data_plane(built: Built) -> None:
    result = fetch_and_verify(built.receipt, built.data_plane, expected_rollout_id=RID)
    assert isinstance(result, LinearizedRollout)
    assert result.token_ids.tolist()[-1] == 51


def test_a_receipt_struct_is_accepted_like_its_dict(built: Built) -> None:
    result = verify_and_linearize(Receipt.from_dict(built.receipt), built.rows())
    assert isinstance(result, LinearizedRollout)


# ------------------------------------------------------------------ receipt-level codes


def test_missing_receipt() -> None:
    _rejected(verify_and_linearize(None, []), "missing_receipt")


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda r: ["not", "a", "dict"], id="not-a-dict"),
        pytest.param(lambda r: {**r, "surprise": 1}, id="unknown-field"),
        pytest.param(lambda r: {k: v for k, v in r.items() if k != "manifest"}, id="no-manifest"),
        pytest.param(lambda r: {**r, "rollout_id": "has/slash"}, id="bad-rollout-id"),
        pytest.param(lambda r: {**r, "terminal_model_call_id": None}, id="unpoisoned-no-terminal"),
        pytest.param(lambda r: {**r, "failure_reason": "x"}, id="unpoisoned-with-reason"),
        pytest.param(lambda r: {**r, "reward": float("nan")}, id="nan-reward"),
        pytest.param(lambda r: {**r, "schema_version": 1}, id="old-schema"),
    ],
)
def test_invalid_receipt(built: Built, mutate: Any) -> None:
    _rejected(verify_and_linearize(mutate(_receipt(built)), built.rows()), "invalid_receipt")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prev_len", True),  # a bool is not an int
        ("prev_len", -1),
        ("delta_len", 0),
        ("cum_len", 999),  # != prev_len + delta_len
        ("digest", "ABC"),
        ("mode", "text"),  # a text call cannot have a parent
        ("staging_key", "no-slash"),
    ],
)
def test_invalid_receipt_manifest_entry_names_its_path(
    built: Built, field: str, value: Any
) -> None:
    receipt = _receipt(built)
    receipt["manifest"][1][field] = value
    rejection = _rejected(verify_and_linearize(receipt, built.rows()), "invalid_receipt")
    assert "$.manifest[1]" in rejection.detail


def test_identity_mismatch_with_the_expected_gate_id(built: Built) -> None:
    rejection = _rejected(
        verify_and_linearize(built.receipt, built.rows(), expected_rollout_id="grp1_g0_aother"),
        "identity_mismatch",
    )
    assert "grp1_g0_aother" in rejection.reason


def test_identity_mismatch_for_a_manifest_key_of_another_rollout(built: Built) -> None:
    receipt = _receipt(built)
    receipt["manifest"][2]["staging_key"] = "grp1_g0_aother/call02"
    _rejected(verify_and_linearize(receipt, built.rows()), "identity_mismatch")


def test_capture_poisoned_carries_the_failure_reason(built: Built) -> None:
    receipt = assemble_receipt(
        RID,
        built.records,
        terminal_model_call_id="call02",
        failures=[CaptureFailure(model_call_id="call09", reason="worker_capture_failed")],
    ).to_dict()
    rejection = _rejected(verify_and_linearize(receipt, built.rows()), "capture_poisoned")
    assert rejection.reason == "capture_poisoned:worker_capture_failed"


def test_empty_manifest(built: Built) -> None:
    receipt = {**_receipt(built), "manifest": []}
    _rejected(verify_and_linearize(receipt, []), "empty_manifest")


def test_duplicate_staging_key(built: Built) -> None:
    receipt = _receipt(built)
    receipt["manifest"].append(copy.deepcopy(receipt["manifest"][0]))
    _rejected(
        verify_and_linearize(receipt, [*built.rows(), built.rows()[0]]), "duplicate_staging_key"
    )


def test_duplicate_manifest_call_id(built: Built) -> None:
    receipt = _receipt(built)
    twin = copy.deepcopy(receipt["manifest"][0])
    twin["staging_key"] = f"{RID}/elsewhere"
    receipt["manifest"].append(twin)
    _rejected(
        verify_and_linearize(receipt, [*built.rows(), built.rows()[0]]),
        "duplicate_manifest_call_id",
    )


def test_call_id_mismatch_between_entry_and_its_key(built: Built) -> None:
    receipt = _receipt(built)
    receipt["manifest"][1]["staging_key"] = f"{RID}/zzz"
    _rejected(verify_and_linearize(receipt, built.rows()), "call_id_mismatch")


# ---------------------------------------------------------------------- row-level codes


def test_missing_staging_row_from_the_data_plane(built: Built) -> None:
    built.data_plane.clear(CaptureWriter.staging_partition, [f"{RID}/call03"])
    rejection = _rejected(fetch_and_verify(built.receipt, built.data_plane), "missing_staging_row")
    assert rejection.reason == f"missing_staging_row:{RID}/call03"


def test_missing_staging_row_when_fewer_rows_than_manifest_entries(built: Built) -> None:
    _rejected(verify_and_linearize(built.receipt, built.rows()[:-1]), "missing_staging_row")


def test_staging_key_mismatch_when_rows_come_back_misordered(built: Built) -> None:
    rows = built.rows()
    rows[0], rows[1] = rows[1], rows[0]
    _rejected(verify_and_linearize(built.receipt, rows), "staging_key_mismatch")


def test_staging_key_mismatch_for_a_row_of_another_rollout(built: Built) -> None:
    other = simple_rollout("grp1_g0_aother")
    rows = built.rows()
    rows[2] = other.rows()[2]
    _rejected(verify_and_linearize(built.receipt, rows), "staging_key_mismatch")


def _mutated_row(built: Built, index: int, **changes: Any) -> list[Row]:
    rows = built.rows()
    rows[index] = with_row(rows[index], **changes)
    return rows


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"metadata": {"junk": 1}}, id="junk-header"),
        pytest.param({"metadata": "not a mapping"}, id="non-mapping-header"),
        pytest.param({"token_ids": np.array([11.0, 12, 13, 21, 22])}, id="float-token-ids"),
        pytest.param({"token_ids": np.array([11, 12, -13, 21, 22])}, id="negative-token-id"),
        pytest.param({"token_mask": [0.0, 0.0, 0.0, 1.0, 1.0]}, id="list-not-array"),
        pytest.param({"logprobs": np.zeros((5, 1), np.float32)}, id="two-dimensional"),
    ],
)
def test_invalid_staging_row(built: Built, changes: dict[str, Any]) -> None:
    _rejected(
        verify_and_linearize(built.receipt, _mutated_row(built, 0, **changes)),
        "invalid_staging_row",
    )


def test_invalid_staging_row_when_the_row_is_not_a_row(built: Built) -> None:
    rows: list[Any] = built.rows()
    rows[0] = {"token_ids": [1]}
    _rejected(verify_and_linearize(built.receipt, rows), "invalid_staging_row")


def test_corrupt_extras_when_the_digest_names_other_extras(built: Built) -> None:
    # A consistent forgery of the extras digest alone: the row's (absent) extras no longer
    # hash to it.
    other_extras = "f" * 64
    receipt, rows = forge(built.receipt, built.rows(), 0, extras_digest=other_extras)
    assert other_extras != EMPTY_EXTRAS_DIGEST
    _rejected(verify_and_linearize(receipt, rows), "corrupt_extras")


def test_corrupt_extras_when_a_staged_extra_is_changed(built: Built) -> None:
    rows = built.rows()
    rows[0] = with_row(rows[0], metadata={**rows[0].metadata, "extras": {"server": "evil"}})
    _rejected(verify_and_linearize(built.receipt, rows), "corrupt_extras")


def test_corrupt_extras_when_an_extra_cannot_be_encoded(built: Built) -> None:
    rows = built.rows()
    rows[0] = with_row(rows[0], metadata={**rows[0].metadata, "extras": {"bad": float("nan")}})
    _rejected(verify_and_linearize(built.receipt, rows), "corrupt_extras")


def test_length_mismatch(built: Built) -> None:
    rows = _mutated_row(built, 1, token_ids=built.rows()[1].token_ids[:-1])
    _rejected(verify_and_linearize(built.receipt, rows), "length_mismatch")


@pytest.mark.parametrize(
    "mask",
    [
        pytest.param([0.0, 0.5, 1.0, 1.0], id="not-binary"),
        pytest.param([0.0, 1.0, 0.0, 1.0], id="generation-then-carry"),
        pytest.param([0.0, 0.0, 0.0, 0.0], id="no-generated-token"),
    ],
)
def test_invalid_token_mask(built: Built, mask: list[float]) -> None:
    rows = _mutated_row(built, 1, token_mask=np.array(mask, np.float32))
    _rejected(verify_and_linearize(built.receipt, rows), "invalid_token_mask")


def test_non_finite_logprob(built: Built) -> None:
    rows = _mutated_row(built, 1, logprobs=np.array([0.0, -0.1, np.nan, -0.3], np.float32))
    _rejected(verify_and_linearize(built.receipt, rows), "non_finite_logprob")


def test_misaligned_delta_when_a_carried_token_has_a_logprob(built: Built) -> None:
    rows = _mutated_row(built, 1, logprobs=np.array([-0.7, -0.1, -0.2, -0.3], np.float32))
    _rejected(verify_and_linearize(built.receipt, rows), "misaligned_delta")


@pytest.mark.parametrize(
    ("header_changes", "code"),
    [
        ({"parent_call_id": "call03"}, "parent_call_id_mismatch"),
        ({"prev_len": 6, "cum_len": 10}, "prev_len_mismatch"),
        ({"delta_len": 5, "cum_len": 10}, "delta_len_mismatch"),
        ({"weight_version": 7}, "weight_version_mismatch"),
        ({"extras_digest": "e" * 64}, "extras_digest_mismatch"),
        ({"chain_hash": "c" * 64}, "chain_hash_mismatch"),
        ({"cumulative_hash": "d" * 64}, "cumulative_hash_mismatch"),
        ({"digest": "0" * 64}, "digest_mismatch"),
    ],
)
def test_field_mismatch_between_row_header_and_manifest(
    built: Built, header_changes: dict[str, Any], code: str
) -> None:
    row = built.rows()[1]
    rows = _mutated_row(built, 1, metadata={**row.metadata, **header_changes})
    rejection = _rejected(verify_and_linearize(built.receipt, rows), code)
    assert rejection.detail.startswith(f"{RID}/call01")


def test_digest_mismatch_when_a_staged_token_is_flipped(built: Built) -> None:
    row = built.rows()[3]
    tokens = row.token_ids.copy()
    tokens[1] += 1
    rows = _mutated_row(built, 3, token_ids=tokens)  # a dead branch is verified too
    _rejected(verify_and_linearize(built.receipt, rows), "digest_mismatch")


def test_digest_mismatch_when_a_logprob_changes_by_one_ulp(built: Built) -> None:
    row = built.rows()[0]
    logprobs = row.logprobs.copy()
    logprobs[-1] = np.nextafter(logprobs[-1], np.float32(0.0))
    _rejected(
        verify_and_linearize(built.receipt, _mutated_row(built, 0, logprobs=logprobs)),
        "digest_mismatch",
    )


def test_digest_mismatch_when_the_manifest_weight_version_is_edited(built: Built) -> None:
    receipt = _receipt(built)
    rows = built.rows()
    receipt["manifest"][2]["weight_version"] = 99
    rows[2] = with_row(rows[2], metadata={**rows[2].metadata, "weight_version": 99})
    _rejected(verify_and_linearize(receipt, rows), "digest_mismatch")


# ------------------------------------------------------------------ lineage (rebuild) codes


def test_rebuild_failed_missing_terminal(built: Built) -> None:
    receipt = {**_receipt(built), "terminal_model_call_id": "ghost"}
    rejection = _rejected(
        verify_and_linearize(receipt, built.rows()), "rebuild_failed", "missing_terminal"
    )
    assert rejection.reason.startswith("rebuild_failed:missing_terminal: ")


def test_rebuild_failed_missing_parent(built: Built) -> None:
    receipt, rows = forge(built.receipt, built.rows(), 2, parent_call_id="ghost")
    _rejected(verify_and_linearize(receipt, rows), "rebuild_failed", "missing_parent")


def test_rebuild_failed_manifest_order_when_a_child_precedes_its_parent(built: Built) -> None:
    receipt = _receipt(built)
    order = [0, 2, 1, 3]
    receipt["manifest"] = [receipt["manifest"][i] for i in order]
    rows = [built.rows()[i] for i in order]
    _rejected(verify_and_linearize(receipt, rows), "rebuild_failed", "manifest_order")


def test_rebuild_failed_manifest_order_for_a_self_parent(built: Built) -> None:
    receipt, rows = forge(built.receipt, built.rows(), 2, parent_call_id="call02")
    _rejected(verify_and_linearize(receipt, rows), "rebuild_failed", "manifest_order")


def test_rebuild_failed_parent_length_mismatch(built: Built) -> None:
    # call02 continues call01 (cum_len 9); relinking it to call00 (cum_len 5) breaks lengths.
    receipt, rows = forge(built.receipt, built.rows(), 2, parent_call_id="call00")
    _rejected(verify_and_linearize(receipt, rows), "rebuild_failed", "parent_length_mismatch")


def test_rebuild_failed_chain_hash_mismatch_for_a_relink_with_matching_lengths() -> None:
    from capture_support import CallSpec, build_rollout

    # call01 and call02 are both 6 tokens long but differ in content; relinking call03 from
    # call01 to call02 keeps every length consistent, and only the chain hash notices.
    specs = [
        CallSpec(None, [1, 2], [3], [-0.5], 0),
        CallSpec(0, [4], [5, 6], [-0.1, -0.2], 0),
        CallSpec(0, [7], [8, 9], [-0.1, -0.2], 0),
        CallSpec(1, [10], [11], [-1.0], 1),
    ]
    relink = build_rollout(RID, specs, terminal=3)
    receipt, rows = forge(relink.receipt, relink.rows(), 3, parent_call_id="call02")
    _rejected(verify_and_linearize(receipt, rows), "rebuild_failed", "chain_hash_mismatch")


def test_rebuild_failed_chain_hash_mismatch_for_a_forged_chain_hash(built: Built) -> None:
    receipt, rows = forge(built.receipt, built.rows(), 3, chain_hash="ab" * 32)
    _rejected(verify_and_linearize(receipt, rows), "rebuild_failed", "chain_hash_mismatch")


def test_rebuild_failed_cumulative_hash_mismatch(built: Built) -> None:
    receipt, rows = forge(built.receipt, built.rows(), 1, cumulative_hash="cd" * 32)
    _rejected(verify_and_linearize(receipt, rows), "rebuild_failed", "cumulative_hash_mismatch")


# ------------------------------------------------------------------------ the code table


def test_every_code_in_the_table_is_exercised_above() -> None:
    # Keeps this file honest: a new code without an example fails here.
    import inspect
    import sys

    source = inspect.getsource(sys.modules[__name__])
    for code in [*RejectionCode, *RebuildCode]:
        assert f'"{code}"' in source, code


def test_a_rebuild_code_comes_exactly_with_rebuild_failed() -> None:
    with pytest.raises(ValueError, match="rebuild_code"):
        Rejection(code=RejectionCode.REBUILD_FAILED)
    with pytest.raises(ValueError, match="rebuild_code"):
        Rejection(code=RejectionCode.DIGEST_MISMATCH, rebuild_code=RebuildCode.MISSING_PARENT)


def test_the_field_mismatch_codes_are_the_compared_fields() -> None:
    # The codes are an on-disk vocabulary: one per compared header field, no other.
    mismatches = {code for code in RejectionCode if code.endswith("_mismatch")}
    per_field = {RejectionCode.field_mismatch(name) for name in FIELD_MISMATCH_FIELDS}
    others = {
        RejectionCode.IDENTITY_MISMATCH,
        RejectionCode.CALL_ID_MISMATCH,
        RejectionCode.STAGING_KEY_MISMATCH,
        RejectionCode.LENGTH_MISMATCH,
    }
    assert mismatches - others == per_field


def test_never_raises_for_a_store_with_a_missing_partition() -> None:
    result = fetch_and_verify(simple_rollout(RID).receipt, DictDataPlane())
    _rejected(result, "missing_staging_row")
