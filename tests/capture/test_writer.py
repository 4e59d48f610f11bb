"""The capture writer: durable staging before the record, and the contract's input rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from capture_support import DictDataPlane

from rollout_recovery._cut import MutationCut
from rollout_recovery.capture import CaptureWriter
from rollout_recovery.capture._digest import hash_token_ids
from rollout_recovery.capture._records import CallRecord, StagedCallHeader
from rollout_recovery.dataplane._protocol import Row
from rollout_recovery.errors import InvalidArgumentError

RID = "grp_g0_a1"


def _root(writer: CaptureWriter, **overrides: Any) -> CallRecord:
    args: dict[str, Any] = {
        "rollout_id": RID,
        "model_call_id": "c0",
        "parent": None,
        "prompt_token_ids": [1, 2, 3],
        "generated_token_ids": [4, 5],
        "generated_logprobs": [-0.5, -0.25],
        "weight_version": 7,
    }
    args.update(overrides)
    return writer.stage_call(**args)


def test_stages_the_delta_then_returns_a_matching_record() -> None:
    data_plane = DictDataPlane()
    record = _root(CaptureWriter(data_plane))
    assert data_plane.put_log == [(CaptureWriter.staging_partition, (f"{RID}/c0",))]
    (row,) = data_plane.get(CaptureWriter.staging_partition, [record.staging_key])
    assert row.token_ids.dtype == np.int32 and row.token_ids.tolist() == [1, 2, 3, 4, 5]
    assert row.token_mask.dtype == np.float32 and row.token_mask.tolist() == [0, 0, 0, 1, 1]
    assert row.logprobs.dtype == np.float32 and row.logprobs.tolist() == [0, 0, 0, -0.5, -0.25]
    header = StagedCallHeader.from_dict(row.metadata)
    assert header.rollout_id == RID
    assert (record.mode, record.prev_len, record.delta_len, record.cum_len) == ("text", 0, 5, 5)
    assert record.weight_version == 7
    assert header.digest == record.digest
    assert record.cumulative_hash == hash_token_ids([1, 2, 3, 4, 5])


class _FailingPut(DictDataPlane):
    def put(
        self, partition: str, rows: Mapping[str, Row], *, cut: MutationCut | None = None
    ) -> None:
        raise OSError("disk full")


def test_no_record_without_a_durable_row() -> None:
    with pytest.raises(OSError, match="disk full"):
        _root(CaptureWriter(_FailingPut()))


def test_continuation_carries_only_the_new_prompt_tokens() -> None:
    data_plane = DictDataPlane()
    writer = CaptureWriter(data_plane, partition="staging2")
    root = _root(writer)
    child = writer.stage_call(
        rollout_id=RID,
        model_call_id="c1",
        parent=root,
        prompt_token_ids=np.array([1, 2, 3, 4, 5, 6, 7]),
        generated_token_ids=np.array([8]),
        generated_logprobs=np.array([-1.0]),
        weight_version=8,
    )
    assert (child.mode, child.parent_call_id, child.prev_len, child.cum_len) == (
        "token_in",
        "c0",
        5,
        8,
    )
    (row,) = data_plane.get("staging2", [child.staging_key])
    assert row.token_ids.tolist() == [6, 7, 8]
    assert row.token_mask.tolist() == [0, 0, 1]
    assert writer.partition == "staging2"


@pytest.mark.parametrize(
    "prompt",
    [
        pytest.param([1, 2, 3, 4, 9, 6], id="prefix-token-differs"),
        pytest.param([1, 2, 3], id="shorter-than-parent"),
        pytest.param([9, 1, 2, 3, 4, 5], id="shifted"),
    ],
)
def test_continuation_must_begin_with_the_parents_tokens(prompt: list[int]) -> None:
    data_plane = DictDataPlane()
    writer = CaptureWriter(data_plane)
    root = _root(writer)
    with pytest.raises(InvalidArgumentError, match="does not begin with") as info:
        writer.stage_call(
            rollout_id=RID,
            model_call_id="c1",
            parent=root,
            prompt_token_ids=prompt,
            generated_token_ids=[8],
            generated_logprobs=[-1.0],
            weight_version=8,
        )
    assert info.value.path == "$.prompt_token_ids"
    assert data_plane.keys(CaptureWriter.staging_partition) == [root.staging_key]  # nothing staged


def test_parent_must_be_an_other_call_of_the_same_rollout() -> None:
    writer = CaptureWriter(DictDataPlane())
    root = _root(writer)
    for rollout_id, call in (("grp_g0_a2", "c1"), (RID, "c0")):
        with pytest.raises(InvalidArgumentError, match="parent"):
            writer.stage_call(
                rollout_id=rollout_id,
                model_call_id=call,
                parent=root,
                prompt_token_ids=[1, 2, 3, 4, 5],
                generated_token_ids=[8],
                generated_logprobs=[-1.0],
                weight_version=8,
            )


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        ({"generated_token_ids": [], "generated_logprobs": []}, "generated_token_ids"),
        ({"generated_logprobs": [-0.5]}, "generated_logprobs"),
        ({"generated_logprobs": [-0.5, float("nan")]}, "generated_logprobs"),
        ({"generated_logprobs": [-0.5, -1e39]}, "generated_logprobs"),
        ({"generated_token_ids": [4, 2**31]}, "generated_token_ids"),
        ({"prompt_token_ids": [1, -2, 3]}, "prompt_token_ids"),
        ({"prompt_token_ids": [1.0, 2.0]}, "prompt_token_ids"),
        ({"weight_version": True}, "weight_version"),
        ({"weight_version": -1}, "weight_version"),
        ({"rollout_id": "bad/id"}, "rollout_id"),
        ({"model_call_id": ""}, "model_call_id"),
    ],
)
def test_inputs_that_break_the_contract_stage_nothing(overrides: dict[str, Any], path: str) -> None:
    data_plane = DictDataPlane()
    with pytest.raises(InvalidArgumentError) as info:
        _root(CaptureWriter(data_plane), **overrides)
    assert info.value.path == f"$.{path}"
    assert data_plane.put_log == []


def test_root_with_an_empty_prompt_is_allowed() -> None:
    record = _root(CaptureWriter(DictDataPlane()), prompt_token_ids=[])
    assert (record.prev_len, record.delta_len) == (0, 2)


# ------------------------------------------------------------------------------ extras

EXTRAS = {
    "sampling_params": {"max_tokens": 2, "temperature": 1.0, "seed": None},
    "logprob_mode": "raw_logprobs",
    "server": "http://127.0.0.1:8000",
    "weight_version_spans": [{"version": "7", "start": 0, "end": 2}],
    "ignore_eos": True,
}


def test_extras_are_staged_digested_and_verified() -> None:
    from rollout_recovery.capture._extras import EMPTY_EXTRAS_DIGEST, compute_extras_digest
    from rollout_recovery.capture._receipt import assemble_receipt
    from rollout_recovery.capture._verify import verify_and_linearize

    data_plane = DictDataPlane()
    record = _root(CaptureWriter(data_plane), extras=EXTRAS)
    (row,) = data_plane.get(CaptureWriter.staging_partition, [record.staging_key])
    assert row.metadata["extras"] == EXTRAS
    assert record.extras_digest == compute_extras_digest(EXTRAS) != EMPTY_EXTRAS_DIGEST
    receipt = assemble_receipt(RID, [record], terminal_model_call_id="c0")
    assert verify_and_linearize(receipt, [row]).__class__.__name__ == "LinearizedRollout"


def test_a_row_without_extras_keeps_its_old_header() -> None:
    data_plane = DictDataPlane()
    record = _root(CaptureWriter(data_plane))
    (row,) = data_plane.get(CaptureWriter.staging_partition, [record.staging_key])
    assert "extras" not in row.metadata


@pytest.mark.parametrize(
    ("extras", "path"),
    [
        pytest.param({"x": float("inf")}, "$.extras.x", id="infinite-float"),
        pytest.param({"x": (1, 2)}, "$.extras.x", id="tuple"),
        pytest.param({"x": [1, np.int64(2)]}, "$.extras.x[1]", id="numpy-scalar"),
        pytest.param({"x": 2**64}, "$.extras.x", id="int-out-of-range"),
        pytest.param({"x": {1: "a"}}, "$.extras.x", id="non-str-key"),
    ],
)
def test_extras_that_cannot_round_trip_are_refused_and_nothing_is_staged(
    extras: dict[str, Any], path: str
) -> None:
    data_plane = DictDataPlane()
    with pytest.raises(InvalidArgumentError) as caught:
        _root(CaptureWriter(data_plane), extras=extras)
    assert caught.value.path == path
    assert data_plane.put_log == []


def test_check_continuation_refuses_a_prompt_that_does_not_extend_its_parent() -> None:
    data_plane = DictDataPlane()
    writer = CaptureWriter(data_plane)
    root = _root(writer)
    writer.check_continuation(
        rollout_id=RID, model_call_id="c1", parent=root, prompt_token_ids=[1, 2, 3, 4, 5, 9]
    )
    staged_before = list(data_plane.put_log)
    with pytest.raises(InvalidArgumentError) as caught:
        # Re-rendered text that re-tokenized one id differently.
        writer.check_continuation(
            rollout_id=RID, model_call_id="c1", parent=root, prompt_token_ids=[1, 2, 3, 4, 6, 9]
        )
    assert caught.value.path == "$.prompt_token_ids"
    assert data_plane.put_log == staged_before


def _nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


def _self_containing() -> Any:
    loop: list[Any] = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize(
    "extras",
    [
        pytest.param({"x": _nested(63)}, id="deeper-than-row-metadata"),
        pytest.param({"x": _self_containing()}, id="contains-itself"),
        pytest.param({"x": "\ud800"}, id="lone-surrogate"),
        pytest.param({"\udc00": 1}, id="lone-surrogate-key"),
    ],
)
def test_extras_the_store_would_refuse_are_refused_at_staging(extras: dict[str, Any]) -> None:
    data_plane = DictDataPlane()
    with pytest.raises(InvalidArgumentError) as caught:
        _root(CaptureWriter(data_plane), extras=extras)
    assert caught.value.path is not None and caught.value.path.startswith("$.extras")
    assert data_plane.put_log == []


def test_extras_as_deep_as_row_metadata_allows_are_staged_in_a_real_store() -> None:
    from rollout_recovery.dataplane import MemoryDataPlane

    data_plane = MemoryDataPlane()  # validates metadata like every store
    record = _root(CaptureWriter(data_plane), extras={"x": _nested(62)})
    assert data_plane.keys(CaptureWriter.staging_partition) == [record.staging_key]


def test_token_versions_are_staged_as_the_version_spans_extra() -> None:
    data_plane = DictDataPlane()
    record = _root(CaptureWriter(data_plane), extras={"temperature": 1.0}, token_versions=[6, 7])
    (row,) = data_plane.get(CaptureWriter.staging_partition, [record.staging_key])
    assert StagedCallHeader.from_dict(row.metadata).extras == {
        "temperature": 1.0,
        "weight_version_spans": [
            {"version": "6", "start": 0, "end": 1},
            {"version": "7", "start": 1, "end": 2},
        ],
    }


@pytest.mark.parametrize(
    ("versions", "message"),
    [([7], "one entry per generated token"), ([7, 6], "last of token_versions")],
)
def test_token_versions_that_do_not_fit_the_call_are_refused(
    versions: list[int], message: str
) -> None:
    data_plane = DictDataPlane()
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        _root(CaptureWriter(data_plane), token_versions=versions)
    assert caught.value.path == "$.token_versions" and data_plane.put_log == []
