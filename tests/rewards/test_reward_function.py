"""A reward function of one's own (issue 27): loaded and checked at start, called off the
event loop under a timeout, and whatever it does is a value, never a stopped run."""

from __future__ import annotations

import asyncio
import math
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery._clock import VirtualClockLoop
from rollout_recovery._reward_function import (
    RewardConfig,
    RewardFailure,
    RewardFunction,
    RewardValue,
    judge,
)
from rollout_recovery.errors import ConfigError, RewardFunctionError

FIELDS = ["answer", "level"]
ARGUMENTS = {"prompt": "1+1=", "completion": "2", "completion_ids": [7], "answer": 2, "level": 1}


def _file(tmp_path: Path, body: str, name: str = "reward.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _load(tmp_path: Path, body: str, function: str = "score", **kwargs: Any) -> RewardFunction:
    path = _file(tmp_path, body)
    config = RewardConfig(function=f"{path}:{function}", **kwargs)
    return config.load(FIELDS)


# ------------------------------------------------------------------------------ loading


def test_a_file_function_gets_what_it_declares(tmp_path: Path) -> None:
    function = _load(
        tmp_path,
        """
        def score(completion, answer):
            return float(completion.strip() == str(answer))
        """,
    )
    assert function.call(ARGUMENTS) == RewardValue(1.0)


def test_a_function_with_kwargs_gets_every_field(tmp_path: Path) -> None:
    function = _load(
        tmp_path,
        """
        def score(**kwargs):
            return {"seen": len(kwargs)}
        """,
    )
    assert function.call(ARGUMENTS) == RewardValue(5.0, {"seen": 5.0})


def test_an_importable_module_function_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _file(tmp_path, "def score(completion):\n    return len(completion)\n", "my_rewards.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        function = RewardConfig(function="my_rewards:score").load(FIELDS)
        assert function.call(ARGUMENTS) == RewardValue(1.0)
    finally:
        sys.modules.pop("my_rewards", None)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "is not 'file.py:name'"),
        ("missing.py:score", "does not exist"),
        ("json:not_there", "has no function 'not_there'"),
        ("no_such_module_here:score", "importing 'no_such_module_here' failed"),
    ],
)
def test_a_bad_spec_is_refused_at_start(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        RewardConfig(function=spec).load(FIELDS)
    assert refused.value.path == "$.reward.function"
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("def score(completion, answr):\n    return 0\n", "requires 'answr'"),
        ("def score(completion, /):\n    return 0\n", "positional-only"),
        ("raise RuntimeError('broken import')\n", "RuntimeError: broken import"),
        ("def score(:\n", "SyntaxError"),
    ],
)
def test_a_function_that_cannot_be_called_is_refused_at_start(
    tmp_path: Path, body: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, body)
    assert message in str(refused.value)


def test_a_dataset_field_named_like_a_given_argument_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, "def score(**kwargs):\n    return 0\n")
    with pytest.raises(ConfigError) as refused:
        RewardConfig(function=f"{path}:score").load(["completion", "answer"])
    assert "field named 'completion'" in str(refused.value)


def test_two_reward_files_of_one_name_do_not_collide(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _load(tmp_path / "a", "def score(**kwargs):\n    return 1\n")
    second = _load(tmp_path / "b", "def score(**kwargs):\n    return 2\n")
    assert first.call(ARGUMENTS) == RewardValue(1.0)
    assert second.call(ARGUMENTS) == RewardValue(2.0)


# ------------------------------------------------------------------------------ values


@given(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**60), 2**60))
def test_a_finite_number_is_the_reward(value: float) -> None:
    assert judge(value) == RewardValue(float(value))


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.floats(-1e6, 1e6, allow_nan=False),
        min_size=1,
        max_size=5,
    )
)
def test_components_sum_to_the_reward(components: dict[str, float]) -> None:
    judged = judge(components)
    assert isinstance(judged, RewardValue)
    assert judged.components == components
    assert judged.reward == pytest.approx(math.fsum(components.values()))


@pytest.mark.parametrize(
    ("returned", "reason"),
    [
        (math.nan, "reward_not_finite"),
        (math.inf, "reward_not_finite"),
        (np.float32("nan"), "reward_not_finite"),
        ({"a": 1.0, "b": math.nan}, "reward_not_finite"),
        ({"a": 1e308, "b": 1e308}, "reward_not_finite"),
        ("1.0", "reward_not_a_number"),
        (None, "reward_not_a_number"),
        ([1.0], "reward_not_a_number"),
        ({}, "reward_not_a_number"),
        ({"a": "x"}, "reward_not_a_number"),
        ({1: 1.0}, "reward_not_a_number"),
    ],
)
def test_anything_else_is_a_failure_naming_it(returned: object, reason: str) -> None:
    judged = judge(returned)
    assert isinstance(judged, RewardFailure) and judged.reason == reason


def test_numpy_numbers_and_bools_are_numbers() -> None:
    assert judge(np.float64(0.5)) == RewardValue(0.5)
    assert judge(np.int64(3)) == RewardValue(3.0)
    assert judge(True) == RewardValue(1.0)


def test_a_raising_function_is_a_failure_with_the_exception(tmp_path: Path) -> None:
    function = _load(tmp_path, "def score(answer):\n    return 1 / (answer - 2)\n")
    outcome = function.call(ARGUMENTS)
    assert outcome == RewardFailure("reward_raised", "ZeroDivisionError: division by zero")


# ------------------------------------------------------------------------- off the loop


def test_score_runs_off_the_loop_and_the_loop_keeps_turning(tmp_path: Path) -> None:
    release = threading.Event()
    seen: dict[str, int] = {}

    def score(**kwargs: Any) -> float:
        seen["thread"] = threading.get_ident()
        release.wait()
        return 0.5

    function = RewardFunction(score, name="t", timeout_s=60.0, accepts=None)

    async def main() -> tuple[float, int]:
        scored = asyncio.ensure_future(function.score(ARGUMENTS))
        ticks = 0
        while not release.is_set():
            await asyncio.sleep(0)  # the loop serves others while the reward runs
            ticks += 1
            if ticks == 50:
                release.set()
        reward, _ = await scored
        return reward, ticks

    loop_thread = threading.get_ident()
    reward, ticks = asyncio.run(main())
    assert reward == 0.5 and ticks == 50
    assert seen["thread"] != loop_thread


def test_a_hung_reward_fails_at_its_timeout_on_the_loops_clock() -> None:
    started, release = threading.Event(), threading.Event()

    def hangs(**kwargs: Any) -> float:
        started.set()
        release.wait()
        return 1.0

    function = RewardFunction(hangs, name="hangs", timeout_s=7.5, accepts=None)
    loop = VirtualClockLoop()

    async def main() -> tuple[RewardFunctionError, float]:
        scored = asyncio.ensure_future(function.score(ARGUMENTS))
        await asyncio.to_thread(started.wait)
        at = loop.time()
        loop.advance(7.5)
        with pytest.raises(RewardFunctionError) as failed:
            await scored
        return failed.value, loop.time() - at

    try:
        error, waited = loop.run_until_complete(main())
    finally:
        release.set()
        loop.close()
    assert error.reason == "reward_timeout" and waited == 7.5
    assert "timeout_s = 7.5" in error.detail


def test_score_raises_the_failure_for_the_episode(tmp_path: Path) -> None:
    function = _load(tmp_path, "def score(**kwargs):\n    return float('nan')\n")
    with pytest.raises(RewardFunctionError) as failed:
        asyncio.run(function.score(ARGUMENTS))
    assert failed.value.reason == "reward_not_finite"


def test_a_failure_is_logged_once_per_kind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    function = _load(tmp_path, "def score(answer):\n    raise ValueError(answer)\n")
    with caplog.at_level("WARNING", logger="rollout_recovery.rewards"):
        for _ in range(3):
            function.call(ARGUMENTS)
    assert len(caplog.records) == 1
    assert "reward_raised" in caplog.records[0].getMessage()


# ------------------------------------------------------------------------------ config


def test_the_dataset_task_needs_a_function_and_the_others_refuse_one() -> None:
    with pytest.raises(ConfigError) as missing:
        RewardConfig().check("dataset")
    assert missing.value.path == "$.reward.function"
    with pytest.raises(ConfigError) as extra:
        RewardConfig(function="r.py:f").check("emit_token")
    assert 'is for [task] kind = "dataset"' in str(extra.value)
    RewardConfig(function="r.py:f").check("dataset")
    RewardConfig().check("digits")
