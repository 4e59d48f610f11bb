"""The capture contract through the project's real data planes (memory and SQLite)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from capture_support import Built, CallSpec, rollouts
from hypothesis import given, settings

from rollout_recovery.capture import CaptureWriter, LinearizedRollout, Rejection
from rollout_recovery.capture._receipt import assemble_receipt
from rollout_recovery.capture._records import CallRecord
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.dataplane import DataPlane, MemoryDataPlane, SqliteDataPlane

RID = "grp7_g2_a0f"


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DataPlane]:
    plane: DataPlane = (
        MemoryDataPlane() if request.param == "memory" else SqliteDataPlane(tmp_path / "dp.db")
    )
    yield plane
    plane.close()


def _stage(store: DataPlane, specs: list[CallSpec]) -> list[CallRecord]:
    writer = CaptureWriter(store)
    records: list[CallRecord] = []
    prompts: list[list[int]] = []
    for index, spec in enumerate(specs):
        base = [] if spec.parent is None else prompts[spec.parent]
        prompt = base + spec.carried
        records.append(
            writer.stage_call(
                rollout_id=RID,
                model_call_id=f"c{index}",
                parent=None if spec.parent is None else records[spec.parent],
                prompt_token_ids=prompt,
                generated_token_ids=spec.generated,
                generated_logprobs=spec.logprobs,
                weight_version=spec.weight_version,
            )
        )
        prompts.append(prompt + spec.generated)
    return records


SPECS = [
    CallSpec(None, [1, 2], [3, 4], [-0.5, -0.125], 0),
    CallSpec(0, [5], [6], [-1.0], 1),
    CallSpec(0, [7], [8], [-2.0], 1),
]


def test_round_trip_through_a_real_store(store: DataPlane) -> None:
    records = _stage(store, SPECS)
    receipt = assemble_receipt(RID, records, terminal_model_call_id="c1")
    result = fetch_and_verify(receipt, store, expected_rollout_id=RID)
    assert isinstance(result, LinearizedRollout), result
    assert result.token_ids.tolist() == [1, 2, 3, 4, 5, 6]
    assert result.token_mask.tolist() == [0, 0, 1, 1, 0, 1]
    assert store.keys(CaptureWriter.staging_partition) == [f"{RID}/c0", f"{RID}/c1", f"{RID}/c2"]


def test_missing_row_in_a_real_store_names_the_key(store: DataPlane) -> None:
    records = _stage(store, SPECS)
    store.clear(CaptureWriter.staging_partition, [f"{RID}/c2"])
    receipt = assemble_receipt(RID, records, terminal_model_call_id="c1")
    result = fetch_and_verify(receipt, store)
    assert isinstance(result, Rejection)
    assert result.reason == f"missing_staging_row:{RID}/c2"


def test_sqlite_round_trip_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "dp.db"
    first = SqliteDataPlane(path)
    records = _stage(first, SPECS)
    first.close()
    second = SqliteDataPlane(path)
    receipt = assemble_receipt(RID, records, terminal_model_call_id="c2")
    result = fetch_and_verify(receipt, second)
    second.close()
    assert isinstance(result, LinearizedRollout), result
    assert result.token_ids.tolist() == [1, 2, 3, 4, 7, 8]


def _corrupt_token_blob(path: Path, key: str, *, truncate: bool) -> None:
    # Reaches into the SQLite layout (table ``rows``, column ``token_ids``) on purpose: this
    # is what bit rot or a torn write looks like to the finalizer.
    with sqlite3.connect(path) as raw:
        (blob,) = raw.execute("select token_ids from rows where key = ?", (key,)).fetchone()
        data = bytearray(blob)
        if truncate:
            data = data[:1]
        else:
            data[0] ^= 0x01
        raw.execute("update rows set token_ids = ? where key = ?", (bytes(data), key))


@pytest.mark.parametrize(
    ("truncate", "code"), [(False, "digest_mismatch"), (True, "invalid_staging_row")]
)
def test_a_row_corrupted_on_disk_is_rejected_not_raised(
    tmp_path: Path, truncate: bool, code: str
) -> None:
    path = tmp_path / "dp.db"
    plane = SqliteDataPlane(path)
    records = _stage(plane, SPECS)
    plane.close()
    _corrupt_token_blob(path, f"{RID}/c2", truncate=truncate)  # a dead branch
    plane = SqliteDataPlane(path)
    result = fetch_and_verify(assemble_receipt(RID, records, terminal_model_call_id="c1"), plane)
    plane.close()
    assert isinstance(result, Rejection)
    assert result.code == code, result.reason
    assert f"{RID}/c2" in result.reason


@settings(max_examples=50, deadline=None)
@given(rollouts())
def test_random_rollouts_round_trip_through_the_memory_store(built: Built) -> None:
    plane = MemoryDataPlane()
    keys = [record.staging_key for record in built.records]
    plane.put(CaptureWriter.staging_partition, dict(zip(keys, built.rows(), strict=True)))
    result = fetch_and_verify(built.receipt, plane)
    assert isinstance(result, LinearizedRollout), result
    assert result.token_ids.tolist() == built.expected_tokens
    assert result.logprobs.tolist() == built.expected_logprobs
