"""The simulated backend: normal episodes, and every fault's documented outcome."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rollout_support import TASKS, Rig, failure_of, make_rig, run, snapshot

from rollout_recovery.capture import CaptureWriter, LinearizedRollout, Rejection
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.errors import ConfigError
from rollout_recovery.policy._tasks import ANSWER, DIGIT_BASE, EOS, correct_answer
from rollout_recovery.rewards import RewardChecks
from rollout_recovery.rollout import (
    AttemptResult,
    FailureReason,
    FaultsConfig,
    GenerationBackend,
    SimulatedAgentBackend,
)
from rollout_recovery.rollout._faults import CAPTURE_FAILURE_REASON


def _verify(rig: Rig, result: AttemptResult) -> LinearizedRollout | Rejection:
    return fetch_and_verify(result.receipt, rig.data_plane, expected_rollout_id=result.rollout_id)


def test_the_backend_satisfies_the_protocol() -> None:
    backend: GenerationBackend = make_rig().backend
    assert isinstance(backend, SimulatedAgentBackend)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), idx=st.integers(0, len(TASKS) - 1))
def test_a_normal_attempt_stages_two_calls_and_verifies(seed: int, idx: int) -> None:
    async def main() -> None:
        rig = make_rig(seed=seed)
        weights = snapshot(version=3, seed=seed, spread=2.0)
        rig.backend.update_weights(3, weights)
        request = rig.request(idx)
        result = await rig.backend.run_attempt(request, rig.writer)
        await rig.backend.aclose()

        assert result.rollout_id == request.rollout_id
        assert len(rig.staged_keys(request.rollout_id)) == 2
        assert result.receipt.capture_poisoned is False
        row = _verify(rig, result)
        assert isinstance(row, LinearizedRollout), row
        prompt = TASKS[idx]["prompt_token_ids"]
        assert row.token_ids[: len(prompt)].tolist() == prompt
        assert row.token_ids[-3] == ANSWER and row.token_ids[-1] == EOS
        assert row.min_weight_version == row.max_weight_version == 3
        # The staged logprobs are exactly what the policy recomputes from the row.
        recomputed = weights.token_logprobs(row.token_ids, row.token_mask)
        np.testing.assert_array_equal(recomputed.astype(np.float32), row.logprobs)
        answer = int(row.token_ids[-2]) - DIGIT_BASE
        assert result.reward == float(answer == correct_answer(TASKS[idx]["digit"]))
        assert result.receipt.reward == result.reward
        assert result.mask_sample is False
        assert result.generated_tokens == int(row.token_mask.sum()) == 6
        assert result.reward_checks == RewardChecks(
            duplicated_reasoning=False, empty_final_answer=False, low_effort=False
        )

    run(main)


def test_attempts_are_deterministic_given_seed_and_rollout_id() -> None:
    async def one(seed: int) -> object:
        rig = make_rig(seed=seed)
        result = await rig.backend.run_attempt(rig.request(5, rollout_id="r-1"), rig.writer)
        return result.receipt

    async def main() -> None:
        assert await one(1) == await one(1)
        assert await one(1) != await one(2)

    run(main)


def test_the_staged_version_is_the_snapshot_used_not_the_request_stamp() -> None:
    async def main() -> None:
        rig = make_rig()
        request = rig.request(1)  # stamped with version 0
        rig.backend.update_weights(7, snapshot(version=7))
        result = await rig.backend.run_attempt(request, rig.writer)
        row = _verify(rig, result)
        assert isinstance(row, LinearizedRollout)
        assert request.weight_version == 0 and row.min_weight_version == 7

    run(main)


def test_stage_in_thread_gives_the_same_receipt() -> None:
    async def main() -> None:
        inline, threaded = make_rig(), make_rig(stage_in_thread=True)
        a = await inline.backend.run_attempt(inline.request(2, rollout_id="r"), inline.writer)
        b = await threaded.backend.run_attempt(threaded.request(2, rollout_id="r"), threaded.writer)
        assert a.receipt == b.receipt
        assert isinstance(_verify(threaded, b), LinearizedRollout)

    run(main)


def test_attempt_failure_ends_the_attempt_unsealed_after_the_first_call() -> None:
    async def main() -> None:
        rig = make_rig(FaultsConfig.only(attempt_failure_rate=1.0))
        request = rig.request()
        outcome = await rig.backend.run_attempt(request, rig.writer)
        failure = failure_of(outcome, FailureReason.ATTEMPT_FAILED)
        assert failure.worker is not None and failure.rollout_id == request.rollout_id
        # The first call's row is left behind, referenced by no receipt.
        assert len(rig.staged_keys(request.rollout_id)) == 1
        assert rig.backend.fault_counts["attempt_failed"] == 1

    run(main)


def test_capture_failure_poisons_the_receipt() -> None:
    async def main() -> None:
        rig = make_rig(FaultsConfig.only(capture_failure_rate=1.0))
        request = rig.request()
        result = await rig.backend.run_attempt(request, rig.writer)
        assert result.receipt.capture_poisoned is True
        assert result.receipt.failure_reason == CAPTURE_FAILURE_REASON
        assert len(result.receipt.manifest) == 1
        assert len(rig.staged_keys(request.rollout_id)) == 1
        verdict = _verify(rig, result)
        assert isinstance(verdict, Rejection) and verdict.code == "capture_poisoned"

    run(main)


def test_tamper_is_rejected_at_verification() -> None:
    async def main() -> None:
        rig = make_rig(FaultsConfig.only(tamper_rate=1.0))
        request = rig.request()
        result = await rig.backend.run_attempt(request, rig.writer)
        assert result.receipt.capture_poisoned is False
        assert len(rig.staged_keys(request.rollout_id)) == 2
        verdict = _verify(rig, result)
        assert isinstance(verdict, Rejection), verdict
        assert verdict.code == "digest_mismatch"
        assert rig.backend.fault_counts["tamper"] == 1
        # Only the tokens moved: the header still matches the receipt's record.
        record = result.receipt.manifest[1]
        (row,) = rig.data_plane.get(CaptureWriter.staging_partition, [record.staging_key])
        assert row.metadata["digest"] == record.digest
        assert row.metadata["cumulative_hash"] == record.cumulative_hash

    run(main)


def test_a_hang_waits_until_the_deadline_cancels_it() -> None:
    async def main() -> None:
        rig = make_rig(FaultsConfig.only(hang_rate=1.0))
        task = asyncio.create_task(rig.backend.run_attempt(rig.request(), rig.writer))
        await rig.writer.first_staged.wait()
        # The attempt staged its first call and now hangs: it yields, it never finishes.
        assert not task.done()
        assert rig.backend.fault_counts["hang"] == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        assert rig.backend.worker_load() == {"worker-0": 0}

    run(main)


def test_a_hang_under_asyncio_timeout_raises_timeout_error() -> None:
    async def main() -> None:
        rig = make_rig(FaultsConfig.only(hang_rate=1.0))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await rig.backend.run_attempt(rig.request(), rig.writer)

    run(main)


def test_a_straggler_is_slower_but_succeeds() -> None:
    async def main() -> None:
        rig = make_rig(FaultsConfig.only(straggler_rate=1.0, straggler_factor=3.0))
        result = await rig.backend.run_attempt(rig.request(), rig.writer)
        assert isinstance(_verify(rig, result), LinearizedRollout)
        assert rig.backend.fault_counts["straggler"] == 1

    run(main)


def test_update_weights_refuses_a_mismatch() -> None:
    backend = make_rig().backend
    with pytest.raises(ValueError, match="version"):
        backend.update_weights(2, snapshot(version=1))
    backend.update_weights(1, snapshot(version=1))
    assert backend.weight_version == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"hang_rate": 1.5},
        {"attempt_failure_rate": -0.1},
        {"straggler_factor": 0.5},
        {"worker_restart_s": -1.0},
        {"tamper_rate": float("nan")},
        {"worker_crash_rate": True},
    ],
)
def test_fault_rates_are_refused_once_where_the_config_is_read(bad: dict[str, float]) -> None:
    # The backend takes [faults] as read: a bad value never gets that far.
    (name,) = bad
    with pytest.raises(ConfigError) as refused:
        config_from_builtins({"faults": bad})
    assert refused.value.path == f"$.faults.{name}"


def test_a_prompt_that_does_not_match_its_task_is_a_bug() -> None:
    async def main() -> None:
        rig = make_rig()
        request = rig.request(3)
        wrong = dict(request.prompt, prompt_token_ids=TASKS[4]["prompt_token_ids"] + [1])
        bad = type(request)(
            group_id=request.group_id,
            generation_index=0,
            rollout_id=request.rollout_id,
            prompt=wrong,
            weight_version=0,
        )
        with pytest.raises(ValueError, match="do not match"):
            await rig.backend.run_attempt(bad, rig.writer)

    run(main)
