"""The episode, written once: multi-call episodes, and continuing a lost attempt's calls."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from rollout_support import TASKS, run, snapshot

from rollout_recovery.capture import (
    CaptureWriter,
    LinearizedRollout,
    StagedPrefix,
)
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.errors import GenerationError
from rollout_recovery.policy import PolicySnapshot, TaskConfig
from rollout_recovery.policy._tasks import ANSWER, THINK
from rollout_recovery.rollout import (
    AttemptFailure,
    AttemptRequest,
    AttemptResult,
    Completion,
    FailureReason,
    Sampling,
    run_episode,
)
from rollout_recovery.rollout._digit_task import DigitTask
from rollout_recovery.rollout._wire import DataError, DataFailure


class PolicyClient:
    """The numpy policy as a model client, failing (infra) at call ``fail_at``."""

    def __init__(self, weights: PolicySnapshot, *, seed: int, fail_at: int | None = None):
        self.weights = weights
        self.rng = np.random.default_rng(seed)
        self.fail_at = fail_at
        self.prompts: list[list[int]] = []

    async def generate(
        self, prompt_ids: Sequence[int], *, call_id: str, sampling: Sampling
    ) -> Completion:
        if len(self.prompts) == self.fail_at:
            raise GenerationError(FailureReason.WORKER_CRASHED, f"lost at {call_id}")
        self.prompts.append(list(prompt_ids))
        tokens, logprobs = self.weights.sample_continuation(
            prompt_ids, sampling.max_tokens, self.rng
        )
        return Completion(
            token_ids=tokens,
            logprobs=logprobs,
            weight_version=self.weights.version,
            extras={"call": call_id},
        )


def request(idx: int, attempt: str, *, index: int = 0) -> AttemptRequest:
    return AttemptRequest(
        group_id=f"grp{idx}",
        generation_index=index,
        rollout_id=f"grp{idx}_g{index}_a{attempt}",
        prompt=TASKS[idx],
        weight_version=0,
    )


def staged(store: MemoryDataPlane, rollout_id: str) -> list[str]:
    return [
        k for k in store.keys(CaptureWriter.staging_partition) if k.startswith(rollout_id + "/")
    ]


def prefix_of(store: MemoryDataPlane, rollout_id: str) -> StagedPrefix:
    found = StagedPrefix.read(store, rollout_id, staged(store, rollout_id))
    assert isinstance(found, StagedPrefix), found
    return found


async def episode(
    store: MemoryDataPlane,
    req: AttemptRequest,
    client: PolicyClient,
    task: DigitTask,
    prefix: StagedPrefix | None = None,
) -> AttemptResult:
    return await run_episode(req, CaptureWriter(store), task=task, client=client, prefix=prefix)


@settings(max_examples=20, deadline=None)
@given(
    thinking=st.integers(1, 4),
    tokens=st.integers(1, 5),
    idx=st.integers(0, len(TASKS) - 1),
    seed=st.integers(0, 2**20),
)
def test_an_episode_thinks_in_several_calls_then_answers(
    thinking: int, tokens: int, idx: int, seed: int
) -> None:
    async def main() -> None:
        store, weights = MemoryDataPlane(), snapshot(version=2, seed=seed, spread=2.0)
        client = PolicyClient(weights, seed=seed)
        task = DigitTask(TASKS, TaskConfig(reasoning_tokens=tokens, thinking_calls=thinking))
        result = await episode(store, request(idx, "1"), client, task)

        assert len(result.receipt.manifest) == thinking + 1
        assert result.generated_tokens == thinking * tokens + 2
        row = fetch_and_verify(result.receipt, store)
        assert isinstance(row, LinearizedRollout), row
        # Token in, token out: each prompt is the previous call's whole sequence + a tag.
        prompts = client.prompts
        assert prompts[0] == TASKS[idx]["prompt_token_ids"]
        assert [p[-1] for p in prompts] == [THINK] * thinking + [ANSWER]
        for before, after in itertools.pairwise(prompts):
            assert after[: len(before)] == before and len(after) == len(before) + tokens + 1
        recomputed = weights.token_logprobs(row.token_ids, row.token_mask)
        np.testing.assert_array_equal(recomputed.astype(np.float32), row.logprobs)
        assert result.inherited_calls == 0 and result.resume_refused is None

    run(main)


@settings(max_examples=25, deadline=None)
@given(
    thinking=st.integers(1, 4),
    lost_at=st.integers(1, 5),
    idx=st.integers(0, len(TASKS) - 1),
    seed=st.integers(0, 2**20),
)
def test_a_lost_attempt_is_continued_from_its_last_staged_call(
    thinking: int, lost_at: int, idx: int, seed: int
) -> None:
    """Attempt 1 is lost after staging ``k`` calls; attempt 2 generates only the rest and
    its receipt covers every call, the first ``k`` token-exact copies of attempt 1's."""
    staged_calls = min(lost_at, thinking + 1)

    async def main() -> None:
        store, weights = MemoryDataPlane(), snapshot(version=1, seed=seed)
        task = DigitTask(TASKS, TaskConfig(reasoning_tokens=3, thinking_calls=thinking))
        first = request(idx, "1")
        lost = PolicyClient(weights, seed=seed, fail_at=staged_calls)
        if staged_calls <= thinking:
            failed = await episode(store, first, lost, task)
            assert isinstance(failed, AttemptFailure)
            assert failed.reason is FailureReason.WORKER_CRASHED, failed
            assert failed.rollout_id == first.rollout_id and "lost at" in failed.detail
        else:  # every call staged, the attempt lost before it returned its receipt
            await episode(store, first, lost, task)
        prefix = prefix_of(store, first.rollout_id)
        assert len(prefix.calls) == staged_calls

        second = request(idx, "2")
        client = PolicyClient(weights, seed=seed + 1)
        result = await episode(store, second, client, task, prefix)

        assert len(client.prompts) == thinking + 1 - staged_calls
        assert result.inherited_calls == staged_calls
        assert result.inherited_tokens == prefix.tokens
        assert result.resume_refused is None
        manifest = result.receipt.manifest
        assert len(manifest) == thinking + 1
        assert all(c.staging_key.startswith(second.rollout_id + "/") for c in manifest)
        row = fetch_and_verify(result.receipt, store, expected_rollout_id=second.rollout_id)
        assert isinstance(row, LinearizedRollout), row
        continued = prefix_of(store, second.rollout_id)
        for old, new in zip(prefix.calls, continued.calls, strict=False):
            assert new.prompt_token_ids.tolist() == old.prompt_token_ids.tolist()
            assert new.token_ids.tolist() == old.token_ids.tolist()
            assert new.logprobs.tolist() == old.logprobs.tolist()
            assert new.extras == {**(old.extras or {}), "resumed_from": old.staging_key}
        if client.prompts:  # the first new call continues the last inherited one exactly
            last = prefix.calls[-1]
            carried = [*last.prompt_token_ids.tolist(), *last.token_ids.tolist()]
            assert client.prompts[0][: len(carried)] == carried

    run(main)


def test_a_prefix_of_another_sibling_is_not_used_and_the_result_says_so() -> None:
    async def main() -> None:
        store, weights = MemoryDataPlane(), snapshot()
        task = DigitTask(TASKS, TaskConfig(thinking_calls=2, reasoning_tokens=4))
        other = request(3, "1", index=1)
        failed = await episode(store, other, PolicyClient(weights, seed=0, fail_at=2), task)
        assert isinstance(failed, AttemptFailure)
        client = PolicyClient(weights, seed=1)
        result = await episode(
            store, request(3, "2"), client, task, prefix_of(store, other.rollout_id)
        )
        assert len(client.prompts) == 3 and result.inherited_calls == 0
        assert result.resume_refused is not None and "foreign" in result.resume_refused
        assert isinstance(fetch_and_verify(result.receipt, store), LinearizedRollout)

    run(main)


def test_a_prefix_the_episode_does_not_ask_for_starts_over() -> None:
    """Calls staged under another episode shape (one thinking call, then the answer) do
    not fit an episode that thinks twice: the second call's prompt differs."""

    async def main() -> None:
        store, weights = MemoryDataPlane(), snapshot()
        first = request(4, "1")
        await episode(
            store,
            first,
            PolicyClient(weights, seed=0),
            DigitTask(TASKS, TaskConfig(thinking_calls=1, reasoning_tokens=4)),
        )
        client = PolicyClient(weights, seed=1)
        task = DigitTask(TASKS, TaskConfig(thinking_calls=2, reasoning_tokens=4))
        result = await episode(
            store, request(4, "2"), client, task, prefix_of(store, first.rollout_id)
        )
        assert len(client.prompts) == 3 and result.inherited_calls == 0
        assert result.resume_refused is not None and "another prompt" in result.resume_refused

    run(main)


def test_a_data_failure_seals_a_poisoned_receipt_listing_every_staged_call() -> None:
    class Refusing(PolicyClient):
        async def generate(self, prompt_ids: Sequence[int], **call: Any) -> Completion:
            if len(self.prompts) == 2:
                raise DataFailure(
                    DataError.HTTP_REFUSED, "refused", blames_server=False, status=400
                )
            return await super().generate(prompt_ids, **call)

    async def main() -> None:
        store = MemoryDataPlane()
        task = DigitTask(TASKS, TaskConfig(thinking_calls=3, reasoning_tokens=4))
        result = await episode(store, request(1, "1"), Refusing(snapshot(), seed=0), task)
        assert result.receipt.capture_poisoned is True
        assert result.receipt.failure_reason == "data_error:http_400"
        assert len(result.receipt.manifest) == 2
        assert result.mask_sample is True and result.reward == 0.0

    run(main)
