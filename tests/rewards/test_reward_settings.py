"""Run-scoped reward settings: normalization, persisted form, compatibility on resume."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery.errors import InvalidStateError, JobMismatchError
from rollout_recovery.rewards import CaptureRewardSettings
from rollout_recovery.rewards._settings import EffortRewardSettings

ALL_FLAGS = (
    "penalize_duplicated_reasoning",
    "penalize_empty_final_answer",
    "penalize_unwanted_tokens",
)
ACTIVE_EFFORT = {"low_weight": 0.5, "low_penalty": 2.0, "low_ub": 1000, "low_string": "/low"}


def test_reward_settings_ignore_extras_and_inactive_options() -> None:
    baseline = CaptureRewardSettings.from_configs()
    noisy = CaptureRewardSettings.from_configs(
        penalties={
            "penalize_duplicated_reasoning": False,
            "penalize_unwanted_tokens": False,
            "token_ids": {"unwanted": [5, 6]},  # inactive: the penalty is off
            "penalize_malformed_think_tag": False,
            "some_other_option": {"deep": [1, 2]},
        },
        effort={"low_weight": 0.0, "low_string": "/low", "low_ub": -3, "unknown": True},
    )
    assert noisy == baseline == CaptureRewardSettings()
    assert (
        CaptureRewardSettings.from_state_dict({"version": 1, "penalties": {}, "effort": {}})
        == baseline
    )
    assert baseline.state_dict() == {"version": 1, "penalties": {}, "effort": None}
    assert CaptureRewardSettings.from_state_dict(baseline.state_dict()) == baseline

    active = CaptureRewardSettings.from_configs(
        penalties={"penalize_empty_final_answer": True, "extra": 1},
        effort={**ACTIVE_EFFORT, "extra": "x"},
    )
    assert active.state_dict() == {
        "version": 1,
        "penalties": {"penalize_empty_final_answer": True},
        "effort": {"low_weight": 0.5, "low_penalty": 2.0, "low_ub": 1000, "low_string": "/low"},
    }
    assert CaptureRewardSettings.from_state_dict(active.state_dict()) == active


def test_reward_settings_normalize_active_tokens_and_nested_extras() -> None:
    penalties = {
        "penalize_unwanted_tokens": True,
        "penalize_duplicated_reasoning": True,
        "token_ids": {"unwanted": [9, 3, 9, 1], "also_here": [2]},
        "nested": {"extra": {"x": 1}},
    }
    settings = CaptureRewardSettings.from_configs(penalties=penalties)
    assert settings.enabled_penalties == (
        "penalize_duplicated_reasoning",
        "penalize_unwanted_tokens",
    )
    assert settings.unwanted_tokens == (1, 3, 9)
    assert settings.state_dict() == {
        "version": 1,
        "penalties": {
            "penalize_duplicated_reasoning": True,
            "penalize_unwanted_tokens": True,
            "token_ids": {"unwanted": [1, 3, 9]},
        },
        "effort": None,
    }
    unversioned = {"penalties": penalties, "effort": None}
    assert CaptureRewardSettings.from_state_dict(unversioned) == settings
    # An int weight and a float weight are the same setting.
    assert CaptureRewardSettings.from_configs(
        effort={**ACTIVE_EFFORT, "low_weight": 1}
    ) == CaptureRewardSettings.from_configs(effort={**ACTIVE_EFFORT, "low_weight": 1.0})


@pytest.mark.parametrize(
    ("current_penalties", "current_effort", "named"),
    [
        (
            {"penalize_empty_final_answer": True},
            ACTIVE_EFFORT,
            "penalties.penalize_empty_final_answer",
        ),
        (
            {"penalize_unwanted_tokens": True, "token_ids": {"unwanted": [1, 2, 4]}},
            ACTIVE_EFFORT,
            "penalties.token_ids.unwanted",
        ),
        ({}, {**ACTIVE_EFFORT, "low_ub": 2000}, "effort.low_ub"),
        ({}, None, "effort.enabled"),
    ],
)
def test_reward_settings_reject_semantic_changes_with_field_names(
    current_penalties: dict[str, Any], current_effort: dict[str, Any] | None, named: str
) -> None:
    checkpoint = CaptureRewardSettings.from_configs(
        penalties={"penalize_unwanted_tokens": True, "token_ids": {"unwanted": [1, 2, 3]}},
        effort=ACTIVE_EFFORT,
    )
    base = {"penalize_unwanted_tokens": True, "token_ids": {"unwanted": [1, 2, 3]}}
    current = CaptureRewardSettings.from_configs(
        penalties={**base, **current_penalties}, effort=current_effort
    )
    with pytest.raises(
        JobMismatchError, match="capture reward settings differ from the checkpoint: "
    ) as info:
        checkpoint.require_compatible(current)
    assert info.value.differences == [named]
    assert named in str(info.value)
    assert checkpoint.differences(current) == [named]


def test_require_compatible_names_every_differing_field_in_order() -> None:
    checkpoint = CaptureRewardSettings.from_configs(
        penalties={"penalize_duplicated_reasoning": True}, effort=ACTIVE_EFFORT
    )
    current = CaptureRewardSettings.from_configs(
        penalties={"penalize_empty_final_answer": True},
        effort={**ACTIVE_EFFORT, "low_weight": 0.25, "low_string": "/fast"},
    )
    with pytest.raises(ValueError) as info:
        checkpoint.require_compatible(current)
    assert str(info.value) == (
        "capture reward settings differ from the checkpoint: "
        "penalties.penalize_duplicated_reasoning, penalties.penalize_empty_final_answer, "
        "effort.low_weight, effort.low_string"
    )
    checkpoint.require_compatible(checkpoint)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (None, "invalid capture reward_settings record"),
        ({}, "invalid capture reward_settings record"),
        (
            {"version": 1, "penalties": None, "effort": None},
            "invalid capture reward_settings record",
        ),
        (
            {"version": 2, "penalties": {}, "effort": None},
            "unsupported capture reward_settings version=2",
        ),
        (
            {"version": True, "penalties": {}, "effort": None},
            "unsupported capture reward_settings version=True",
        ),
        (
            {"version": 1, "penalties": {"penalize_unwanted_tokens": True}, "effort": None},
            "penalties.penalize_unwanted_tokens requires a nonempty token_ids.unwanted",
        ),
        (
            {"version": 1, "penalties": {}, "effort": {**ACTIVE_EFFORT, "low_ub": 0}},
            "active effort shaping requires low_ub > 0",
        ),
    ],
)
def test_reward_settings_reject_invalid_records(record: object, message: str) -> None:
    with pytest.raises(InvalidStateError) as info:
        CaptureRewardSettings.from_state_dict(record)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    "record",
    [
        {"version": 1, "penalties": {}, "effort": None, "extra": 1},
        {"version": 1, "penalties": {}},
        {"version": "1", "penalties": {}, "effort": None},
        {"version": 1.0, "penalties": {}, "effort": None},
        {"version": 1, "penalties": {}, "effort": "on"},
        {"version": 1, "penalties": {"penalize_empty_final_answer": "yes"}, "effort": None},
        {
            "version": 1,
            "penalties": {"penalize_unwanted_tokens": True, "token_ids": [1]},
            "effort": None,
        },
        {
            "version": 1,
            "penalties": {"penalize_unwanted_tokens": True, "token_ids": {"unwanted": [True]}},
            "effort": None,
        },
        {"version": 1, "penalties": {}, "effort": {**ACTIVE_EFFORT, "low_ub": 10.0}},
        {"version": 1, "penalties": {}, "effort": {**ACTIVE_EFFORT, "low_weight": float("nan")}},
        {"version": 1, "penalties": {}, "effort": {**ACTIVE_EFFORT, "low_penalty": True}},
    ],
)
def test_reward_settings_reject_malformed_fields(record: object) -> None:
    with pytest.raises(InvalidStateError):
        CaptureRewardSettings.from_state_dict(record)


@pytest.mark.parametrize("low_ub", [0, -5])
def test_active_effort_requires_positive_bound(low_ub: int) -> None:
    with pytest.raises(InvalidStateError, match="low_ub > 0"):
        CaptureRewardSettings.from_configs(effort={**ACTIVE_EFFORT, "low_ub": low_ub})
    inactive = CaptureRewardSettings.from_configs(
        effort={**ACTIVE_EFFORT, "low_weight": 0.0, "low_ub": low_ub}
    )
    assert inactive.effort is None


def test_capture_refuses_malformed_think_tag_penalty() -> None:
    with pytest.raises(InvalidStateError) as info:
        CaptureRewardSettings.from_configs(penalties={"penalize_malformed_think_tag": True})
    assert str(info.value).startswith("capture does not support penalize_malformed_think_tag")


def test_settings_constructor_enforces_normal_form() -> None:
    with pytest.raises(InvalidStateError, match="order"):
        CaptureRewardSettings(enabled_penalties=ALL_FLAGS[::-1][1:])
    with pytest.raises(InvalidStateError, match="sorted and unique"):
        CaptureRewardSettings(
            enabled_penalties=("penalize_unwanted_tokens",), unwanted_tokens=(3, 1)
        )
    with pytest.raises(InvalidStateError, match="nonempty exactly when"):
        CaptureRewardSettings(unwanted_tokens=(1,))
    with pytest.raises(InvalidStateError, match="active shaping"):
        EffortRewardSettings(low_weight=0.0, low_penalty=1.0, low_ub=10, low_string="/low")


# --- properties ---------------------------------------------------------------------------

json_extras = st.dictionaries(
    st.text(min_size=1, max_size=5).map(lambda key: f"x_{key}"),
    st.one_of(st.integers(), st.text(max_size=4), st.lists(st.integers(), max_size=3)),
    max_size=3,
)
token_lists = st.lists(st.integers(min_value=0, max_value=50), max_size=6)


@st.composite
def penalty_configs(draw: st.DrawFn) -> dict[str, Any]:
    config: dict[str, Any] = draw(json_extras)
    for flag in ALL_FLAGS:
        if draw(st.booleans()):
            config[flag] = draw(st.booleans())
    tokens: list[int] = draw(token_lists)
    if config.get("penalize_unwanted_tokens") and not tokens:
        tokens = [draw(st.integers(min_value=0, max_value=50))]
    with_token_ids: bool = draw(st.booleans())
    if tokens or with_token_ids:
        config["token_ids"] = {"unwanted": tokens, **draw(json_extras)}
    return config


@st.composite
def effort_configs(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.booleans()):
        return None
    config: dict[str, Any] = draw(json_extras)
    config["low_weight"] = draw(st.sampled_from([0.0, 0.25, 1, 1.0, 2.5]))
    config["low_penalty"] = draw(st.sampled_from([0.0, 1.0, 3]))
    config["low_ub"] = draw(st.sampled_from([1, 1000, 64000]))
    config["low_string"] = draw(st.sampled_from(["", "/low", "/fast"]))
    return config


@st.composite
def settings(draw: st.DrawFn) -> CaptureRewardSettings:
    return CaptureRewardSettings.from_configs(
        penalties=draw(penalty_configs()), effort=draw(effort_configs())
    )


@given(settings())
def test_state_dict_round_trip(value: CaptureRewardSettings) -> None:
    state = value.state_dict()
    assert CaptureRewardSettings.from_state_dict(state) == value
    # The persisted form survives a real codec (what the sidecar does) unchanged.
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(state))
    assert decoded == state
    assert CaptureRewardSettings.from_state_dict(decoded) == value
    unversioned = {"penalties": state["penalties"], "effort": state["effort"]}
    assert CaptureRewardSettings.from_state_dict(unversioned) == value


@given(settings(), settings())
def test_require_compatible_is_empty_iff_semantically_equal(
    left: CaptureRewardSettings, right: CaptureRewardSettings
) -> None:
    diffs = left.differences(right)
    assert (diffs == []) == (left == right)
    assert (diffs == []) == (left.state_dict() == right.state_dict())
    assert sorted(diffs) == sorted(right.differences(left))
    if diffs:
        with pytest.raises(JobMismatchError, match=", ".join(map(_escape, diffs))):
            left.require_compatible(right)
    else:
        left.require_compatible(right)


@given(penalty_configs(), effort_configs(), json_extras)
def test_extras_never_change_settings(
    penalties: dict[str, Any], effort: dict[str, Any] | None, extras: dict[str, Any]
) -> None:
    plain = CaptureRewardSettings.from_configs(penalties=penalties, effort=effort)
    noisy = CaptureRewardSettings.from_configs(
        penalties={**extras, **penalties},
        effort=None if effort is None else {**extras, **effort},
    )
    assert noisy == plain


def _escape(text: str) -> str:
    return text.replace(".", r"\.")
