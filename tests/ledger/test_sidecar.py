"""The checkpoint sidecar: ``build_rollout_recovery_state`` and ``parse_rollout_recovery_state``.

Reference §2.4 (build: validation, canonical filtering, the reader's seam) and §4.2 (parse:
every rule with its exception type and message start; defensive copies).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from ledger_support import (
    CUT,
    assert_primitive_tree,
    reserve,
    seal,
    snapshot,
    starts_with,
)

from rollout_recovery import (
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    CaptureRewardSettings,
    FinalizedReward,
    ParsedRolloutRecoveryState,
    RewardLogContext,
    RolloutRecoveryLedger,
    build_rollout_recovery_state,
    parse_rollout_recovery_state,
)

SIDECAR_KEYS = {
    "schema_version",
    "groups",
    "batch_shortfall",
    "sampler_stamps_target_steps",
    "finalizer_metrics_by_group",
    "finalizer_rewards_by_group",
    "reward_settings",
}


def settings() -> Any:
    try:
        return CaptureRewardSettings.from_state_dict(
            {"version": 1, "penalties": {}, "effort": None}
        )
    except NotImplementedError:  # pragma: no cover - another engineer's work in progress
        pytest.skip("CaptureRewardSettings.from_state_dict is not implemented yet")


def observation(group_id: str, index: int, reward: float = 1.0) -> FinalizedReward:
    return FinalizedReward(
        sample_id=f"{group_id}_g{index}",
        rollout_id=f"{group_id}_g{index}_a{index:032x}",
        reward=reward,
        log_context=RewardLogContext(agent_name="agent", full_result_json='{"a": 1}'),
    )


def two_group_ledger() -> RolloutRecoveryLedger:
    """Group "c" is ready (about to become canonical); group "u" is still generating."""
    ledger = RolloutRecoveryLedger()
    reserve(ledger, 1, group_id="c", n=1)
    ledger.mark_group_dispatched(CUT, "c")
    seal(ledger, "c", 0)
    reserve(ledger, 2, group_id="u", n=2)
    ledger.mark_group_dispatched(CUT, "u")
    seal(ledger, "u", 0, n_keys=2)
    return ledger


def minimal_sidecar(**overrides: Any) -> dict[str, Any]:
    state: dict[str, Any] = {
        "schema_version": 3,
        "groups": [],
        "batch_shortfall": {},
        "sampler_stamps_target_steps": False,
        "finalizer_metrics_by_group": {},
        "finalizer_rewards_by_group": {},
        "reward_settings": None,
    }
    state.update(overrides)
    return state


# --------------------------------------------------------------------------------------------
# build


def test_build_returns_the_complete_sidecar() -> None:
    ledger = two_group_ledger()
    capture = settings()
    rewards = {"old": [observation("old", 0, 0.5), observation("old", 1, 1)]}
    state = build_rollout_recovery_state(
        ledger,
        batch_shortfall={7: 1, 0: 0},
        sampler_stamps_target_steps=True,
        finalizer_metrics_by_group={"old": {"finalize/reward_count": 2, "x": 0.5}},
        finalizer_rewards_by_group=rewards,
        reward_settings=capture,
    )
    assert set(state) == SIDECAR_KEYS
    assert state["schema_version"] == ROLLOUT_RECOVERY_SCHEMA_VERSION == 3
    assert state["groups"] == ledger.state_dict()["groups"]
    assert state["batch_shortfall"] == {7: 1, 0: 0}
    assert state["sampler_stamps_target_steps"] is True
    metrics = state["finalizer_metrics_by_group"]
    assert metrics == {"old": {"finalize/reward_count": 2.0, "x": 0.5}}
    assert type(metrics["old"]["finalize/reward_count"]) is float
    assert state["finalizer_rewards_by_group"] == {
        "old": [dataclasses.asdict(row) for row in rewards["old"]]
    }
    assert state["reward_settings"] == capture.state_dict()
    assert_primitive_tree(state)


def test_build_defaults() -> None:
    state = build_rollout_recovery_state(
        RolloutRecoveryLedger(), batch_shortfall={}, sampler_stamps_target_steps=False
    )
    assert state == minimal_sidecar()


@pytest.mark.parametrize("value", [None, 1, 0, "yes"])
def test_build_requires_a_boolean_sampler_flag(value: Any) -> None:
    ledger = two_group_ledger()
    before = snapshot(ledger)
    with pytest.raises(
        TypeError,
        match=starts_with("rollout recovery sampler_stamps_target_steps must be a boolean"),
    ):
        build_rollout_recovery_state(ledger, batch_shortfall={}, sampler_stamps_target_steps=value)
    assert snapshot(ledger) == before


def test_build_refuses_a_checkpoint_unsafe_ledger() -> None:
    ledger = two_group_ledger()
    ledger.mark_finalization_started(CUT, "c")
    with pytest.raises(
        RuntimeError,
        match=starts_with("rollout recovery contains checkpoint-unsafe group states: groups=['c']"),
    ):
        build_rollout_recovery_state(
            ledger, batch_shortfall={}, sampler_stamps_target_steps=True, canonical_group_ids={"c"}
        )


def test_build_refuses_an_unrehydrated_ledger() -> None:
    restored = RolloutRecoveryLedger.from_state_dict(two_group_ledger().state_dict())
    with pytest.raises(
        RuntimeError,
        match=starts_with("cannot checkpoint recovery group 'c' before its prompt is rehydrated"),
    ):
        build_rollout_recovery_state(restored, batch_shortfall={}, sampler_stamps_target_steps=True)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"batch_shortfall": [(7, 1)]},
            TypeError,
            "rollout recovery batch_shortfall must be a dictionary",
        ),
        (
            {"batch_shortfall": {7: -1}},
            ValueError,
            "rollout recovery batch_shortfall entries must contain non-negative integer steps "
            "and counts, got 7: -1",
        ),
        (
            {"finalizer_metrics_by_group": {"c": {"m": True}}},
            ValueError,
            "invalid finalizer metric name or value",
        ),
        (
            # the seed reads ``metrics or {}``: an empty list passes, a non-empty one does not
            {"finalizer_metrics_by_group": [("c", {})]},
            ValueError,
            "finalizer_metrics_by_group must be a mapping",
        ),
        (
            {
                "finalizer_metrics_by_group": {"c": {}},
                "finalizer_rewards_by_group": {"c": [observation("c", 0), observation("c", 0)]},
            },
            ValueError,
            "duplicate finalized reward sample",
        ),
        (
            {"finalizer_rewards_by_group": {"c": [observation("c", 0)]}},
            ValueError,
            "finalized reward observations require matching group metrics",
        ),
    ],
    ids=[
        "shortfall-list",
        "shortfall-negative",
        "metric-bool",
        "metrics-list",
        "duplicate-reward-sample",
        "rewards-without-metrics",
    ],
)
def test_build_validates_controller_state(
    kwargs: dict[str, Any], error: type[BaseException], message: str
) -> None:
    ledger = two_group_ledger()
    before = snapshot(ledger)
    with pytest.raises(error, match=starts_with(message)):
        build_rollout_recovery_state(
            ledger, sampler_stamps_target_steps=True, **{"batch_shortfall": {}, **kwargs}
        )
    assert snapshot(ledger) == before


def test_build_filters_canonical_groups_and_keeps_only_their_observations() -> None:
    ledger = two_group_ledger()
    before = snapshot(ledger)
    state = build_rollout_recovery_state(
        ledger,
        batch_shortfall={},
        sampler_stamps_target_steps=True,
        finalizer_metrics_by_group={"c": {"m": 1.0}, "trained": {"m": 2.0}, "u": {"m": 3.0}},
        finalizer_rewards_by_group={"c": [observation("c", 0)], "trained": [observation("t", 0)]},
        canonical_group_ids={"c", "elsewhere"},
    )
    assert [g["group_id"] for g in state["groups"]] == ["u"]
    assert state["finalizer_metrics_by_group"] == {"c": {"m": 1.0}}
    assert state["finalizer_rewards_by_group"] == {"c": [dataclasses.asdict(observation("c", 0))]}
    assert snapshot(ledger) == before, "building a sidecar must not change the ledger"
    assert "c" in ledger


def test_build_with_empty_canonical_set_keeps_groups_and_drops_observations() -> None:
    ledger = two_group_ledger()
    state = build_rollout_recovery_state(
        ledger,
        batch_shortfall={},
        sampler_stamps_target_steps=True,
        finalizer_metrics_by_group={"c": {"m": 1.0}},
        canonical_group_ids=set(),
    )
    assert [g["group_id"] for g in state["groups"]] == ["c", "u"]
    assert state["finalizer_metrics_by_group"] == {}


def test_build_without_canonical_ids_keeps_everything() -> None:
    state = build_rollout_recovery_state(
        two_group_ledger(),
        batch_shortfall={},
        sampler_stamps_target_steps=True,
        finalizer_metrics_by_group={"x": {"m": 1.0}},
        finalizer_rewards_by_group={"x": [observation("x", 0)]},
    )
    assert [g["group_id"] for g in state["groups"]] == ["c", "u"]
    assert set(state["finalizer_metrics_by_group"]) == {"x"}
    assert set(state["finalizer_rewards_by_group"]) == {"x"}


def test_build_copies_its_inputs() -> None:
    ledger = two_group_ledger()
    shortfall = {7: 1}
    metrics = {"c": {"m": 1.0}}
    rewards = {"c": [observation("c", 0)]}
    state = build_rollout_recovery_state(
        ledger,
        batch_shortfall=shortfall,
        sampler_stamps_target_steps=True,
        finalizer_metrics_by_group=metrics,
        finalizer_rewards_by_group=rewards,
    )
    reference = copy.deepcopy(state)
    shortfall[8] = 2
    metrics["c"]["m"] = 9.0
    metrics["d"] = {}
    rewards["c"].append(observation("c", 1))
    assert state == reference
    before = snapshot(ledger)
    state["groups"][0]["status"] = "finalizing"
    state["groups"].clear()
    assert snapshot(ledger) == before


def test_checkpoint_state_round_trip_preserves_controller_and_ledger_state() -> None:
    ledger = two_group_ledger()
    capture = settings()
    rewards = {"done": [observation("done", 0), observation("done", 1, -0.5)]}
    state = build_rollout_recovery_state(
        ledger,
        batch_shortfall={7: 1},
        sampler_stamps_target_steps=True,
        finalizer_metrics_by_group={"done": {"finalize/reward_count": 2.0}},
        finalizer_rewards_by_group=rewards,
        reward_settings=capture,
        canonical_group_ids={"done"},
    )
    parsed = parse_rollout_recovery_state(copy.deepcopy(state))
    assert isinstance(parsed, ParsedRolloutRecoveryState)
    assert parsed.batch_shortfall == {7: 1}
    assert parsed.sampler_stamps_target_steps is True
    assert parsed.finalizer_metrics_by_group == {"done": {"finalize/reward_count": 2.0}}
    assert parsed.finalizer_rewards_by_group == rewards
    assert parsed.reward_settings == capture
    assert parsed.ledger_state == ledger.state_dict()
    restored = RolloutRecoveryLedger()
    restored.load_state_dict(CUT, parsed.ledger_state)
    for record in restored.groups():
        restored.bind_runtime_prompt(CUT, record.group_id, {"idx": int(record.prompt_id)})
    # task_name None matches {"idx": n}.get("task_name") -> None
    assert restored.state_dict() == ledger.state_dict()
    assert restored.expected_staging_keys() == ledger.expected_staging_keys()


def test_checkpoint_preserves_pending_finalizer_metrics_independently_of_sealed_groups() -> None:
    ledger = RolloutRecoveryLedger()  # every group already canonical: the ledger is empty
    metrics = {"canonical": {"finalize/reward_count": 3, "finalize/reward_sum": 1.5}}
    state = build_rollout_recovery_state(
        ledger,
        batch_shortfall={},
        sampler_stamps_target_steps=False,
        finalizer_metrics_by_group=metrics,
        canonical_group_ids={"canonical"},
    )
    assert state["groups"] == []
    parsed = parse_rollout_recovery_state(state)
    expected = {"canonical": {"finalize/reward_count": 3.0, "finalize/reward_sum": 1.5}}
    assert parsed.finalizer_metrics_by_group == expected
    state["finalizer_metrics_by_group"]["canonical"]["finalize/reward_sum"] = 99.0
    metrics["canonical"]["finalize/reward_count"] = 99
    assert parsed.finalizer_metrics_by_group == expected


# --------------------------------------------------------------------------------------------
# parse (§4.2)


def test_parse_splits_the_sidecar_by_owner() -> None:
    parsed = parse_rollout_recovery_state(minimal_sidecar())
    assert parsed.ledger_state == {"schema_version": 3, "groups": []}
    assert parsed.batch_shortfall == {}
    assert parsed.sampler_stamps_target_steps is False
    assert parsed.finalizer_metrics_by_group == {}
    assert parsed.finalizer_rewards_by_group == {}
    assert parsed.reward_settings is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.batch_shortfall = {}  # type: ignore[misc]


def test_parse_does_not_validate_group_contents() -> None:
    groups = [{"anything": 1}]
    parsed = parse_rollout_recovery_state(minimal_sidecar(groups=groups))
    assert parsed.ledger_state == {"schema_version": 3, "groups": groups}
    with pytest.raises(ValueError, match=starts_with("rollout-recovery group contains unknown")):
        RolloutRecoveryLedger.from_state_dict(parsed.ledger_state)


def test_parse_defaults_absent_shortfall_and_sampler_flag() -> None:
    state = minimal_sidecar()
    del state["batch_shortfall"]
    del state["sampler_stamps_target_steps"]
    parsed = parse_rollout_recovery_state(state)
    assert parsed.batch_shortfall == {}
    assert parsed.sampler_stamps_target_steps is None
    assert (
        parse_rollout_recovery_state(
            minimal_sidecar(sampler_stamps_target_steps=None)
        ).sampler_stamps_target_steps
        is None
    )


def test_checkpoint_parser_defaults_fields_absent_from_older_state() -> None:
    # Upstream's v5 reader defaulted these; in schema 3 the three finalizer/reward keys are
    # required, so a bare ledger state is refused with the "is missing" error.
    bare = two_group_ledger().state_dict()
    with pytest.raises(
        ValueError, match=starts_with("rollout recovery sidecar is missing 'reward_settings'")
    ):
        parse_rollout_recovery_state(bare)


@pytest.mark.parametrize(
    "key", ["reward_settings", "finalizer_metrics_by_group", "finalizer_rewards_by_group"]
)
def test_parse_requires_the_schema_3_keys(key: str) -> None:
    state = minimal_sidecar()
    del state[key]
    with pytest.raises(
        ValueError, match=starts_with(f"rollout recovery sidecar is missing {key!r}")
    ):
        parse_rollout_recovery_state(state)


def test_parse_parses_reward_settings() -> None:
    capture = settings()
    parsed = parse_rollout_recovery_state(minimal_sidecar(reward_settings=capture.state_dict()))
    assert parsed.reward_settings == capture
    assert isinstance(parsed.reward_settings, CaptureRewardSettings)


def _rewards(*rows: Any) -> dict[str, Any]:
    return {"c": list(rows)}


OBS = dataclasses.asdict(observation("c", 0))

BAD_SIDECARS: list[tuple[str, Any, type[BaseException], str]] = [
    # 1
    ("r1-list", [], TypeError, "rollout recovery sidecar must contain a dictionary, got list"),
    (
        "r1-none",
        None,
        TypeError,
        "rollout recovery sidecar must contain a dictionary, got NoneType",
    ),
    # 2
    (
        "r2-unknown",
        minimal_sidecar(unexpected=1),
        ValueError,
        "rollout recovery sidecar contains unknown fields: ['unexpected']",
    ),
    # 3
    (
        "r3-schema-2",
        minimal_sidecar(schema_version=2),
        ValueError,
        "unsupported rollout recovery schema_version=2; supported versions are [3]",
    ),
    (
        "r3-schema-4",
        minimal_sidecar(schema_version=4),
        ValueError,
        "unsupported rollout recovery schema_version=4; supported versions are [3]",
    ),
    (
        "r3-schema-bool",
        minimal_sidecar(schema_version=True),
        ValueError,
        "unsupported rollout recovery schema_version=True; supported versions are [3]",
    ),
    (
        "r3-schema-str",
        minimal_sidecar(schema_version="3"),
        ValueError,
        "unsupported rollout recovery schema_version='3'; supported versions are [3]",
    ),
    (
        "r3-schema-missing",
        {k: v for k, v in minimal_sidecar().items() if k != "schema_version"},
        ValueError,
        "unsupported rollout recovery schema_version=None; supported versions are [3]",
    ),
    # 4
    (
        "r4-groups-dict",
        minimal_sidecar(groups={}),
        TypeError,
        "rollout recovery groups must be a list",
    ),
    (
        "r4-groups-missing",
        {k: v for k, v in minimal_sidecar().items() if k != "groups"},
        TypeError,
        "rollout recovery groups must be a list",
    ),
    # 5
    (
        "r5-stamps-str",
        minimal_sidecar(sampler_stamps_target_steps="yes"),
        TypeError,
        "rollout recovery sampler_stamps_target_steps must be a boolean",
    ),
    (
        "r5-stamps-int",
        minimal_sidecar(sampler_stamps_target_steps=1),
        TypeError,
        "rollout recovery sampler_stamps_target_steps must be a boolean",
    ),
    # 7
    (
        "r7-settings-unknown-keys",
        minimal_sidecar(reward_settings={"version": 1, "penalties": {}}),
        ValueError,
        "invalid capture reward_settings record",
    ),
    (
        "r7-settings-version",
        minimal_sidecar(reward_settings={"version": 2, "penalties": {}, "effort": None}),
        ValueError,
        "unsupported capture reward_settings version=2",
    ),
    # 8
    (
        "r8-metrics-list",
        minimal_sidecar(finalizer_metrics_by_group=[]),
        ValueError,
        "finalizer_metrics_by_group must be a mapping",
    ),
    (
        "r8-metrics-none",
        minimal_sidecar(finalizer_metrics_by_group=None),
        ValueError,
        "finalizer_metrics_by_group must be a mapping",
    ),
    (
        "r8-metrics-int-group",
        minimal_sidecar(finalizer_metrics_by_group={1: {}}),
        ValueError,
        "invalid finalizer metrics group",
    ),
    (
        "r8-metrics-group-list",
        minimal_sidecar(finalizer_metrics_by_group={"c": []}),
        ValueError,
        "invalid finalizer metrics group",
    ),
    (
        "r8-metric-bool",
        minimal_sidecar(finalizer_metrics_by_group={"c": {"m": True}}),
        ValueError,
        "invalid finalizer metric name or value",
    ),
    (
        "r8-metric-str",
        minimal_sidecar(finalizer_metrics_by_group={"c": {"m": "1.0"}}),
        ValueError,
        "invalid finalizer metric name or value",
    ),
    (
        "r8-metric-none",
        minimal_sidecar(finalizer_metrics_by_group={"c": {"m": None}}),
        ValueError,
        "invalid finalizer metric name or value",
    ),
    (
        "r8-metric-int-name",
        minimal_sidecar(finalizer_metrics_by_group={"c": {1: 1.0}}),
        ValueError,
        "invalid finalizer metric name or value",
    ),
    # 9
    (
        "r9-rewards-list",
        minimal_sidecar(finalizer_rewards_by_group=[]),
        ValueError,
        "finalizer_rewards_by_group must be a mapping",
    ),
    (
        "r9-rewards-group-dict",
        minimal_sidecar(finalizer_metrics_by_group={"c": {}}, finalizer_rewards_by_group={"c": {}}),
        ValueError,
        "invalid finalized reward group",
    ),
    (
        "r9-rewards-int-group",
        minimal_sidecar(finalizer_rewards_by_group={1: []}),
        ValueError,
        "invalid finalized reward group",
    ),
    (
        "r9-row-missing-field",
        minimal_sidecar(
            finalizer_metrics_by_group={"c": {}},
            finalizer_rewards_by_group=_rewards({k: v for k, v in OBS.items() if k != "reward"}),
        ),
        ValueError,
        "invalid finalized reward observation",
    ),
    (
        "r9-row-extra-field",
        minimal_sidecar(
            finalizer_metrics_by_group={"c": {}},
            finalizer_rewards_by_group=_rewards({**OBS, "x": 1}),
        ),
        ValueError,
        "invalid finalized reward observation",
    ),
    (
        "r9-row-object-not-state",
        minimal_sidecar(
            finalizer_metrics_by_group={"c": {}},
            finalizer_rewards_by_group=_rewards(observation("c", 0)),
        ),
        ValueError,
        "invalid finalized reward observation",
    ),
    (
        "r9-row-reward-bool",
        minimal_sidecar(
            finalizer_metrics_by_group={"c": {}},
            finalizer_rewards_by_group=_rewards({**OBS, "reward": True}),
        ),
        ValueError,
        "finalized reward must be numeric",
    ),
    (
        "r9-row-empty-sample",
        minimal_sidecar(
            finalizer_metrics_by_group={"c": {}},
            finalizer_rewards_by_group=_rewards({**OBS, "sample_id": ""}),
        ),
        ValueError,
        "finalized reward identifiers must be nonempty strings",
    ),
    (
        "r9-row-bad-context",
        minimal_sidecar(
            finalizer_metrics_by_group={"c": {}},
            finalizer_rewards_by_group=_rewards({**OBS, "log_context": {"agent_name": "a"}}),
        ),
        ValueError,
        "invalid reward log context",
    ),
    (
        "r9-duplicate-sample",
        minimal_sidecar(
            finalizer_metrics_by_group={"c": {}},
            finalizer_rewards_by_group=_rewards(OBS, {**OBS, "rollout_id": "other"}),
        ),
        ValueError,
        "duplicate finalized reward sample",
    ),
    # 10
    (
        "r10-rewards-without-metrics",
        minimal_sidecar(finalizer_rewards_by_group=_rewards(OBS)),
        ValueError,
        "finalized reward observations require matching group metrics",
    ),
    # 11
    (
        "r11-shortfall-list",
        minimal_sidecar(batch_shortfall=[]),
        TypeError,
        "rollout recovery batch_shortfall must be a dictionary",
    ),
    (
        "r11-shortfall-none",
        minimal_sidecar(batch_shortfall=None),
        TypeError,
        "rollout recovery batch_shortfall must be a dictionary",
    ),
    (
        "r11-shortfall-bool-step",
        minimal_sidecar(batch_shortfall={True: 1}),
        ValueError,
        "rollout recovery batch_shortfall entries must contain non-negative integer steps and "
        "counts, got True: 1",
    ),
    (
        "r11-shortfall-negative-count",
        minimal_sidecar(batch_shortfall={7: -1}),
        ValueError,
        "rollout recovery batch_shortfall entries must contain non-negative integer steps and "
        "counts, got 7: -1",
    ),
    (
        "r11-shortfall-negative-step",
        minimal_sidecar(batch_shortfall={-1: 1}),
        ValueError,
        "rollout recovery batch_shortfall entries must contain non-negative integer steps and "
        "counts, got -1: 1",
    ),
    (
        "r11-shortfall-str-step",
        minimal_sidecar(batch_shortfall={"7": 1}),
        ValueError,
        "rollout recovery batch_shortfall entries must contain non-negative integer steps and "
        "counts, got '7': 1",
    ),
    (
        "r11-shortfall-bool-count",
        minimal_sidecar(batch_shortfall={7: False}),
        ValueError,
        "rollout recovery batch_shortfall entries must contain non-negative integer steps and "
        "counts, got 7: False",
    ),
    (
        "r11-shortfall-float-count",
        minimal_sidecar(batch_shortfall={7: 1.0}),
        ValueError,
        "rollout recovery batch_shortfall entries must contain non-negative integer steps and "
        "counts, got 7: 1.0",
    ),
]


@pytest.mark.parametrize(
    ("state", "error", "message"), [c[1:] for c in BAD_SIDECARS], ids=[c[0] for c in BAD_SIDECARS]
)
def test_parse_rejects_an_invalid_sidecar(
    state: Any, error: type[BaseException], message: str
) -> None:
    if message.startswith(("invalid capture", "unsupported capture")):
        settings()  # skip while CaptureRewardSettings is not implemented
    with pytest.raises(error, match=starts_with(message)):
        parse_rollout_recovery_state(copy.deepcopy(state))


def test_parse_rejects_sidecar_unknown_fields_even_when_otherwise_valid() -> None:
    state = build_rollout_recovery_state(
        two_group_ledger(), batch_shortfall={}, sampler_stamps_target_steps=True
    )
    state["open_train_step"] = None
    with pytest.raises(
        ValueError,
        match=starts_with("rollout recovery sidecar contains unknown fields: ['open_train_step']"),
    ):
        parse_rollout_recovery_state(state)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda state: state["batch_shortfall"].__setitem__(8, 5),
        lambda state: state["finalizer_metrics_by_group"]["c"].__setitem__("m", 9.0),
        lambda state: state["finalizer_metrics_by_group"].__setitem__("d", {}),
        lambda state: state["finalizer_rewards_by_group"]["c"].clear(),
        lambda state: state["finalizer_rewards_by_group"]["c"][0].__setitem__("reward", 9.0),
    ],
    ids=["shortfall", "metric-value", "metric-group", "reward-list", "reward-row"],
)
def test_parse_returns_defensive_copies(mutate: Callable[[dict[str, Any]], Any]) -> None:
    state = minimal_sidecar(
        batch_shortfall={7: 1},
        finalizer_metrics_by_group={"c": {"m": 1.0}},
        finalizer_rewards_by_group=_rewards(copy.deepcopy(OBS)),
    )
    parsed = parse_rollout_recovery_state(state)
    expected = (
        {7: 1},
        {"c": {"m": 1.0}},
        {"c": [FinalizedReward.from_state_dict(OBS)]},
    )
    mutate(state)
    assert (
        parsed.batch_shortfall,
        parsed.finalizer_metrics_by_group,
        parsed.finalizer_rewards_by_group,
    ) == expected


def test_parse_converts_metric_values_to_float() -> None:
    parsed = parse_rollout_recovery_state(
        minimal_sidecar(finalizer_metrics_by_group={"c": {"count": 3}})
    )
    value = parsed.finalizer_metrics_by_group["c"]["count"]
    assert value == 3.0 and type(value) is float


def test_parse_keeps_reward_groups_that_have_metrics() -> None:
    parsed = parse_rollout_recovery_state(
        minimal_sidecar(
            finalizer_metrics_by_group={"c": {}, "d": {"m": 1.0}},
            finalizer_rewards_by_group={"c": [OBS], "d": []},
        )
    )
    assert parsed.finalizer_rewards_by_group == {
        "c": [FinalizedReward.from_state_dict(OBS)],
        "d": [],
    }
    assert all(isinstance(row, FinalizedReward) for row in parsed.finalizer_rewards_by_group["c"])
