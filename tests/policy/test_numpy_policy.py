"""The snapshot: sampled logprobs equal the recomputation on the finalized row, exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_support import REASONING_TOKENS, direct_episode, staged_episode

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.policy import PolicySnapshot, TaskSet
from rollout_recovery.policy._numpy_policy import (
    KIND_ANSWER,
    KIND_FIXED,
    KIND_PROMPT,
    KIND_THOUGHT,
    PARAM_SHAPES,
    initial_params,
    row_token_contexts,
)
from rollout_recovery.policy._tasks import (
    ANSWER,
    BOS,
    DIGIT_BASE,
    EOS,
    THINK,
    THOUGHT_BASE,
    correct_answer,
)


def _snapshot(seed: int, spread: float = 2.0, version: int = 0) -> PolicySnapshot:
    # Far from uniform, so a logprob read from the wrong table or row would differ.
    return PolicySnapshot(version, initial_params(seed, spread))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), idx=st.integers(0, 99))
def test_sampled_logprobs_equal_the_recomputation_on_the_linearized_row(
    seed: int, idx: int
) -> None:
    snapshot = _snapshot(seed)
    task = TaskSet(100, seed=seed, prompt_group_every=3)[idx]
    data_plane = MemoryDataPlane()
    row, reward = staged_episode(
        snapshot,
        task,
        np.random.default_rng(seed),
        CaptureWriter(data_plane),
        data_plane,
        "r0",
    )
    prompt = task["prompt_token_ids"]
    # The finalized row: prompt, thoughts, the carried ANSWER tag, answer digit, EOS.
    n = len(prompt)
    assert row.token_ids[:n].tolist() == prompt
    assert row.token_ids[n + REASONING_TOKENS] == ANSWER and row.token_ids[-1] == EOS
    expected_mask = [0.0] * n + [1.0] * REASONING_TOKENS + [0.0, 1.0, 1.0]
    assert row.token_mask.tolist() == expected_mask

    recomputed = snapshot.token_logprobs(row.token_ids, row.token_mask)
    assert recomputed.dtype == np.float64
    np.testing.assert_array_equal(recomputed.astype(np.float32), row.logprobs)
    assert (recomputed[row.token_mask == 0.0] == 0.0).all()
    # The answer token carries real probability mass, and EOS none to learn.
    assert recomputed[-2] < 0.0 and recomputed[-1] == 0.0
    assert reward == float(row.token_ids[-2] - DIGIT_BASE == correct_answer(task["digit"]))
    # The hand-built row of the learning test is this very row.
    direct, direct_reward = direct_episode(snapshot, task, np.random.default_rng(seed))
    np.testing.assert_array_equal(direct.token_ids, row.token_ids)
    np.testing.assert_array_equal(direct.token_mask, row.token_mask)
    np.testing.assert_array_equal(direct.logprobs, row.logprobs)
    assert direct_reward == reward


def test_another_snapshot_recomputes_different_logprobs() -> None:
    # The exactness check above could pass vacuously if token_logprobs ignored the params.
    data_plane = MemoryDataPlane()
    task = TaskSet(10, seed=0, prompt_group_every=1)[0]
    row, _ = staged_episode(
        _snapshot(1), task, np.random.default_rng(0), CaptureWriter(data_plane), data_plane, "r"
    )
    other = _snapshot(2).token_logprobs(row.token_ids, row.token_mask)
    assert not np.array_equal(other.astype(np.float32), row.logprobs)


def test_contexts_come_from_the_row_alone() -> None:
    ids = [BOS, DIGIT_BASE + 6, THINK, THOUGHT_BASE + 2, ANSWER, DIGIT_BASE + 5, EOS]
    mask = [0, 0, 0, 1, 0, 1, 1]
    digit, kinds, columns = row_token_contexts(ids, mask)
    assert digit == 6
    assert kinds.tolist() == [KIND_PROMPT] * 3 + [
        KIND_THOUGHT,
        KIND_PROMPT,
        KIND_ANSWER,
        KIND_FIXED,
    ]
    assert columns.tolist() == [0, 0, 0, 2, 0, 5, 0]
    snapshot = _snapshot(3)
    lps = snapshot.token_logprobs(ids, mask)
    assert lps[3] == snapshot.thought_logprobs[6, 2]
    assert lps[5] == snapshot.answer_logprobs[6, 5]


@pytest.mark.parametrize(
    ("ids", "mask", "match"),
    [
        ([BOS, DIGIT_BASE, THINK, BOS], [0, 0, 0, 1], "not an action"),
        ([BOS, THINK, THOUGHT_BASE], [0, 0, 1], "no digit"),
        ([BOS, DIGIT_BASE, THOUGHT_BASE], [0, 0], "equal length"),
        ([BOS, DIGIT_BASE, THOUGHT_BASE], [0, 0, 0.5], "only 0.0 and 1.0"),
    ],
)
def test_rows_this_policy_cannot_have_produced_are_refused(
    ids: list[int], mask: list[float], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        _snapshot(0).token_logprobs(ids, mask)


def test_a_snapshot_is_immutable_and_detached_from_its_source() -> None:
    params = initial_params(0, 1.0)
    snapshot = PolicySnapshot(4, params)
    before = snapshot.params["answer_logits"].copy()
    params["answer_logits"][:] = 0.0
    np.testing.assert_array_equal(snapshot.params["answer_logits"], before)
    with pytest.raises(ValueError):
        snapshot.params["answer_logits"][0, 0] = 1.0
    with pytest.raises(ValueError):
        snapshot.answer_logprobs[0, 0] = 1.0
    with pytest.raises(TypeError):
        snapshot.params["answer_logits"] = before  # type: ignore[index]
    assert snapshot.version == 4


def test_snapshot_refuses_bad_params() -> None:
    good = initial_params(0, 0.0)
    with pytest.raises(ValueError, match="keys"):
        PolicySnapshot(0, {"answer_logits": good["answer_logits"]})
    with pytest.raises(ValueError, match="thought_logits"):
        PolicySnapshot(0, {**good, "thought_logits": np.zeros((2, 2))})
    with pytest.raises(ValueError, match="answer_logits"):
        PolicySnapshot(0, {**good, "answer_logits": np.full(PARAM_SHAPES["answer_logits"], np.nan)})
    with pytest.raises(ValueError, match="version"):
        PolicySnapshot(-1, good)


def test_sampling_follows_the_table() -> None:
    # A table with one dominant answer must produce it, with its logprob reported.
    params = initial_params(0, 0.0)
    params["answer_logits"][3, 8] = 50.0
    snapshot = PolicySnapshot(0, params)
    rng = np.random.default_rng(0)
    for _ in range(20):
        tokens, lps = snapshot.sample_answer(3, rng)
        assert tokens == [DIGIT_BASE + 8, EOS]
        assert lps == [float(snapshot.answer_logprobs[3, 8]), 0.0]
    # A uniform table reaches every thought token.
    seen = set(snapshot.sample_reasoning(0, 400, rng)[0])
    assert seen == set(range(THOUGHT_BASE, THOUGHT_BASE + PARAM_SHAPES["thought_logits"][1]))
    uniform = PolicySnapshot(0, initial_params(0, 0.0))
    assert uniform.expected_accuracy() == pytest.approx(0.1)
    assert snapshot.expected_accuracy() == pytest.approx(0.09)  # 8 is wrong for digit 3
    params["answer_logits"][3, correct_answer(3)] = 100.0
    assert PolicySnapshot(0, params).expected_accuracy() == pytest.approx(0.19)
