"""The synthetic task set: deterministic payloads of the documented shape, and render."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery.policy import TaskSet
from rollout_recovery.policy._tasks import (
    ANSWER,
    ANSWER_TOKENS,
    BOS,
    DIGIT_BASE,
    EOS,
    FILLER_BASE,
    NUM_DIGITS,
    THINK,
    THOUGHT_BASE,
    VOCAB_SIZE,
    correct_answer,
    prompt_digit,
    render,
)

SIZE = 1_000


@given(seed=st.integers(0, 2**32), idx=st.integers(0, SIZE - 1), every=st.integers(1, 9))
def test_same_idx_gives_an_equal_payload_of_the_documented_shape(
    seed: int, idx: int, every: int
) -> None:
    first = TaskSet(SIZE, seed=seed, prompt_group_every=every)[idx]
    # A second, independent instance: nothing may depend on read order or instance state.
    again = TaskSet(SIZE, seed=seed, prompt_group_every=every)[idx]
    assert first == again
    assert first is not again and first["prompt_token_ids"] is not again["prompt_token_ids"]

    assert first["idx"] == idx
    assert first["task_name"] is None
    assert first["task_source"] == ("atomic" if idx % every == 0 else "arith")
    prompt = first["prompt_token_ids"]
    assert all(type(t) is int and 0 <= t < VOCAB_SIZE for t in prompt)
    assert prompt[0] == BOS and prompt[-1] == THINK
    digits = [t for t in prompt if DIGIT_BASE <= t < DIGIT_BASE + NUM_DIGITS]
    assert digits == [DIGIT_BASE + first["digit"]]
    assert all(t >= FILLER_BASE for t in prompt[1:-1] if t not in digits)
    assert prompt_digit(prompt) == first["digit"]
    assert first["answer"] == correct_answer(first["digit"])
    assert first["messages"] == [{"role": "user", "content": render(prompt)}]


def test_mutating_a_payload_does_not_leak_into_the_next_read() -> None:
    tasks = TaskSet(10, seed=3, prompt_group_every=2)
    payload = tasks[4]
    payload["prompt_token_ids"].append(99)
    payload["messages"][0]["content"] = "changed"
    assert tasks[4] == TaskSet(10, seed=3, prompt_group_every=2)[4]
    assert tasks[4]["messages"][0]["content"] != "changed"


def test_digits_cover_every_value_and_depend_on_the_seed() -> None:
    digits_a = [TaskSet(200, seed=1, prompt_group_every=1)[i]["digit"] for i in range(200)]
    digits_b = [TaskSet(200, seed=2, prompt_group_every=1)[i]["digit"] for i in range(200)]
    assert set(digits_a) == set(range(NUM_DIGITS))
    assert digits_a != digits_b


def test_the_answer_rule_is_a_bijection() -> None:
    assert sorted(correct_answer(d) for d in range(NUM_DIGITS)) == list(range(NUM_DIGITS))
    assert correct_answer(0) == 7 and correct_answer(1) == 0


def test_len_bounds_and_bad_arguments() -> None:
    tasks = TaskSet(5, seed=0, prompt_group_every=3)
    assert len(tasks) == 5
    with pytest.raises(IndexError):
        tasks[5]
    with pytest.raises(IndexError):
        tasks[-1]
    with pytest.raises(TypeError):
        tasks["1"]  # type: ignore[index]
    for bad in ({"size": 0}, {"seed": -1}, {"prompt_group_every": 0}):
        kwargs = {"size": 5, "seed": 0, "prompt_group_every": 1, **bad}
        with pytest.raises(ValueError):
            TaskSet(kwargs.pop("size"), **kwargs)


def test_render_names_every_token_kind() -> None:
    ids = [BOS, FILLER_BASE + 3, DIGIT_BASE + 5, THINK, THOUGHT_BASE, ANSWER, DIGIT_BASE, EOS]
    assert render(ids) == "<bos> w3 5 <think> hmm <answer> 0 <eos>"
    assert render([VOCAB_SIZE]) == f"<unk:{VOCAB_SIZE}>"
    assert render([]) == ""


def test_an_episode_asks_for_thinking_and_the_answer_without_knowing_the_ids() -> None:
    assert TaskSet.thinking_prompt([5, 6]) == [5, 6, THINK]
    assert TaskSet.answer_prompt((5, 6)) == [5, 6, ANSWER]
    assert TaskSet.answer_tokens == ANSWER_TOKENS
    assert TaskSet.answer_digit([DIGIT_BASE + 7, 99]) == 7
    assert TaskSet.answer_digit([]) is None
    assert TaskSet.answer_digit([THINK]) is None
    assert TaskSet.answer_digit([DIGIT_BASE + 10]) is None
