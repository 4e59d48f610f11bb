"""NeMo-RL's Gym lineage (``attempt_index``, capture keys ``<logical>-a<N>``) beside ours.

The goldens in ``data/`` were written by real torch 2.13 (``make_golden_gym.py``). Both
formats read either lineage and say which; a state mixing them, or an attempt whose gate id
is the other lineage's, is refused naming the field; no ledger of this package ever loads
a Gym attempt. ``docs/nemo-rl-lineages.md`` lists the facts and their sources.
"""

from __future__ import annotations

import copy
import datetime
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from make_golden_gym import (
    DATA,
    GOLDEN_NATIVE,
    GOLDEN_PT,
    GOLDEN_PT_BUFFER,
    bare_attempt,
    capture_key,
    gym_sidecar,
)
from sidecar_fixtures import rich_state
from test_torch_pt import assert_identical

from rollout_recovery import RolloutRecoveryLedger, parse_rollout_recovery_state
from rollout_recovery.checkpoint import SidecarFormat, load_sidecar, write_sidecar
from rollout_recovery.checkpoint._native import _wrap, read_native_envelope
from rollout_recovery.checkpoint._sidecar_io import (
    LoadedGymSidecar,
    LoadedSidecar,
    _load_bytes,
    decode_sidecar,
    encode_sidecar,
)
from rollout_recovery.checkpoint._torch_pt import decode_torch_pt, encode_torch_pt
from rollout_recovery.errors import InvalidStateError, InvalidStateTypeError, SidecarFormatError
from rollout_recovery.ledger.codec_support import SidecarLineage, parse_gym_sidecar

FORMATS = ("pt", "native")
MIXED = "$.groups[3].siblings[0].attempts[1].attempt_index"
NOT_REUSED = "an attempt of one lineage is never read as an attempt of the other"


def write(tmp_path: Path, state: dict[str, Any], fmt: str, *, validate: bool = True) -> Path:
    path = tmp_path / f"sidecar-{fmt}.bin"  # a name that says nothing of format or lineage
    path.write_bytes(encode_sidecar(state, format=fmt, validate=validate))
    return path


def refused(action: Any) -> InvalidStateError:
    with pytest.raises(InvalidStateError) as caught:
        action()
    return caught.value


# -- the goldens -------------------------------------------------------------------------


@pytest.mark.parametrize("name", [GOLDEN_PT, GOLDEN_PT_BUFFER])
def test_the_torch_written_goldens_read_to_the_generators_dict(name: str) -> None:
    assert_identical(decode_torch_pt((DATA / name).read_bytes()), gym_sidecar())


@pytest.mark.parametrize("name", [GOLDEN_PT, GOLDEN_PT_BUFFER, GOLDEN_NATIVE])
def test_each_golden_loads_as_the_gym_lineage(name: str) -> None:
    loaded = load_sidecar(DATA / name)
    assert isinstance(loaded, LoadedGymSidecar)
    assert loaded.lineage is SidecarLineage.GYM
    assert_identical(loaded.state, gym_sidecar())
    summary = loaded.summary()
    assert summary["lineage"] == {
        "name": "gym",
        "attempt_identity": "attempt_index",
        "capture_keys": "<logical> for attempt 0, <logical>-a<N> after",
    }
    assert summary["groups"]["total"] == 4
    assert summary["siblings"]["attempts_total"] == 15
    # Sealed current attempts: grp-0 g0 (1 call) and g1 (3); grp-1 g0 (no receipt) and
    # g1 (3); grp-3 g0 (2).
    assert summary["staging_keys"] == {"expected": 9, "sealed_without_receipt": 1}
    assert summary["gym"] == {
        "resolved_agents": {"math_agent": 3},
        "completion_receipts": 5,
        "pending_acknowledgements": 2,
        "highest_attempt_index": 2,
    }


def test_the_native_golden_payload_is_what_the_encoder_writes_today() -> None:
    # The envelope names the writer's version; the payload is a pure function of the state.
    golden = read_native_envelope((DATA / GOLDEN_NATIVE).read_bytes()).payload
    assert read_native_envelope(encode_sidecar(gym_sidecar())).payload == golden


def test_a_native_gym_payload_holds_only_sidecar_primitives() -> None:
    # The Gym payload is read untyped, past the uuid schema's own refusals of these.
    state = gym_sidecar()
    extra = state["groups"][0]["siblings"][0]["attempts"][0]["receipt"]["extra"]
    extra["when"] = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)  # a timestamp ext
    error = refused(lambda: SidecarFormat.decode(_wrap(msgspec.msgpack.encode(state))))
    assert not isinstance(error, SidecarFormatError)
    assert error.path == "$.groups[0].siblings[0].attempts[0].receipt.extra.when"
    extra["when"] = msgspec.msgpack.Ext(7, b"x")
    with pytest.raises(SidecarFormatError, match="extension type 7"):
        SidecarFormat.decode(_wrap(msgspec.msgpack.encode(state)))


def test_our_pt_encoding_of_the_golden_state_is_what_torch_reads() -> None:
    torch = pytest.importorskip("torch")
    import io

    data = encode_sidecar(gym_sidecar(), format="pt")
    assert_identical(torch.load(io.BytesIO(data), weights_only=True), gym_sidecar())


def test_the_capture_keys_are_the_gym_lineages() -> None:
    state = gym_sidecar()
    grp0 = state["groups"][0]["siblings"]
    assert grp0[0]["attempts"][0]["receipt"]["rollout_id"] == "grp-0_g0"
    assert grp0[1]["attempts"][1]["receipt"]["rollout_id"] == "grp-0_g1-a1"
    assert [a["attempt_index"] for a in grp0[2]["attempts"]] == [0, 1, 2]
    assert capture_key("grp-0_g2", 2) == "grp-0_g2-a2"


# -- detection -------------------------------------------------------------------------


def test_lineage_is_told_from_content() -> None:
    assert SidecarFormat.lineage(gym_sidecar()) is SidecarLineage.GYM
    assert SidecarFormat.lineage(rich_state()) is SidecarLineage.UUID
    ledger_state = {"schema_version": 3, "groups": gym_sidecar()["groups"]}
    assert SidecarFormat.lineage(ledger_state) is SidecarLineage.GYM  # by its first attempt
    ours = {"schema_version": 3, "groups": rich_state()["groups"]}
    assert SidecarFormat.lineage(ours) is SidecarLineage.UUID
    assert SidecarFormat.lineage({"schema_version": 3, "groups": []}) is SidecarLineage.UUID
    # No attempt to tell by: a Gym group still names its resolved agent (None until sealed).
    bare = copy.deepcopy(ledger_state["groups"][:1])
    for sibling in bare[0]["siblings"]:
        sibling["attempts"] = []
    assert SidecarFormat.lineage({"schema_version": 3, "groups": bare}) is SidecarLineage.GYM
    assert SidecarFormat.lineage((DATA / GOLDEN_NATIVE).read_bytes()) is SidecarLineage.GYM


def test_a_top_level_of_both_lineages_is_refused() -> None:
    state = {**gym_sidecar(), "reward_settings": None}
    error = refused(lambda: SidecarFormat.lineage(state))
    assert error.path == "$.pending_completed_execution_acknowledgements"
    assert "both lineages" in error.message
    assert [p.path for p in SidecarFormat.find_problems(state)] == [error.path]


# -- the hostile mixes -----------------------------------------------------------------


def _uuid_attempt_in_gym() -> dict[str, Any]:
    state = gym_sidecar()
    del state["groups"][3]["siblings"][0]["attempts"][1]["attempt_index"]
    return state


def _gym_attempt_in_uuid() -> dict[str, Any]:
    state = rich_state()
    state["groups"][3]["siblings"][0]["attempts"][1]["attempt_index"] = 1
    return state


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_uuid_attempt_in_a_gym_sidecar_is_refused_at_its_attempt_index(
    tmp_path: Path, fmt: str
) -> None:
    state = _uuid_attempt_in_gym()
    path = write(tmp_path, state, fmt, validate=False)
    for error in (refused(lambda: load_sidecar(path)), refused(lambda: parse_gym_sidecar(state))):
        assert error.path == MIXED
        assert error.message.startswith("missing attempt_index: this is a Gym-lineage state")
        assert NOT_REUSED in error.message
    assert [p.path for p in SidecarFormat.find_problems(state)] == [MIXED]
    # Nor does the uuid lineage's reader take the file: the whole state is the Gym's.
    error = refused(lambda: parse_rollout_recovery_state(state))
    assert error.path == "$.pending_completed_execution_acknowledgements"


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_gym_attempt_in_a_uuid_sidecar_is_refused_at_its_attempt_index(
    tmp_path: Path, fmt: str
) -> None:
    state = _gym_attempt_in_uuid()
    path = write(tmp_path, state, fmt, validate=False)
    ledger_state = parse_rollout_recovery_state(state).ledger_state
    for error in (
        refused(lambda: load_sidecar(path)),
        refused(lambda: RolloutRecoveryLedger.from_state_dict(ledger_state)),
        refused(lambda: SidecarFormat.decode(path.read_bytes()) and load_sidecar(path)),
    ):
        assert error.path == MIXED
        assert error.message.startswith("attempt_index names a Gym-lineage attempt")
        assert NOT_REUSED in error.message
    problems = SidecarFormat.find_problems(state)
    assert [p.path for p in problems] == [MIXED]
    assert "uuid-lineage state (its field 'finalizer_metrics_by_group')" in problems[0].message


def test_every_mismatched_attempt_is_listed_not_only_the_first() -> None:
    state = rich_state()
    for group in (1, 3):
        state["groups"][group]["siblings"][0]["attempts"][0]["attempt_index"] = 0
    assert [p.path for p in SidecarFormat.find_problems(state)] == [
        "$.groups[1].siblings[0].attempts[0].attempt_index",
        "$.groups[3].siblings[0].attempts[0].attempt_index",
    ]


def test_duplicate_attempt_indices_are_refused() -> None:
    state = gym_sidecar()
    state["groups"][3]["siblings"][0]["attempts"][1]["attempt_index"] = 0
    error = refused(lambda: parse_gym_sidecar(state))
    assert error.path == MIXED
    assert "contiguous non-negative integers counted from 0: expected 1, got 0" in error.message


@pytest.mark.parametrize("bad", [True, -1, 1.0, "1", None])
def test_an_attempt_index_of_another_type_is_refused(bad: Any) -> None:
    state = gym_sidecar()
    state["groups"][3]["siblings"][0]["attempts"][1]["attempt_index"] = bad
    assert refused(lambda: parse_gym_sidecar(state)).path == MIXED


def test_a_uuid_lineage_gate_id_in_a_gym_receipt_is_refused() -> None:
    state = gym_sidecar()
    attempt = state["groups"][3]["siblings"][0]["attempts"][1]
    attempt["receipt"]["rollout_id"] = f"grp-3_g0_a{attempt['attempt_uuid'].hex()}"
    error = refused(lambda: parse_gym_sidecar(state))
    assert error.path == "$.groups[3].siblings[0].attempts[1].receipt.rollout_id"
    assert "expected capture key 'grp-3_g0-a1'" in error.message
    assert "is a uuid-lineage gate id" in error.message and NOT_REUSED in error.message


def test_a_gym_capture_key_in_a_uuid_receipt_is_refused() -> None:
    state = rich_state()
    attempt = state["groups"][2]["siblings"][1]["attempts"][0]
    attempt["receipt"]["rollout_id"] = "grp-2_g1-a1"
    error = refused(
        lambda: RolloutRecoveryLedger.from_state_dict(
            parse_rollout_recovery_state(state).ledger_state
        )
    )
    assert error.path == "$.groups[2].siblings[1].attempts[0].receipt.rollout_id"
    assert error.message.startswith("sealed receipt identity mismatch: receipt='grp-2_g1-a1'")
    assert "is a Gym-lineage capture key" in error.message


def test_no_ledger_of_ours_restores_a_gym_state() -> None:
    state = gym_sidecar()
    for action in (
        lambda: parse_rollout_recovery_state(state),
        lambda: RolloutRecoveryLedger.from_state_dict(
            {
                k: state[k]
                for k in (
                    "schema_version",
                    "groups",
                    "pending_completed_execution_acknowledgements",
                )
            }
        ),
    ):
        error = refused(action)
        assert isinstance(error, ValueError)  # what the seed raises for it (unknown fields)
        assert error.path == "$.pending_completed_execution_acknowledgements"
        assert "is NeMo-RL's Gym lineage" in error.message and "a restore cannot" in error.message


# -- the Gym lineage's own rules ------------------------------------------------------------


def _set(path: list[Any], value: Any) -> dict[str, Any]:
    state = gym_sidecar()
    node: Any = state
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return state


_DELETE = object()
_A = ["groups", 0, "siblings", 1, "attempts", 1]


@pytest.mark.parametrize(
    ("path", "value", "where", "says"),
    [
        (["schema_version"], 2, "$.schema_version", "supports only [3]"),
        (["extra"], 1, "$", "unknown fields: ['extra']"),
        (
            ["pending_completed_execution_acknowledgements"],
            {},
            "$.pending_completed_execution_acknowledgements",
            "must be a list",
        ),
        (["groups", 0, "resolved_agent_name"], None, None, None),  # some sealed: optional
        (
            ["groups", 1, "resolved_agent_name"],
            None,
            "$.groups[1].resolved_agent_name",
            "require resolved_agent_name",
        ),
        (
            ["groups", 2, "resolved_agent_name"],
            "a",
            "$.groups[2].resolved_agent_name",
            "at least one sealed",
        ),
        (
            ["groups", 0, "group_id"],
            "grp 0",
            "$.groups[0].group_id",
            "cannot name Gym capture keys",
        ),
        (["groups", 0, "reward_checks"], None, "$.groups[0]", "unknown fields"),
        (
            [*_A, "attempt_uuid"],
            b"\x00" * 15,
            "$.groups[0].siblings[1].attempts[1].attempt_uuid",
            "16 bytes",
        ),
        (
            [*_A, "attempt_uuid"],
            gym_sidecar()["groups"][0]["siblings"][0]["attempts"][0]["attempt_uuid"],
            "$.groups[0].siblings[1].attempts[1].attempt_uuid",
            "duplicate rollout attempt identity",
        ),
        (
            [*_A, "reward_checks"],
            None,
            "$.groups[0].siblings[1].attempts[1]",
            "unknown fields: ['reward_checks']",
        ),
        (
            [*_A, "completion_receipt", "attempt_index"],
            0,
            "$.groups[0].siblings[1].attempts[1].completion_receipt",
            "identity mismatch",
        ),
        (
            [*_A, "completion_receipt", "result_digest"],
            "x",
            "$.groups[0].siblings[1].attempts[1].completion_receipt.result_digest",
            "64 lowercase hex",
        ),
        (
            [*_A, "completion_receipt", "terminal_model_call_id"],
            None,
            "$.groups[0].siblings[1].attempts[1].completion_receipt",
            "supplied together",
        ),
        (
            [*_A, "staging_keys"],
            [],
            "$.groups[0].siblings[1].attempts[1].staging_keys",
            "manifest mismatch",
        ),
        (
            ["groups", 0, "siblings", 2, "attempts", 2, "reward"],
            1.0,
            "$.groups[0].siblings[2].attempts[2]",
            "only sealed attempts",
        ),
        (["groups", 1, "status"], "generating", "$.groups[1].status", "unfinished sibling"),
        (["groups", 1, "target_step"], 5, "$.groups[1].admission_id", "disagree"),
        (
            ["groups", 3, "group_id"],
            "grp-0",
            "$.groups[3].siblings[0].attempts[1].receipt.rollout_id",
            "expected capture key 'grp-0_g0-a1'",
        ),
        (
            ["pending_completed_execution_acknowledgements", 0, "agent_name"],
            "",
            "$.pending_completed_execution_acknowledgements[0].agent_name",
            "must not be empty",
        ),
        # One case per check of the group, sibling, attempt and receipt readers.
        (["sampler_stamps_target_steps"], 1, "$.sampler_stamps_target_steps", "a boolean"),
        (["groups", 0], [], "$.groups[0]", "group must be a mapping"),
        (["groups", 0, "admission_id"], "", "$.groups[0].admission_id", "non-empty string"),
        (["groups", 0, "task_source"], 1, "$.groups[0].task_source", "string or None"),
        (["groups", 0, "resolved_agent_name"], "", "$.groups[0].resolved_agent_name", "non-empty"),
        (["groups", 0, "recovery_granularity"], "x", "$.groups[0].recovery_granularity", "invalid"),
        (["groups", 0, "expected_generations"], 0, "$.groups[0].expected_generations", "positive"),
        (["groups", 0, "siblings"], [], "$.groups[0].siblings", "must contain 3 siblings"),
        (["groups", 0, "status"], "x", "$.groups[0].status", "invalid prompt group status"),
        (["groups", 0, "phase"], "x", "$.groups[0].phase", "invalid prompt group phase"),
        (["groups", 0, "target_step"], "1", "$.groups[0].target_step", "integer or None"),
        (
            ["groups", 0, "start_weight_version"],
            None,
            "$.groups[0].start_weight_version",
            "integer",
        ),
        (["groups", 3, "status"], "finalizing", "$.groups[3].status", "every sibling to be sealed"),
        (
            ["groups", 0, "prompt_ref", "sample_id"],
            "x",
            "$.groups[0].prompt_ref.sample_id",
            "must match",
        ),
        (["groups", 0, "siblings", 0], [], "$.groups[0].siblings[0]", "sibling must be a mapping"),
        (
            ["groups", 0, "siblings", 0, "generation_index"],
            1,
            "$.groups[0].siblings[0].generation_index",
            "contiguous",
        ),
        (
            ["groups", 0, "siblings", 0, "attempts"],
            [],
            "$.groups[0].siblings[0].attempts",
            "no attempts",
        ),
        (
            ["groups", 0, "siblings", 0, "attempts", 0],
            [],
            "$.groups[0].siblings[0].attempts[0]",
            "mapping",
        ),
        (
            [*_A, "status"],
            "x",
            "$.groups[0].siblings[1].attempts[1].status",
            "invalid rollout attempt status",
        ),
        (
            [*_A, "staging_keys"],
            [1],
            "$.groups[0].siblings[1].attempts[1].staging_keys",
            "list of strings",
        ),
        ([*_A, "reward"], True, "$.groups[0].siblings[1].attempts[1].reward", "require a reward"),
        (
            [*_A, "mask_sample"],
            None,
            "$.groups[0].siblings[1].attempts[1].mask_sample",
            "boolean mask_sample",
        ),
        (
            [*_A, "receipt"],
            None,
            "$.groups[0].siblings[1].attempts[1].staging_keys",
            "missing-receipt attempt cannot own",
        ),
        ([*_A, "receipt"], [], "$.groups[0].siblings[1].attempts[1].receipt", "a mapping or None"),
        (
            [*_A, "completion_receipt"],
            [],
            "$.groups[0].siblings[1].attempts[1].completion_receipt",
            "must be a mapping",
        ),
        (
            [*_A, "completion_receipt", "result_identity"],
            _DELETE,
            "$.groups[0].siblings[1].attempts[1].completion_receipt",
            "is missing",
        ),
        (
            [*_A, "completion_receipt", "attempt_index"],
            -1,
            "$.groups[0].siblings[1].attempts[1].completion_receipt.attempt_index",
            "non-negative",
        ),
        (
            [*_A, "completion_receipt", "execution_generation"],
            0,
            "$.groups[0].siblings[1].attempts[1].completion_receipt.execution_generation",
            "positive integer",
        ),
        (
            [*_A, "completion_receipt", "result_identity"],
            "",
            "$.groups[0].siblings[1].attempts[1].completion_receipt.result_identity",
            "1 to",
        ),
        (
            [*_A, "completion_receipt", "manifest_capture_key"],
            "a b",
            "$.groups[0].siblings[1].attempts[1].completion_receipt.manifest_capture_key",
            "must match",
        ),
        (
            [*_A, "completion_receipt", "terminal_model_call_id"],
            "",
            "$.groups[0].siblings[1].attempts[1].completion_receipt.terminal_model_call_id",
            "non-empty string or None",
        ),
        (
            ["pending_completed_execution_acknowledgements", 0],
            [],
            "$.pending_completed_execution_acknowledgements[0]",
            "must be a mapping",
        ),
        (
            ["pending_completed_execution_acknowledgements", 0, "rollout_id"],
            "a b",
            "$.pending_completed_execution_acknowledgements[0].rollout_id",
            "must match",
        ),
        (["batch_shortfall"], {4: -1}, "$.batch_shortfall[4]", "non-negative"),
    ],
)
def test_the_gym_lineages_rules(
    path: list[Any], value: Any, where: str | None, says: str | None
) -> None:
    state = _set(path, value)
    if where is None:  # still valid
        parse_gym_sidecar(state)
        assert SidecarFormat.find_problems(state) == []
        return
    with pytest.raises((InvalidStateError, InvalidStateTypeError)) as caught:
        parse_gym_sidecar(state)
    assert caught.value.path == where
    if says is not None:
        assert says in caught.value.message
    assert where in {p.path for p in SidecarFormat.find_problems(state)}


def test_duplicates_across_groups_and_acknowledgements_are_refused() -> None:
    state = gym_sidecar()
    twin = copy.deepcopy(state["groups"][2])
    for number, sibling in enumerate(twin["siblings"]):
        sibling["attempts"][0]["attempt_uuid"] = bytes([200 + number]) * 16
    state["groups"].append(twin)
    state["pending_completed_execution_acknowledgements"][1].update(
        rollout_id="grp-9_g0", attempt_index=0
    )
    assert [(p.path, p.message.split(" (")[0]) for p in SidecarFormat.find_problems(state)] == [
        ("$.groups[4].group_id", "duplicate recovery group_id='grp-2'"),
        (
            "$.pending_completed_execution_acknowledgements[1]",
            "duplicate completed execution acknowledgement identity=('grp-9_g0', 0)",
        ),
    ]


def test_absent_optional_keys_read_as_upstream_reads_them() -> None:
    state = gym_sidecar()
    del state["batch_shortfall"], state["sampler_stamps_target_steps"]
    del state["groups"][2]["resolved_agent_name"], state["groups"][2]["target_step"]
    parsed = parse_gym_sidecar(state)
    assert parsed.batch_shortfall == {} and parsed.sampler_stamps_target_steps is None


# -- round trips, by property ------------------------------------------------------------

_SEALED_STATES = ("ready_to_finalize", "finalizing", "finalization_unknown")


@st.composite
def gym_states(draw: st.DrawFn) -> dict[str, Any]:
    """Valid Gym-lineage sidecars: retried siblings, seals with and without receipts,
    every group status, acknowledgements owed (built from the lineage's rules)."""
    counter = iter(range(1, 1 << 20))
    groups = []
    for g in range(draw(st.integers(0, 3))):
        group_id = f"g{g}"
        siblings = []
        for s in range(draw(st.integers(1, 3))):
            logical = f"{group_id}_g{s}"
            retries = draw(st.integers(0, 2))
            statuses = [draw(st.sampled_from(["abandoned", "failed"])) for _ in range(retries)]
            statuses.append(
                draw(st.sampled_from(["reserved", "dispatched", "sealed", "abandoned"]))
            )
            attempts = []
            for index, status in enumerate(statuses):
                attempt = bare_attempt(index, next(counter).to_bytes(16, "big"), status)
                if status == "sealed":
                    key = capture_key(logical, index)
                    calls = draw(st.integers(-1, 2))  # -1: sealed without a receipt
                    keys = [f"{key}/c{c}" for c in range(max(calls, 0))]
                    attempt.update(
                        reward=draw(st.floats(allow_nan=True) | st.integers(-5, 5)),
                        mask_sample=draw(st.booleans()),
                        staging_keys=keys,
                        receipt=None
                        if calls < 0
                        else {"rollout_id": key, "manifest": [{"staging_key": k} for k in keys]},
                        completion_receipt=draw(
                            st.none()
                            | st.just(
                                {
                                    "rollout_id": logical,
                                    "attempt_index": index,
                                    "execution_generation": 1 + index,
                                    "result_identity": f"r-{key}",
                                    "result_digest": "ab" * 32,
                                }
                            )
                        ),
                    )
                attempts.append(attempt)
            siblings.append({"generation_index": s, "attempts": attempts})
        currents = [sibling["attempts"][-1]["status"] for sibling in siblings]
        all_sealed = all(status == "sealed" for status in currents)
        any_sealed = "sealed" in currents
        groups.append(
            {
                "group_id": group_id,
                "admission_id": f"adm-{g}",
                "prompt_id": str(g),
                "prompt_ref": {"sample_id": str(g), "task_name": draw(st.none() | st.just("t"))},
                "task_source": draw(st.none() | st.just("nemo_gym")),
                "resolved_agent_name": (
                    "agent"
                    if all_sealed
                    else draw(st.none() | st.just("agent"))
                    if any_sealed
                    else None
                ),
                "recovery_granularity": draw(st.sampled_from(["sibling", "prompt_group"])),
                "expected_generations": len(siblings),
                "target_step": draw(st.none() | st.integers(0, 9)),
                "start_weight_version": draw(st.integers(0, 9)),
                "status": draw(st.sampled_from(_SEALED_STATES)) if all_sealed else "generating",
                "phase": draw(st.sampled_from(["reserved", "admitted"])),
                "siblings": siblings,
            }
        )
    return {
        "schema_version": 3,
        "groups": groups,
        "pending_completed_execution_acknowledgements": [
            {
                "rollout_id": f"done_g{n}",
                "attempt_index": n,
                "agent_name": "agent",
                "execution_generation": 1,
                "result_identity": f"r{n}",
                "result_digest": "cd" * 32,
                "manifest_capture_key": None,
                "terminal_model_call_id": None,
            }
            for n in range(draw(st.integers(0, 2)))
        ],
        "batch_shortfall": draw(st.dictionaries(st.integers(0, 9), st.integers(0, 3), max_size=2)),
        "sampler_stamps_target_steps": draw(st.none() | st.booleans()),
    }


def _same(left: Any, right: Any) -> bool:
    """Exact equality in which NaN equals NaN."""
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left):
        return math.isnan(right)
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(_same(v, right[k]) for k, v in left.items())
    if isinstance(left, list):
        return len(left) == len(right) and all(map(_same, left, right))
    return bool(left == right)


@settings(max_examples=60)
@given(state=gym_states())
def test_a_gym_sidecar_round_trips_through_both_formats_keeping_its_lineage(
    state: dict[str, Any],
) -> None:
    assert SidecarFormat.lineage(state) is SidecarLineage.GYM
    assert SidecarFormat.find_problems(state) == []
    pt = encode_sidecar(state, format="pt")
    native = encode_sidecar(state, format="native")
    for data, fmt in ((pt, "pt"), (native, "native")):
        decoded_format, decoded = decode_sidecar(data)
        assert decoded_format == fmt
        assert _same(decoded, state)
        assert SidecarFormat.lineage(decoded) is SidecarLineage.GYM
    # pt -> native -> pt gives the same bytes: no step changed a value.
    assert encode_sidecar(decode_sidecar(native)[1], format="pt") == pt
    assert encode_torch_pt(decode_sidecar(pt)[1]) == pt


@settings(max_examples=60)
@given(state=gym_states(), data=st.data())
def test_any_attempt_turned_into_the_other_lineage_is_refused_at_its_path(
    state: dict[str, Any], data: st.DataObject
) -> None:
    attempts = [
        (g, s, a)
        for g, group in enumerate(state["groups"])
        for s, sibling in enumerate(group["siblings"])
        for a in range(len(sibling["attempts"]))
    ]
    if not attempts:
        return
    g, s, a = data.draw(st.sampled_from(attempts))
    mixed = copy.deepcopy(state)
    del mixed["groups"][g]["siblings"][s]["attempts"][a]["attempt_index"]
    where = f"$.groups[{g}].siblings[{s}].attempts[{a}].attempt_index"
    assert refused(lambda: parse_gym_sidecar(mixed)).path == where
    assert [p.path for p in SidecarFormat.find_problems(mixed)][:1] == [where]
    for fmt in FORMATS:
        data_bytes = encode_sidecar(mixed, format=fmt, validate=False)
        assert refused(lambda b=data_bytes: _load_bytes(Path("x"), b)).path == where


def test_a_uuid_sidecar_still_loads_as_before(tmp_path: Path) -> None:
    for fmt in FORMATS:
        path = tmp_path / f"ours.{fmt}"
        write_sidecar(path, rich_state(), format=fmt)
        loaded = load_sidecar(path)
        assert isinstance(loaded, LoadedSidecar) and loaded.lineage is SidecarLineage.UUID
        assert loaded.summary()["lineage"]["name"] == "uuid"
