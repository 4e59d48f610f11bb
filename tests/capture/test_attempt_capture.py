"""One attempt's capture: calls staged in order, each continuing the last, then its receipt
(what ``run_episode`` stages through)."""

from __future__ import annotations

import asyncio

import pytest
from capture_support import DictDataPlane

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.capture._writer import AttemptCapture
from rollout_recovery.errors import InvalidArgumentError

RID = "grp_g0_a1"


def _two_calls(in_thread: bool) -> tuple[CaptureWriter, DictDataPlane, AttemptCapture]:
    plane = DictDataPlane()
    writer = CaptureWriter(plane)
    attempt = writer.attempt(RID)

    async def go() -> None:
        attempt.check_next("c0", [1, 2])  # the first call extends nothing
        await attempt.stage(
            "c0",
            prompt_token_ids=[1, 2],
            generated_token_ids=[3],
            generated_logprobs=[-0.5],
            weight_version=4,
            in_thread=in_thread,
        )
        attempt.check_next("c1", [1, 2, 3, 9])
        await attempt.stage(
            "c1",
            prompt_token_ids=[1, 2, 3, 9],
            generated_token_ids=[5, 6],
            generated_logprobs=[-0.25, -0.125],
            weight_version=5,
            in_thread=in_thread,
        )

    asyncio.run(go())
    return writer, plane, attempt


@pytest.mark.parametrize("in_thread", [False, True])
def test_the_receipt_chains_the_calls_and_names_the_last_terminal(in_thread: bool) -> None:
    _, plane, attempt = _two_calls(in_thread)
    assert attempt.calls == 2
    receipt = attempt.receipt(reward=1.0)
    assert [call.model_call_id for call in receipt.manifest] == ["c0", "c1"]
    assert receipt.manifest[1].parent_call_id == "c0"
    assert receipt.terminal_model_call_id == "c1" and not receipt.capture_poisoned
    assert plane.keys(CaptureWriter.staging_partition) == [f"{RID}/c0", f"{RID}/c1"]


def test_a_failed_call_poisons_a_receipt_that_still_lists_every_staged_call() -> None:
    _, _, attempt = _two_calls(False)
    receipt = attempt.failed_receipt("c2", "data_error:token_mismatch")
    assert receipt.capture_poisoned and receipt.failure_reason == "data_error:token_mismatch"
    assert [call.model_call_id for call in receipt.manifest] == ["c0", "c1"]


def test_a_next_prompt_that_does_not_extend_the_last_call_is_refused_before_sending() -> None:
    _, plane, attempt = _two_calls(False)
    with pytest.raises(InvalidArgumentError, match="prompt does not begin"):
        attempt.check_next("c2", [1, 2, 7])
    assert len(plane.keys(CaptureWriter.staging_partition)) == 2
