"""ControllerState: exact round trip; a damaged or foreign file is refused with its path;
the fold of history records into it."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_recovery.control._state import (
    CONTROLLER_STATE_VERSION,
    ControllerState,
    RunCounters,
    decode_controller_state,
    encode_controller_state,
)
from rollout_recovery.errors import InvalidStateError
from rollout_recovery.history.records import (
    AbandonedAttempt,
    AttemptsAbandoned,
    FreshAttempt,
    GroupSealed,
    RoundStarted,
    Seal,
    SiblingSealed,
)
from rollout_recovery.rollout import FailureReason

REQUIRED = (
    "step",
    "weight_version",
    "highest_weight_version",
    "prompts_taken",
    "rounds_used",
    "shortfall",
    "steps_without_valid_rows",
    "lineage",
    "counters",
    "config",
    "identity",
)


def sample_state(**changes: Any) -> ControllerState:
    fields: dict[str, Any] = {
        "step": 7,
        "weight_version": 9,
        "highest_weight_version": 12,
        "prompts_taken": 41,
        "rounds_used": {"g-1": 2, "g-2": 1},
        "shortfall": {7: 1, 8: 2},
        "steps_without_valid_rows": 0,
        "lineage": [0, 1, 2, 9],
        "counters": RunCounters(attempts=50, retries=3, prompts_dropped=1),
        "config": {"job": {"seed": 3, "name": "run"}, "checkpoint": {"keep": 2, "every": 1.5}},
        "identity": "sha256:abc",
    }
    fields.update(changes)
    return ControllerState(**fields)


def as_builtins(state: ControllerState) -> dict[str, Any]:
    return msgspec.to_builtins(state)


def encode_dict(fields: dict[str, Any]) -> bytes:
    return msgspec.msgpack.encode(fields)


def refused(data: bytes) -> InvalidStateError:
    with pytest.raises(InvalidStateError) as caught:
        decode_controller_state(data)
    return caught.value


# -- round trip -------------------------------------------------------------------------------


def test_round_trip_of_a_sample_state() -> None:
    state = sample_state()
    decoded = decode_controller_state(encode_controller_state(state))
    assert decoded == state
    assert decoded.format == "rollout-recovery-controller-state"
    assert decoded.version == CONTROLLER_STATE_VERSION


INTS = st.integers(-(2**63), 2**64 - 1)
NAMES = st.text(max_size=10)
CONFIG_VALUES = st.recursive(
    st.none() | st.booleans() | INTS | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(
    step=INTS,
    prompts_taken=INTS,
    rounds_used=st.dictionaries(NAMES, INTS, max_size=5),
    shortfall=st.dictionaries(INTS, INTS, max_size=4),
    lineage=st.lists(INTS, max_size=5),
    attempts=INTS,
    config=st.dictionaries(NAMES, CONFIG_VALUES, max_size=5),
    identity=st.text(max_size=20),
)
def test_round_trip_is_exact(
    step: int,
    prompts_taken: int,
    rounds_used: dict[str, int],
    shortfall: dict[int, int],
    lineage: list[int],
    attempts: int,
    config: dict[str, Any],
    identity: str,
) -> None:
    state = sample_state(
        step=step,
        prompts_taken=prompts_taken,
        rounds_used=rounds_used,
        shortfall=shortfall,
        lineage=lineage,
        counters=RunCounters(attempts=attempts),
        config=config,
        identity=identity,
    )
    data = encode_controller_state(state)
    decoded = decode_controller_state(data)
    assert decoded == state
    assert encode_controller_state(decoded) == data


# -- damaged bytes ----------------------------------------------------------------------------


def test_every_truncation_is_refused() -> None:
    data = encode_controller_state(sample_state())
    for length in range(len(data)):
        error = refused(data[:length])
        assert "controller state" in str(error)


def test_trailing_bytes_are_refused() -> None:
    data = encode_controller_state(sample_state())
    error = refused(data + b"\xc0")
    assert "not MessagePack" in str(error)


@pytest.mark.parametrize("data", [b"", b"\xc1", b'{"step": 1}', b"\xff" * 10])
def test_bytes_that_are_not_msgpack_are_refused(data: bytes) -> None:
    refused(data)


@pytest.mark.parametrize("top", [[1, 2], 3, "state", None])
def test_a_top_level_that_is_not_a_map_is_refused(top: Any) -> None:
    error = refused(msgspec.msgpack.encode(top))
    assert "Expected `object`" in str(error)


def test_the_error_is_a_value_error() -> None:
    assert issubclass(InvalidStateError, ValueError)


# -- damaged fields ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("step", "7", "$.step"),
        ("step", True, "$.step"),
        ("step", 7.0, "$.step"),
        ("prompts_taken", None, "$.prompts_taken"),
        ("rounds_used", [1, 2], "$.rounds_used"),
        ("rounds_used", {"g-1": "two"}, "$.rounds_used[...]"),
        ("shortfall", {"x": 1}, "$.shortfall"),
        ("lineage", [1, "2"], "$.lineage[1]"),
        ("counters", "none", "$.counters"),
        ("counters", {"attempts": 1.5}, "$.counters.attempts"),
        ("config", [], "$.config"),
        ("config", {3: "x"}, "$.config"),
        ("identity", b"abc", "$.identity"),
        ("identity", 5, "$.identity"),
        ("format", "nemo-rl-sidecar", "$.format"),
        ("version", "1", "$.version"),
    ],
)
def test_a_wrong_type_at_a_field_names_the_field(field: str, value: Any, path: str) -> None:
    fields = as_builtins(sample_state())
    fields[field] = value
    error = refused(encode_dict(fields))
    assert error.path == path
    assert str(error).startswith("invalid controller state")


@pytest.mark.parametrize("version", [0, 2, -1, 2**40])  # 2: before the journal
def test_a_wrong_version_is_refused_at_the_version(version: int) -> None:
    fields = as_builtins(sample_state())
    fields["version"] = version
    error = refused(encode_dict(fields))
    assert error.path == "$.version"
    assert f"version {version} is not supported" in str(error)


def test_an_unknown_field_is_refused_and_named() -> None:
    fields = as_builtins(sample_state())
    fields["retry_budget"] = 3
    error = refused(encode_dict(fields))
    assert "unknown field `retry_budget`" in str(error)
    assert error.path in (None, "$")


@pytest.mark.parametrize("field", REQUIRED)
def test_a_missing_required_field_is_refused_and_named(field: str) -> None:
    fields = as_builtins(sample_state())
    del fields[field]
    error = refused(encode_dict(fields))
    assert f"missing required field `{field}`" in str(error)


def test_missing_format_and_version_take_their_defaults() -> None:
    fields = as_builtins(sample_state())
    del fields["format"], fields["version"]
    assert decode_controller_state(encode_dict(fields)) == sample_state()


def test_the_initial_state_names_its_version_and_nothing_else() -> None:
    state = ControllerState.initial(5)
    assert (state.step, state.weight_version, state.highest_weight_version) == (0, 5, 5)
    assert state.lineage == [5] and state.rounds_used == {} and state.shortfall == {}
    assert decode_controller_state(encode_controller_state(state)) == state


def _round(group: str, number: int) -> RoundStarted:
    return RoundStarted(
        group_id=group,
        round=number,
        dispatched=[FreshAttempt(0, f"{group}_g0_a{number:032x}")],
        weight_version=0,
    )


def _abandoned(group: str, number: int, reason: FailureReason) -> AttemptsAbandoned:
    return AttemptsAbandoned(
        group_id=group,
        attempts=[AbandonedAttempt(0, f"{group}_g0_a{number:032x}", reason)],
    )


def test_a_round_a_crash_interrupted_goes_back_to_the_retry_budget() -> None:
    state = ControllerState.initial(0)
    state.apply(_round("g1", 1))
    state.apply(_abandoned("g1", 1, FailureReason.ATTEMPT_FAILED))  # the prompt's round failed
    state.apply(_round("g1", 2))
    assert state.rounds_used == {"g1": 2} and state.counters.retries == 1
    # A restart abandons the attempts round 2 had in flight: round 2 is given back.
    state.apply(_abandoned("g1", 2, FailureReason.RESTART))
    assert state.rounds_used == {"g1": 1} and state.counters.retries == 1
    state.apply(_round("g1", 2))
    assert state.rounds_used == {"g1": 2}
    # Never below zero, and a group with no round is left alone.
    state.apply(_abandoned("g2", 1, FailureReason.RESTART))
    assert "g2" not in state.rounds_used


def _seal(rollout_id: str, *, tokens: int, inherited: int, calls: int) -> Seal:
    return Seal(
        generation_index=0,
        rollout_id=rollout_id,
        receipt={},
        reward=1.0,
        mask_sample=False,
        tokens=tokens,
        inherited_calls=calls,
        inherited_tokens=inherited,
    )


def test_the_fold_counts_generated_and_resumed_tokens_apart() -> None:
    state = ControllerState.initial(0)
    state.apply(SiblingSealed(group_id="g", seal=_seal("a", tokens=14, inherited=8, calls=2)))
    state.apply(
        GroupSealed(
            group_id="h",
            seals=[
                _seal("b", tokens=14, inherited=0, calls=0),
                _seal("c", tokens=6, inherited=6, calls=1),
            ],
        )
    )
    counters = state.counters
    assert counters.tokens_generated == 6 + 14 + 0
    assert (counters.calls_resumed, counters.tokens_resumed) == (3, 14)


@given(rounds=st.integers(1, 5), restarts=st.integers(0, 5), failures=st.integers(0, 5))
def test_a_round_a_restart_interrupted_is_not_counted_against_the_budget(
    rounds: int, restarts: int, failures: int
) -> None:
    """Rounds ended by a failure count; a restart's abandon gives its round back."""
    state = ControllerState.initial(0)
    for number in range(1, rounds + 1):
        state.apply(RoundStarted(group_id="g", round=number, dispatched=[], weight_version=0))
    for _ in range(failures):
        state.apply(_abandoned_g(FailureReason.ATTEMPT_FAILED))
    for _ in range(restarts):
        state.apply(_abandoned_g(FailureReason.RESTART))
    assert state.rounds_used["g"] == max(0, rounds - restarts)
    assert state.counters.retries == failures


def _abandoned_g(reason: FailureReason) -> AttemptsAbandoned:
    return AttemptsAbandoned(
        group_id="g", attempts=[AbandonedAttempt(0, "g_g0_a1", reason)], whole_group=False
    )
