"""Grading an episode: awaited grades, and a failed reward sealed as a failed attempt."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest

from rollout_recovery.capture import CaptureWriter, Rejection
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.errors import RewardFunctionError
from rollout_recovery.rewards import RewardChecks
from rollout_recovery.rollout import (
    AttemptRequest,
    AttemptResult,
    Completion,
    Sampling,
    Turn,
    run_episode,
)

Grade = Callable[
    [], "tuple[float, RewardChecks | None] | Awaitable[tuple[float, RewardChecks | None]]"
]


class OneCall:
    """One call, then ``grade``."""

    def __init__(self, grade: Grade) -> None:
        self._grade = grade
        self._done = False

    def next_turn(self) -> Turn | None:
        if self._done:
            return None
        return Turn(kind="gen", prompt_ids=[1, 2, 3], sampling=Sampling(max_tokens=2))

    def observe(self, completion: Completion) -> None:
        self._done = True

    def grade(self) -> Any:
        return self._grade()


class Task:
    def __init__(self, grade: Grade) -> None:
        self._grade = grade

    def episode(self, prompt: Mapping[str, Any]) -> OneCall:
        return OneCall(self._grade)


class Client:
    async def generate(
        self, prompt_ids: Sequence[int], *, call_id: str, sampling: Sampling
    ) -> Completion:
        return Completion(token_ids=[7, 8], logprobs=[-0.5, -0.25], weight_version=0)


def _attempt(grade: Grade) -> tuple[AttemptResult, MemoryDataPlane]:
    store = MemoryDataPlane()
    request = AttemptRequest(
        group_id="g1", generation_index=0, rollout_id="g1_g0_a1", prompt={}, weight_version=0
    )

    async def main() -> Any:
        return await run_episode(request, CaptureWriter(store), task=Task(grade), client=Client())

    result = asyncio.run(main())
    assert isinstance(result, AttemptResult)
    return result, store


def test_an_awaitable_grade_is_awaited() -> None:
    async def later() -> tuple[float, RewardChecks | None]:
        await asyncio.sleep(0)
        return 0.75, None

    result, _ = _attempt(later)
    assert result.reward == 0.75 and not result.mask_sample
    assert not result.receipt.capture_poisoned


@pytest.mark.parametrize("awaited", [False, True])
@pytest.mark.parametrize(
    "reason", ["reward_raised", "reward_not_finite", "reward_not_a_number", "reward_timeout"]
)
def test_a_failed_reward_seals_a_failed_attempt_that_says_why(reason: str, awaited: bool) -> None:
    def fail() -> tuple[float, RewardChecks | None]:
        raise RewardFunctionError(reason, "what the function did")

    async def fail_later() -> tuple[float, RewardChecks | None]:
        fail()
        raise AssertionError("unreachable")

    result, store = _attempt(fail_later if awaited else fail)
    # Sealed (not an AttemptFailure to retry), masked, with the reason on its receipt.
    assert result.mask_sample and result.reward == 0.0
    receipt = result.receipt
    assert receipt.capture_poisoned and receipt.failure_reason == f"data_error:{reason}"
    # Its staged call is listed, so finalization clears the row with it.
    assert len(receipt.manifest) == 1
    verdict = fetch_and_verify(result.receipt, store)
    assert isinstance(verdict, Rejection) and verdict.code == "capture_poisoned"
    assert reason in verdict.reason
