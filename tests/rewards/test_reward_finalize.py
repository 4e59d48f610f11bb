"""Final reward of one verified row: shape, then penalize, over generated spans only."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery.errors import InvalidStateError
from rollout_recovery.rewards import CaptureRewardSettings, RewardChecks
from rollout_recovery.rewards._checks import (
    compute_reward_checks,
    has_duplicated_reasoning,
    has_empty_final_answer,
)
from rollout_recovery.rewards._final_reward import (
    finalize_capture_reward,
    generated_segments,
    has_unwanted_tokens,
    shape_effort_reward,
)
from rollout_recovery.rewards._settings import EffortRewardSettings

UNWANTED = 7
NO_CHECKS = RewardChecks(duplicated_reasoning=False, empty_final_answer=False, low_effort=False)
FLAGS = (
    "penalize_duplicated_reasoning",
    "penalize_empty_final_answer",
    "penalize_unwanted_tokens",
)


def penalties(*flags: str) -> CaptureRewardSettings:
    config: dict[str, Any] = dict.fromkeys(flags, True)
    config["token_ids"] = {"unwanted": [UNWANTED, 8]}
    return CaptureRewardSettings.from_configs(penalties=config)


def reasoning(text: str) -> dict[str, Any]:
    return {"type": "reasoning", "summary": [{"text": text}]}


def message(text: str) -> dict[str, Any]:
    return {"type": "message", "content": [{"type": "output_text", "text": text}]}


OUTPUTS: list[list[dict[str, Any]]] = [
    [],
    [message("42")],
    [message("  ")],
    [reasoning("42"), message("42")],
    [reasoning(" 42 "), {"type": "message", "content": "42"}],
    [reasoning("x"), message("y")],
    [message("a"), {"type": "function_call", "name": "f"}],
    [{"type": "message", "content": {"text": "a"}}],
    [reasoning("a"), {"type": "function_call"}, message("a")],
    [message("ok"), reasoning("later")],
    [reasoning(""), message("")],
    [reasoning("z"), message("z"), {"type": "function_call"}],
]
# (carried, generated) per call; the parity sweep alternates where the unwanted id sits.
CLEAN_CALLS = [([1, 2, 3], [4, 5]), ([6], [9, 10])]
DIRTY_CALLS = [([1, UNWANTED], [4, 5]), ([6], [9, UNWANTED])]


def linearize(
    calls: list[tuple[list[int], list[int]]],
) -> tuple[list[int], list[tuple[str, int, int]]]:
    tokens: list[int] = []
    spans: list[tuple[str, int, int]] = []
    for index, (carried, generated) in enumerate(calls):
        tokens += carried + generated
        spans.append((f"call-{index}", len(carried), len(generated)))
    return tokens, spans


def inline_reward(
    reward: float,
    flags: tuple[str, ...],
    output: list[dict[str, Any]],
    generations: list[list[int]],
) -> tuple[float, dict[str, int]]:
    """The legacy one-shot path: text and tokens judged together, right after generation."""
    counts = {
        "duplicated_reasoning": int(
            "penalize_duplicated_reasoning" in flags and has_duplicated_reasoning(output)
        ),
        "empty_final_answer": int(
            "penalize_empty_final_answer" in flags and has_empty_final_answer(output)
        ),
        "unwanted_token": int(
            "penalize_unwanted_tokens" in flags
            and any(UNWANTED in g or 8 in g for g in generations)
        ),
    }
    return (0.0 if any(counts.values()) else reward), counts


FLAG_SETS = [
    tuple(flag for flag, on in zip(FLAGS, bits, strict=True) if on)
    for bits in itertools.product([False, True], repeat=3)
]


@pytest.mark.parametrize("flags", FLAG_SETS)
@pytest.mark.parametrize("reward", [-1.0, 0.0, 0.75])
@pytest.mark.parametrize("output_index", range(len(OUTPUTS)))
def test_inline_and_capture_reward_parity(
    flags: tuple[str, ...], reward: float, output_index: int
) -> None:
    output = OUTPUTS[output_index]
    calls = DIRTY_CALLS if output_index % 2 else CLEAN_CALLS
    tokens, spans = linearize(calls)
    # Capture splits the work: text checks at seal time, tokens at finalization.
    checks = compute_reward_checks({"response": {"output": output}}, {})
    outcome = finalize_capture_reward(
        reward, settings=penalties(*flags), checks=checks, token_ids=tokens, link_spans=spans
    )
    expected_reward, expected_counts = inline_reward(
        reward, flags, output, [generated for _, generated in calls]
    )
    assert (outcome.reward, outcome.counts) == (expected_reward, expected_counts)
    assert outcome.metrics == {}


@pytest.mark.parametrize(
    ("calls", "penalized"),
    [
        ([([UNWANTED, 1, 2], [3, 4]), ([UNWANTED], [5, 6])], False),
        ([([1, 2], [3, UNWANTED]), ([4], [5, 6])], True),
        ([([1, 2], [3, 4]), ([5], [6, UNWANTED])], True),
    ],
    ids=["carried-only", "terminal-of-first-call", "last-token-of-row"],
)
def test_generated_spans_only_including_each_terminal(
    calls: list[tuple[list[int], list[int]]], penalized: bool
) -> None:
    tokens, spans = linearize(calls)
    final, counts, metrics = finalize_capture_reward(
        1.0,
        settings=penalties("penalize_unwanted_tokens"),
        checks=None,
        token_ids=tokens,
        link_spans=spans,
    )
    assert final == (0.0 if penalized else 1.0)
    assert counts == {
        "duplicated_reasoning": 0,
        "empty_final_answer": 0,
        "unwanted_token": int(penalized),
    }
    assert metrics == {}


def test_unwanted_tokens_ignored_when_penalty_off() -> None:
    tokens, spans = linearize(DIRTY_CALLS)
    outcome = finalize_capture_reward(
        0.5, settings=CaptureRewardSettings(), checks=None, token_ids=tokens, link_spans=spans
    )
    assert outcome.reward == 0.5


def test_has_unwanted_tokens_sees_terminal_tokens() -> None:
    assert has_unwanted_tokens([[1, 2], [3, UNWANTED]], [UNWANTED])
    assert not has_unwanted_tokens([[1, 2], []], [UNWANTED])
    assert not has_unwanted_tokens([], [UNWANTED])


@pytest.mark.parametrize(
    "settings",
    [
        penalties("penalize_duplicated_reasoning"),
        penalties("penalize_empty_final_answer"),
        CaptureRewardSettings.from_configs(effort={"low_weight": 1.0, "low_string": "/low"}),
    ],
)
def test_missing_checks_are_refused_when_settings_need_them(
    settings: CaptureRewardSettings,
) -> None:
    tokens, spans = linearize(CLEAN_CALLS)
    with pytest.raises(InvalidStateError) as info:
        finalize_capture_reward(
            1.0, settings=settings, checks=None, token_ids=tokens, link_spans=spans
        )
    assert str(info.value) == "missing_reward_checks"


@pytest.mark.parametrize(
    "spans",
    [
        [("a", 3, 2), ("b", 1, 1)],  # covers 7 of 8 tokens
        [("a", 3, 2), ("b", 1, 3)],  # covers 9
        [("a", -1, 6), ("b", 1, 2)],
    ],
)
def test_link_spans_must_tile_the_row(spans: list[tuple[str, int, int]]) -> None:
    tokens, _ = linearize(CLEAN_CALLS)
    with pytest.raises(InvalidStateError, match="link span"):
        list(generated_segments(tokens, spans))


# --- effort shaping -----------------------------------------------------------------------

LOW_UB = 64000
LOW_PENALTY = 0.5


def effort_settings(weight: float) -> CaptureRewardSettings:
    return CaptureRewardSettings.from_configs(
        effort={
            "low_weight": weight,
            "low_penalty": LOW_PENALTY,
            "low_ub": LOW_UB,
            "low_string": "/low",
        }
    )


@pytest.mark.parametrize("reward", [-0.5, 0.0, 1.0])
@pytest.mark.parametrize("length", [1, 1000, 32000, 64000, 96000, 200000])
@pytest.mark.parametrize("weight", [0.0, 0.25, 1.0, 2.0])
@pytest.mark.parametrize("low_effort", [False, True])
def test_finalized_effort_matches_inline_formula_and_metrics(
    reward: float, length: int, weight: float, low_effort: bool
) -> None:
    checks = RewardChecks(
        duplicated_reasoning=False, empty_final_answer=False, low_effort=low_effort
    )
    # Only the terminal call's generated length counts; the first call is much longer.
    tokens, spans = linearize([([1] * 5, [2] * (LOW_UB + 1)), ([3] * 2, [4] * length)])
    outcome = finalize_capture_reward(
        reward, settings=effort_settings(weight), checks=checks, token_ids=tokens, link_spans=spans
    )
    if weight == 0.0:
        assert (outcome.reward, outcome.metrics) == (reward, {})
        return
    bucket = "low" if low_effort else "high"
    expected_metrics = {f"finalize/effort/{bucket}/{length}": 1.0}
    expected_reward = reward
    if low_effort:
        term = min(1.0, weight * (1 - length / LOW_UB))
        expected_reward = reward + reward * max(term, 0.0) + LOW_PENALTY * min(term, 0.0)
        expected_metrics["finalize/effort/length_reward_sum"] = term
        expected_metrics["finalize/effort/reward_sum"] = expected_reward
    assert outcome.reward == pytest.approx(expected_reward, abs=1e-12)
    assert outcome.metrics == pytest.approx(expected_metrics, abs=1e-12)


@pytest.mark.parametrize(
    ("reward", "length", "weight", "expected"),
    [
        (1.0, 32000, 1.0, (1.5, 0.5)),  # short: bonus proportional to reward
        (1.0, 96000, 1.0, (0.75, -0.5)),  # long: flat penalty * low_penalty
        (1.0, 0, 2.0, (2.0, 1.0)),  # term capped at 1
        (-0.5, 32000, 1.0, (-0.75, 0.5)),  # negative reward scales, as upstream
        (0.0, 128000, 1.0, (-0.5, -1.0)),
    ],
)
def test_shape_effort_reward_by_hand(
    reward: float, length: int, weight: float, expected: tuple[float, float]
) -> None:
    config = EffortRewardSettings(
        low_weight=weight, low_penalty=LOW_PENALTY, low_ub=LOW_UB, low_string="/low"
    )
    assert shape_effort_reward(reward, length=length, config=config) == pytest.approx(expected)


def test_shape_then_penalize() -> None:
    settings = CaptureRewardSettings.from_configs(
        penalties={"penalize_empty_final_answer": True},
        effort={"low_weight": 1.0, "low_string": "/low", "low_ub": 100},
    )
    tokens, spans = linearize([([1], [2] * 50)])
    empty_low = RewardChecks(duplicated_reasoning=True, empty_final_answer=True, low_effort=True)
    outcome = finalize_capture_reward(
        1.0, settings=settings, checks=empty_low, token_ids=tokens, link_spans=spans
    )
    # Shaping metrics are still recorded for the penalized row; the reward is zeroed.
    assert outcome.reward == 0.0
    assert outcome.counts == {
        "duplicated_reasoning": 0,  # disabled: a fired check is not a penalty
        "empty_final_answer": 1,
        "unwanted_token": 0,
    }
    assert outcome.metrics == {
        "finalize/effort/low/50": 1.0,
        "finalize/effort/length_reward_sum": 0.5,
        "finalize/effort/reward_sum": 1.5,
    }


# --- properties ---------------------------------------------------------------------------

clean_token = st.integers(min_value=0, max_value=40).filter(lambda t: t not in (UNWANTED, 8))
call_strategy = st.tuples(
    st.lists(clean_token, max_size=6), st.lists(clean_token, min_size=1, max_size=6)
)


@given(
    calls=st.lists(call_strategy, min_size=1, max_size=5),
    reward=st.floats(min_value=-10, max_value=10, allow_nan=False),
    data=st.data(),
)
def test_unwanted_token_in_a_generated_span_always_zeroes_the_reward(
    calls: list[tuple[list[int], list[int]]], reward: float, data: st.DataObject
) -> None:
    call = data.draw(st.integers(min_value=0, max_value=len(calls) - 1))
    carried, generated = calls[call]
    position = data.draw(st.integers(min_value=0, max_value=len(generated) - 1))
    dirty = list(calls)
    dirty[call] = (carried, [*generated[:position], UNWANTED, *generated[position + 1 :]])
    tokens, spans = linearize(dirty)
    outcome = finalize_capture_reward(
        reward,
        settings=penalties("penalize_unwanted_tokens"),
        checks=None,
        token_ids=tokens,
        link_spans=spans,
    )
    assert outcome.reward == 0.0
    assert outcome.counts["unwanted_token"] == 1


@given(
    calls=st.lists(call_strategy, min_size=1, max_size=5),
    reward=st.floats(min_value=-10, max_value=10, allow_nan=False),
    data=st.data(),
)
def test_unwanted_tokens_in_carried_spans_are_ignored(
    calls: list[tuple[list[int], list[int]]], reward: float, data: st.DataObject
) -> None:
    dirty = [
        (data.draw(st.lists(st.sampled_from([UNWANTED, 8, 1]), min_size=1, max_size=4)) + c, g)
        for c, g in calls
    ]
    tokens, spans = linearize(dirty)
    outcome = finalize_capture_reward(
        reward,
        settings=penalties("penalize_unwanted_tokens"),
        checks=None,
        token_ids=tokens,
        link_spans=spans,
    )
    assert outcome.reward == reward
    assert not math.isnan(outcome.reward)
    assert outcome.counts["unwanted_token"] == 0
