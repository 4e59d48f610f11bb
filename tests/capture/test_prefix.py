"""Reading a lost attempt's staged calls back: all or nothing, every check a receipt gets."""

from __future__ import annotations

import numpy as np
from capture_support import PREFIX_PROMPT, stage_chain
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_recovery.capture import CaptureWriter, Rejection, StagedPrefix
from rollout_recovery.capture._records import CallRecord
from rollout_recovery.dataplane import MemoryDataPlane, Row
from rollout_recovery.rollout._faults import _tamper as tamper

ROLLOUT = "g1_g0_aaa"
PROMPT = PREFIX_PROMPT


def stage(store: MemoryDataPlane, calls: int, *, rollout: str = ROLLOUT) -> list[CallRecord]:
    return stage_chain(store, rollout, list(range(calls)))


def keys(store: MemoryDataPlane, rollout: str = ROLLOUT) -> list[str]:
    return [k for k in store.keys(CaptureWriter.staging_partition) if k.startswith(rollout + "/")]


def test_a_chain_comes_back_call_by_call() -> None:
    store = MemoryDataPlane()
    stage(store, 3)
    prefix = StagedPrefix.read(store, ROLLOUT, list(reversed(keys(store))))
    assert isinstance(prefix, StagedPrefix), prefix
    assert [c.model_call_id for c in prefix.calls] == ["c0", "c1", "c2"]
    assert prefix.calls[0].prompt_token_ids.tolist() == PROMPT
    assert prefix.calls[1].prompt_token_ids.tolist() == [*PROMPT, 10, 11, 12, 9]
    assert prefix.calls[2].token_ids.tolist() == [16, 17, 18]
    assert prefix.calls[2].logprobs.tolist() == [-0.5, -1.5, -2.5]
    assert prefix.weight_versions == [0, 1, 2] and prefix.tokens == 9
    assert prefix.calls[1].extras == {"call": 1}
    assert prefix.truncated(1).staging_keys == [f"{ROLLOUT}/c0"]


def test_nothing_staged_is_an_empty_prefix() -> None:
    prefix = StagedPrefix.read(MemoryDataPlane(), ROLLOUT, [])
    assert isinstance(prefix, StagedPrefix) and prefix.calls == ()


@settings(max_examples=40, deadline=None)
@given(
    calls=st.integers(1, 4),
    data=st.data(),
)
def test_any_altered_token_logprob_or_header_is_refused(calls: int, data: st.DataObject) -> None:
    store = MemoryDataPlane()
    stage(store, calls)
    key = data.draw(st.sampled_from(keys(store)))
    (row,) = store.get(CaptureWriter.staging_partition, [key])
    what = data.draw(st.sampled_from(["token", "logprob", "version", "extras"]))
    token_ids, logprobs, metadata = row.token_ids.copy(), row.logprobs.copy(), dict(row.metadata)
    position = data.draw(st.integers(0, len(token_ids) - 1))
    if what == "token":
        token_ids[position] += 1
    elif what == "logprob":
        logprobs[-1] -= 0.25
    elif what == "version":
        metadata["weight_version"] = metadata["weight_version"] + 1
    else:
        metadata["extras"] = {"call": "forged"}
    store.put(
        CaptureWriter.staging_partition,
        {
            key: Row(
                token_ids=token_ids, token_mask=row.token_mask, logprobs=logprobs, metadata=metadata
            )
        },
    )
    found = StagedPrefix.read(store, ROLLOUT, keys(store))
    assert isinstance(found, Rejection), what


def test_a_tampered_row_is_refused_as_a_digest_mismatch() -> None:
    store = MemoryDataPlane()
    stage(store, 2)
    tamper(store, CaptureWriter.staging_partition, f"{ROLLOUT}/c1")  # the simulated tamper fault
    found = StagedPrefix.read(store, ROLLOUT, keys(store))
    assert isinstance(found, Rejection) and found.code == "digest_mismatch", found


def test_a_missing_middle_call_breaks_the_chain() -> None:
    store = MemoryDataPlane()
    stage(store, 3)
    store.clear(CaptureWriter.staging_partition, [f"{ROLLOUT}/c1"])
    found = StagedPrefix.read(store, ROLLOUT, keys(store))
    assert isinstance(found, Rejection) and found.rebuild_code == "missing_parent", found


def test_a_listed_key_that_is_gone_is_a_missing_row() -> None:
    store = MemoryDataPlane()
    stage(store, 2)
    found = StagedPrefix.read(store, ROLLOUT, [*keys(store), f"{ROLLOUT}/c9"])
    assert isinstance(found, Rejection) and found.code == "missing_staging_row", found


def test_a_row_of_another_rollout_is_foreign() -> None:
    store = MemoryDataPlane()
    stage(store, 2)
    stage(store, 1, rollout="g1_g1_abb")
    (row,) = store.get(CaptureWriter.staging_partition, ["g1_g1_abb/c0"])
    # The other attempt's row, filed under this attempt's key.
    store.put(CaptureWriter.staging_partition, {f"{ROLLOUT}/c5": row})
    found = StagedPrefix.read(store, ROLLOUT, keys(store))
    assert isinstance(found, Rejection) and found.code == "identity_mismatch", found
    listed = StagedPrefix.read(store, ROLLOUT, ["g1_g1_abb/c0"])
    assert isinstance(listed, Rejection) and listed.code == "identity_mismatch"


def test_two_calls_continuing_one_parent_are_not_a_prefix() -> None:
    store = MemoryDataPlane()
    records = stage(store, 2)
    CaptureWriter(store).stage_call(
        rollout_id=ROLLOUT,
        model_call_id="c1b",
        parent=records[0],
        prompt_token_ids=[*PROMPT, 10, 11, 12, 9, 9],
        generated_token_ids=[7],
        generated_logprobs=[-1.0],
        weight_version=1,
    )
    found = StagedPrefix.read(store, ROLLOUT, keys(store))
    assert isinstance(found, Rejection) and found.rebuild_code == "manifest_order", found


def test_rows_are_fresh_arrays() -> None:
    store = MemoryDataPlane()
    stage(store, 1)
    prefix = StagedPrefix.read(store, ROLLOUT, keys(store))
    assert isinstance(prefix, StagedPrefix)
    prefix.calls[0].token_ids[0] = 99
    again = StagedPrefix.read(store, ROLLOUT, keys(store))
    assert isinstance(again, StagedPrefix)
    assert again.calls[0].token_ids[0] == 10
    assert np.asarray(again.calls[0].token_ids).dtype == np.int32
