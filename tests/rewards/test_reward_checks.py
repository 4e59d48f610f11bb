"""Seal-time text checks: the two output detectors, the last-user rule, compute_reward_checks."""

from __future__ import annotations

from typing import Any

import pytest

from rollout_recovery.errors import InvalidStateError
from rollout_recovery.rewards import CaptureRewardSettings, RewardChecks
from rollout_recovery.rewards._checks import (
    compute_reward_checks,
    has_duplicated_reasoning,
    has_empty_final_answer,
    is_low_effort,
)
from rollout_recovery.rewards._settings import EffortRewardSettings, effort_shaping_enabled

EFFORT = EffortRewardSettings(low_weight=1.0, low_penalty=1.0, low_ub=64000, low_string="/low")


def reasoning(text: str) -> dict[str, Any]:
    return {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}


def message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


FUNCTION_CALL: dict[str, Any] = {"type": "function_call", "name": "run", "arguments": "{}"}

# (output items, (duplicated_reasoning, empty_final_answer))
DETECTOR_CASES: list[tuple[list[dict[str, Any]], tuple[bool, bool]]] = [
    ([], (False, True)),
    ([reasoning(" a "), message("a")], (True, False)),
    ([message(" \n\t ")], (False, True)),
    ([message("done"), FUNCTION_CALL], (False, False)),
    ([reasoning("plan the call"), FUNCTION_CALL], (False, False)),
    ([{"type": "message", "content": {"text": "a"}}], (False, True)),
    ([{"type": "message", "content": "plain answer"}], (False, False)),
    ([reasoning("a"), message("b")], (False, False)),
    ([reasoning("  "), {"type": "message", "content": "  "}], (False, True)),
    ([reasoning("a"), FUNCTION_CALL, message("a")], (False, False)),
    ([message("ok"), reasoning("thinking after")], (False, False)),
    ([{"type": "reasoning", "summary": []}, message("a")], (False, False)),
    ([{"content": [{"type": "image"}, {"text": "a"}]}], (False, True)),
    ([reasoning("a"), {"type": "message", "content": {"text": "a"}}, message("a")], (False, False)),
    ([reasoning("same"), {"type": "message", "content": " same "}], (True, False)),
]


@pytest.mark.parametrize(("output", "expected"), DETECTOR_CASES)
def test_text_detector_contract(output: list[dict[str, Any]], expected: tuple[bool, bool]) -> None:
    assert (has_duplicated_reasoning(output), has_empty_final_answer(output)) == expected


def user(content: object) -> dict[str, Any]:
    return {"role": "user", "content": content}


def row(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"responses_create_params": {"input": list(messages)}}


LAST_USER_CASES: list[tuple[dict[str, Any], bool]] = [
    (row({"role": "system", "content": "sys"}, user("please /low now")), True),
    (row(user("/low"), {"role": "assistant", "content": "x"}, user("think hard")), False),
    (row(user([{"type": "input_text", "text": "/low"}])), False),
    (row(user("/low"), {"role": "user"}), True),
    (row({"role": "system", "content": "/low"}), False),
    (row(user("/low"), {"role": "assistant", "content": "ok"}), True),
    ({"responses_create_params": {"input": "/low as a plain string"}}, False),
]


@pytest.mark.parametrize(("input_row", "expected"), LAST_USER_CASES)
def test_classification_retains_original_last_user_membership_rule(
    input_row: dict[str, Any], expected: bool
) -> None:
    assert is_low_effort(input_row, EFFORT) is expected


def test_low_effort_classification_needs_the_input_messages() -> None:
    with pytest.raises(InvalidStateError, match="responses_create_params"):
        is_low_effort({}, EFFORT)


def test_compute_reward_checks_runs_text_detectors_and_effort_only_when_active() -> None:
    result = {"response": {"output": [reasoning("x"), message("x")]}}
    low_row = row(user("/low"))
    assert compute_reward_checks(result, low_row, effort=EFFORT) == RewardChecks(
        duplicated_reasoning=True, empty_final_answer=False, low_effort=True
    )
    # Shaping off: the prompt is not inspected, even a row without input is fine.
    assert compute_reward_checks(result, {}) == RewardChecks(
        duplicated_reasoning=True, empty_final_answer=False, low_effort=False
    )


def test_compute_reward_checks_treats_a_missing_output_as_empty() -> None:
    expected = RewardChecks(duplicated_reasoning=False, empty_final_answer=True, low_effort=False)
    assert compute_reward_checks({}, {}) == expected
    assert compute_reward_checks({"response": None}, {}) == expected
    assert compute_reward_checks({"response": {}}, {}) == expected


def test_compute_reward_checks_rejects_a_non_list_output() -> None:
    with pytest.raises(InvalidStateError, match=r"response\.output must be a list"):
        compute_reward_checks({"response": {"output": "text"}}, {})


@pytest.mark.parametrize(
    ("config", "enabled"),
    [
        (None, False),
        ({}, False),
        ({"low_weight": 0.5}, False),
        ({"low_string": "/low"}, False),
        ({"low_weight": 0.5, "low_string": "/low"}, True),
        ({"low_weight": -1.0, "low_string": "/low"}, False),
        (EFFORT, True),
    ],
)
def test_effort_shaping_enabled(config: Any, enabled: bool) -> None:
    assert effort_shaping_enabled(config) is enabled


def test_settings_effort_feeds_compute_reward_checks() -> None:
    settings = CaptureRewardSettings.from_configs(effort={"low_weight": 1.0, "low_string": "/low"})
    checks = compute_reward_checks({}, row(user("x /low")), effort=settings.effort)
    assert checks.low_effort is True
