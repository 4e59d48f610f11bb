"""Receipt assembly (§3.4) and the stored dict form the ledger keeps."""

from __future__ import annotations

import json
from typing import Any

import pytest
from capture_support import simple_rollout

from rollout_recovery.capture import Receipt
from rollout_recovery.capture._receipt import (
    MISSING_TERMINAL_ROW,
    REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES,
    UNDECLARED_TERMINAL,
    CaptureFailure,
    assemble_receipt,
)
from rollout_recovery.errors import InvalidArgumentError, InvalidStateError

RID = "grp1_g0_aabc123"


def test_receipt_layout_satisfies_the_ledger_contract() -> None:
    built = simple_rollout(RID)
    receipt = built.receipt
    assert receipt["rollout_id"] == RID
    assert receipt["terminal_model_call_id"] == "call02"
    assert receipt["terminal_selection"] == "declared"
    assert receipt["capture_poisoned"] is False
    assert receipt["failure_reason"] is None
    # What the ledger checks on seal: a list of dicts, each with a str staging_key.
    assert isinstance(receipt["manifest"], list)
    assert [entry["staging_key"] for entry in receipt["manifest"]] == [
        f"{RID}/call0{i}" for i in range(4)
    ]
    assert all(isinstance(entry, dict) for entry in receipt["manifest"])
    assert json.loads(json.dumps(receipt)) == receipt


def test_assembly_is_deterministic() -> None:
    built = simple_rollout(RID)
    again = assemble_receipt(RID, built.records, terminal_model_call_id="call02").to_dict()
    assert again == built.receipt
    assert json.dumps(again) == json.dumps(built.receipt)


def test_dict_round_trip() -> None:
    receipt = simple_rollout(RID).receipt
    parsed = Receipt.from_dict(receipt)
    assert parsed.to_dict() == receipt
    assert parsed.staging_keys == [entry["staging_key"] for entry in receipt["manifest"]]


def test_duplicate_records_are_dropped_first_wins() -> None:
    records = simple_rollout(RID).records
    receipt = assemble_receipt(
        RID, [*records, records[1], records[0]], terminal_model_call_id="call02"
    ).to_dict()
    assert [e["model_call_id"] for e in receipt["manifest"]] == [
        "call00",
        "call01",
        "call02",
        "call03",
    ]


def test_first_failure_poisons_but_keeps_every_key() -> None:
    records = simple_rollout(RID).records
    receipt = assemble_receipt(
        RID,
        records,
        terminal_model_call_id="call02",
        failures=[
            CaptureFailure(model_call_id="call07", reason="unresolved_parent"),
            CaptureFailure(model_call_id="call08", reason="worker_capture_failed"),
        ],
    ).to_dict()
    assert receipt["capture_poisoned"] is True
    assert receipt["failure_reason"] == "unresolved_parent"
    assert len(receipt["manifest"]) == 4  # the finalizer must still clear these rows


def test_unserved_call_failure_does_not_poison_on_its_own() -> None:
    records = simple_rollout(RID).records
    receipt = assemble_receipt(
        RID,
        records,
        terminal_model_call_id="call02",
        failures=[
            CaptureFailure(model_call_id="c9", reason=REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES)
        ],
    ).to_dict()
    assert receipt["capture_poisoned"] is False


def test_unserved_terminal_is_masked_as_missing_terminal_row() -> None:
    records = simple_rollout(RID).records
    receipt = assemble_receipt(
        RID,
        records,
        terminal_model_call_id="c9",
        failures=[
            CaptureFailure(model_call_id="c9", reason=REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES)
        ],
    ).to_dict()
    assert receipt["capture_poisoned"] is True
    assert receipt["failure_reason"] == MISSING_TERMINAL_ROW
    assert receipt["terminal_model_call_id"] is None


def test_undeclared_terminal_masks() -> None:
    receipt = assemble_receipt(
        RID, simple_rollout(RID).records, terminal_model_call_id=None
    ).to_dict()
    assert receipt["capture_poisoned"] is True
    assert receipt["failure_reason"] == UNDECLARED_TERMINAL


def test_a_rollout_with_no_calls_gives_a_poisoned_empty_receipt() -> None:
    receipt = assemble_receipt(RID, [], terminal_model_call_id="c0").to_dict()
    assert receipt["manifest"] == []
    assert receipt["capture_poisoned"] is True


def test_records_of_another_rollout_are_a_store_bug() -> None:
    other = simple_rollout("grp1_g0_aother").records
    with pytest.raises(InvalidStateError, match="does not belong"):
        assemble_receipt(RID, other, terminal_model_call_id="call02").to_dict()


def test_bad_rollout_id_is_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        assemble_receipt("bad/id", [], terminal_model_call_id=None).to_dict()


def test_reward_is_carried_and_must_be_finite() -> None:
    records = simple_rollout(RID).records
    receipt = assemble_receipt(RID, records, terminal_model_call_id="call02", reward=0.5).to_dict()
    assert receipt["reward"] == 0.5
    with pytest.raises(InvalidStateError, match="finite"):
        assemble_receipt(
            RID, records, terminal_model_call_id="call02", reward=float("inf")
        ).to_dict()


@pytest.mark.parametrize(
    "changes",
    [
        {"terminal_model_call_id": None},
        {"terminal_selection": None},
        {"failure_reason": "x"},
        {"terminal_selection": "guess"},
        {"capture_poisoned": 0},
        {"extra": 1},
    ],
)
def test_state_rules_on_decode(changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidStateError):
        Receipt.from_dict({**simple_rollout(RID).receipt, **changes})


def test_poisoned_receipts_need_no_terminal() -> None:
    receipt = {
        **simple_rollout(RID).receipt,
        "capture_poisoned": True,
        "terminal_model_call_id": None,
        "terminal_selection": None,
        "failure_reason": "worker_capture_failed",
    }
    assert Receipt.from_dict(receipt).capture_poisoned


def test_failure_rows_validate() -> None:
    with pytest.raises(TypeError):
        CaptureFailure(model_call_id="c")  # type: ignore[call-arg]
