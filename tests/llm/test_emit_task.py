"""The "emit token X" dataset and reward."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery.errors import InvalidArgumentError, InvalidArgumentTypeError
from rollout_recovery.llm._emit_task import EMIT_TOKEN_TASK, EmitTokenTask

TASK = EmitTokenTask(1000, seed=3, vocab_size=333, target_token=313)


@given(idx=st.integers(0, 999))
def test_an_item_is_a_function_of_seed_and_idx(idx: int) -> None:
    item = TASK[idx]
    assert item == EmitTokenTask(1000, seed=3, vocab_size=333, target_token=313)[idx]
    assert item["idx"] == idx and item["task_name"] == EMIT_TOKEN_TASK
    tokens = item["prompt_token_ids"]
    assert tokens[0] == 0 and 4 <= len(tokens) <= 9
    assert all(5 <= t < 333 for t in tokens[1:])
    assert TASK.prompt_ids(item) == tokens


def test_seeds_and_indices_give_different_prompts() -> None:
    other = EmitTokenTask(1000, seed=4, vocab_size=333, target_token=313)
    assert TASK[0] != other[0]
    assert len({tuple(TASK[i]["prompt_token_ids"]) for i in range(100)}) == 100


@given(tokens=st.lists(st.integers(0, 332), max_size=20))
def test_the_reward_is_the_share_of_target_tokens(tokens: list[int]) -> None:
    expected = tokens.count(313) / len(tokens) if tokens else 0.0
    assert TASK.reward(tokens) == pytest.approx(expected)
    assert TASK.reward(np.array(tokens, dtype=np.int32)) == pytest.approx(expected)


def test_bad_arguments() -> None:
    with pytest.raises(IndexError):
        TASK[1000]
    with pytest.raises(InvalidArgumentTypeError):
        TASK["1"]  # type: ignore[index]
    for bad in (
        {"target_token": 333},
        {"size": 0},
        {"prompt_length": (0, 3)},
        {"prompt_length": (4, 3)},
        {"first_token": 333},
    ):
        options = {"size": 10, "seed": 0, "vocab_size": 333, "target_token": 7}
        options.update(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            EmitTokenTask(**options)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="do not match task 5"):
        TASK.prompt_ids({**TASK[5], "prompt_token_ids": [0, 6]})
    with pytest.raises(InvalidArgumentError, match="idx"):
        TASK.prompt_ids({"prompt_token_ids": [0]})
