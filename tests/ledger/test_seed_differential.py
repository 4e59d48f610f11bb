"""Differential fuzz: our ledger against the seed's own code, call for call.

The seed (NeMo-RL's schema-3 rollout-recovery ledger) is runnable in ``shared/seed/oracle``
(re-indented, see its README). A hypothesis state machine drives one seed ledger and one of
ours with the same calls: every public transition with valid arguments and with wrong values
of every type (several faults in one call, so the order of checks shows), state dict round
trips, restores of hostile states, and sidecars built and parsed. After every call it
compares the two: the return value (normalized), whether the call was refused and with which
builtin exception type (ours derive from the builtin the seed raises), and the whole
observable ledger state (records, ``state_dict``, staging keys).

Attempt UUIDs come from ``uuid.uuid4``; during each call both implementations draw the same
deterministic sequence, so gate ids agree.

Deliberate divergences, each excluded narrowly where the comparison is made:

- Stricter arguments (the ``stricter`` reasons a rule names for its call). Ours refuses at
  the call a value the seed takes but cannot carry: non-text or non-UTF-8 ids and names,
  bools or floats as counts, scheduling numbers outside the non-negative 64-bit range, a
  granularity that is not a member (the seed stores the raw value, treats it as neither
  granularity and crashes in ``state_dict``), a prompt_ref that only reads like one,
  receipts that are not plain data, rewards that are not numbers (the seed parses
  ``"1.5"``), reward records of other types, a bare string of ids (the seed takes it as a
  substring test), sidecar strings that are not UTF-8 and shortfalls beyond 64 bits. Only
  with a named reason may the seed accept what ours refuses; these checks run after every
  check the seed makes, so whenever the seed refuses a call, ours refuses it with the
  seed's type.
- A state the seed writes but its own restore refuses (two groups of one admission batch
  that disagree, as between two admission calls; ``build`` creates one on purpose): ours
  refuses to write it (``check_written``).
- The seed's accidental crashes (``ACCIDENTAL``): where the seed raises ``AttributeError`` on
  a value of the wrong type (a receipt or payload that is not a mapping) or
  ``OverflowError`` on an integer no float holds, ours may refuse the value with a project
  error (a ``ValueError`` or ``TypeError`` naming it).
- A refused call changes nothing in ours; the seed's ``mark_sibling_sealed`` and
  ``mark_group_sealed`` store part of a seal before ``float(reward)`` fails. After every
  refused call the seed is rolled back to its state before the call.
- An exact redelivery of a seal whose reward is NaN is a duplicate in ours; the seed
  compares rewards with ``==`` and calls it a conflict (the ``laxer`` reason).
- A tuple inside a receipt is stored as a list (what every sidecar round trip gives back).
- ``reward_settings`` records are drawn from a small set: the oracle's ``reward_penalties``
  is a hand-written stand-in, not the seed, so only shapes whose meaning it states (valid
  records, wrong envelopes, bad versions) are compared.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import dataclasses
import enum
import importlib
import itertools
import math
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import rollout_recovery as ours
from rollout_recovery.errors import RolloutRecoveryError


def _find_oracle() -> Path | None:
    """``ROLLOUT_RECOVERY_SEED_ORACLE``, else ``shared/seed/oracle`` beside an ancestor."""
    override = os.environ.get("ROLLOUT_RECOVERY_SEED_ORACLE")
    candidates = [Path(override)] if override else []
    candidates += [parent / "shared" / "seed" / "oracle" for parent in Path(__file__).parents]
    for candidate in candidates:
        if (candidate / "seed_rollout_recovery.py").is_file():
            return candidate
    return None


def _import_oracle(folder: Path) -> tuple[ModuleType, ModuleType]:
    # The oracle imports its reward stand-in by name; the folder is read-only and shared.
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    sys.path.insert(0, str(folder))
    try:
        return (
            importlib.import_module("seed_rollout_recovery"),
            importlib.import_module("seed_reward_penalties"),
        )
    finally:
        sys.path.remove(str(folder))
        sys.dont_write_bytecode = saved


_ORACLE = _find_oracle()
if _ORACLE is None:
    pytest.skip(
        "the seed oracle (shared/seed/oracle/seed_rollout_recovery.py) is not beside this "
        "checkout; set ROLLOUT_RECOVERY_SEED_ORACLE to its folder to run the differential fuzz",
        allow_module_level=True,
    )
seed, seed_rewards = _import_oracle(_ORACLE)

INT64_MAX = 2**63 - 1
# What the seed raises by accident (see the module docstring).
ACCIDENTAL = (AttributeError, OverflowError)


# ---------------------------------------------------------------- the two implementations


@dataclasses.dataclass(frozen=True)
class Impl:
    name: str
    ledger: Any
    prompt_ref: Any
    seal_result: Any
    checks: Any
    context: Any
    finalized: Any
    granularity: Any
    settings: tuple[Any, ...]
    build: Callable[..., Any]
    parse: Callable[[Any], Any]


SEED = Impl(
    name="seed",
    ledger=seed.RolloutRecoveryLedger,
    prompt_ref=seed.PromptRef,
    seal_result=seed.SiblingSealResult,
    checks=seed_rewards.RewardChecks,
    context=seed_rewards.RewardLogContext,
    finalized=seed_rewards.FinalizedReward,
    granularity=seed.RecoveryGranularity,
    settings=(
        seed_rewards.CaptureRewardSettings((), (), None),
        seed_rewards.CaptureRewardSettings(
            ("penalize_unwanted_tokens",),
            (5, 9),
            seed_rewards.EffortRewardSettings(0.5, -1.0, 4096, "low effort"),
        ),
    ),
    build=seed.build_rollout_recovery_state,
    parse=seed.parse_rollout_recovery_state,
)
OURS = Impl(
    name="ours",
    ledger=ours.RolloutRecoveryLedger,
    prompt_ref=ours.PromptRef,
    seal_result=ours.SiblingSealResult,
    checks=ours.RewardChecks,
    context=ours.RewardLogContext,
    finalized=ours.FinalizedReward,
    granularity=ours.RecoveryGranularity,
    settings=(
        ours.CaptureRewardSettings(),
        ours.CaptureRewardSettings.from_configs(
            penalties={"penalize_unwanted_tokens": True, "token_ids": {"unwanted": [9, 5]}},
            effort={
                "low_weight": 0.5,
                "low_penalty": -1.0,
                "low_ub": 4096,
                "low_string": "low effort",
            },
        ),
    ),
    build=ours.build_rollout_recovery_state,
    parse=ours.parse_rollout_recovery_state,
)


class LiveCut:
    def require_live(self) -> None:
        return None


class DeadCut:
    def require_live(self) -> None:
        raise RuntimeError("data-plane mutation cut is no longer active")


LIVE = LiveCut()
DEAD = DeadCut()


# Markers for values each implementation builds from its own classes.
@dataclasses.dataclass(frozen=True)
class Ref:
    sample_id: Any
    task_name: Any = None


@dataclasses.dataclass(frozen=True)
class Checks:
    flags: tuple[bool, bool, bool]


@dataclasses.dataclass(frozen=True)
class Ctx:
    agent_name: str
    full_result_json: str | None


@dataclasses.dataclass(frozen=True)
class Seal:
    gate: Any
    receipt: Any
    reward: Any
    mask: Any
    checks: Any = None
    ctx: Any = None


@dataclasses.dataclass(frozen=True)
class Final:
    sample_id: Any
    rollout_id: Any
    reward: Any
    ctx: Any = None


@dataclasses.dataclass(frozen=True)
class Settings:
    index: int


@dataclasses.dataclass(frozen=True)
class Gran:
    value: str


def mat(impl: Impl, value: Any) -> Any:
    """``value`` with every marker built by ``impl``; other values pass through."""
    if isinstance(value, Ref):
        return impl.prompt_ref(mat(impl, value.sample_id), mat(impl, value.task_name))
    if isinstance(value, Checks):
        return impl.checks(*value.flags)
    if isinstance(value, Ctx):
        return impl.context(value.agent_name, value.full_result_json)
    if isinstance(value, Seal):
        return impl.seal_result(
            value.gate,
            mat(impl, value.receipt),
            value.reward,
            value.mask,
            mat(impl, value.checks),
            mat(impl, value.ctx),
        )
    if isinstance(value, Final):
        return impl.finalized(value.sample_id, value.rollout_id, value.reward, mat(impl, value.ctx))
    if isinstance(value, Settings):
        return impl.settings[value.index]
    if isinstance(value, Gran):
        return impl.granularity(value.value)
    if type(value) is dict:
        return {key: mat(impl, item) for key, item in value.items()}
    if type(value) is list:
        return [mat(impl, item) for item in value]
    return value


@contextlib.contextmanager
def fixed_uuids(base: int) -> Iterator[None]:
    """``uuid.uuid4`` yields ``base``, ``base + 1``, ... (as version-4 UUIDs) inside."""
    counter = itertools.count(base)
    real = uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=next(counter), version=4)  # type: ignore[assignment]
    try:
        yield
    finally:
        uuid.uuid4 = real  # type: ignore[assignment]


# -------------------------------------------------------------------- outcomes and norms


@dataclasses.dataclass
class Outcome:
    value: Any = None
    error: Exception | None = None


def outcome(call: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(value=call())
    except Exception as error:
        return Outcome(error=error)


def builtin_base(error: BaseException) -> type[BaseException]:
    """The first builtin exception class of the error's type (ours are project subclasses)."""
    return next(c for c in type(error).__mro__ if getattr(builtins, c.__name__, None) is c)


def describe(result: Outcome) -> str:
    if result.error is None:
        return f"returned {result.value!r}"[:300]
    return f"raised {type(result.error).__name__}: {result.error}"[:300]


def norm(value: Any, *, receipt: bool = False) -> Any:
    """A comparable form: types kept apart (1, 1.0, True), NaN equal to itself.

    Inside a receipt a tuple counts as a list (ours stores the form a round trip gives).
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, enum.Enum):
        return ("enum", type(value).__name__, value.value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else value)
    if isinstance(value, str | bytes):
        return value
    if isinstance(value, uuid.UUID):
        return ("uuid", value.hex)
    if isinstance(value, dict):
        items = [
            (norm(key), norm(item, receipt=receipt or key == "receipt"))
            for key, item in value.items()
        ]
        return ("dict", sorted(items, key=repr))
    if isinstance(value, list) or (receipt and isinstance(value, tuple)):
        return ("list", [norm(item, receipt=receipt) for item in value])
    if isinstance(value, tuple):
        return ("tuple", [norm(item) for item in value])
    if isinstance(value, set | frozenset):
        return ("set", sorted(map(repr, map(norm, value))))
    if isinstance(value, SEED.settings[0].__class__ | OURS.settings[0].__class__):
        state = value.to_state() if hasattr(value, "to_state") else value.state_dict()
        return ("settings", norm(state))
    if (dataclasses.is_dataclass(value) and not isinstance(value, type)) or isinstance(
        value, msgspec.Struct
    ):
        return norm_record(value)
    return ("other", type(value).__name__, repr(value))


def norm_record(record: Any) -> Any:
    # A record is its type's name and its fields, a dataclass (the seed's) or a Struct
    # (ours: ``RewardChecks`` is the one msgspec Struct the ledger stores and hands out).
    names = (
        record.__struct_fields__
        if isinstance(record, msgspec.Struct)
        else [f.name for f in dataclasses.fields(record)]
    )
    fields = {name: getattr(record, name) for name in names}
    extra: dict[str, Any] = {}
    name = type(record).__name__
    if name == "PromptGroupRecoveryRecord":
        for prop in ("logical_rollout_ids", "gate_rollout_ids", "sealed_generation_indices"):
            extra[prop] = outcome(lambda prop=prop: getattr(record, prop))
        extra["prompt_payload"] = outcome(lambda: record.prompt_payload)
    elif name == "RolloutSiblingRecord":
        extra["current_attempt"] = outcome(lambda: record.current_attempt)
    elif name == "RolloutAttemptRecord":
        extra["attempt_id"] = record.attempt_id
    parts = {key: norm(item, receipt=key == "receipt") for key, item in fields.items()}
    parts |= {
        key: norm_outcome(item) if isinstance(item, Outcome) else norm(item)
        for key, item in extra.items()
    }
    return (name, sorted(parts.items(), key=repr))


def norm_outcome(result: Outcome) -> Any:
    if result.error is not None:
        return ("raised", builtin_base(result.error).__name__)
    return ("returned", norm(result.value))


def dump(ledger: Any) -> Any:
    """Everything a caller can read from a ledger in any state (records, staging keys)."""
    return (
        len(ledger),
        [norm_record(record) for record in ledger.groups()],
        norm(ledger.expected_staging_keys()),
    )


# -------------------------------------------------------------- what counts as stricter


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_text(value: Any, *, optional: bool = False, non_empty: bool = False) -> bool:
    if value is None:
        return optional
    return isinstance(value, str) and _utf8(value) and (bool(value) or not non_empty)


def is_count(value: Any, *, optional: bool = False) -> bool:
    if value is None:
        return optional
    return type(value) is int and 0 <= value <= INT64_MAX


def is_plain(value: Any, depth: int = 0) -> bool:
    """What a sidecar holds as the same value (``_plain``'s rule, written independently)."""
    kind = type(value)
    if kind in (float, bool, bytes, type(None)):
        return True
    if kind is str:
        return _utf8(value)
    if kind is int:
        return -(2**63) <= value <= 2**64 - 1
    if depth >= 64:
        return False
    if kind is dict:
        return all(type(k) is str and _utf8(k) and is_plain(v, depth + 1) for k, v in value.items())
    if kind in (list, tuple):
        return all(is_plain(item, depth + 1) for item in value)
    return False


def is_number(value: Any) -> bool:
    if not isinstance(value, int | float):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


def non_utf8_strings(value: Any) -> bool:
    """Whether a state holds a string no sidecar can write (ours refuses it on reading)."""
    if isinstance(value, str):
        return not _utf8(value)
    if isinstance(value, dict):
        return any(non_utf8_strings(k) or non_utf8_strings(v) for k, v in value.items())
    if isinstance(value, list):
        return any(non_utf8_strings(item) for item in value)
    return False


def seal_reasons(receipt: Any, reward: Any, checks: Any, ctx: Any) -> list[str]:
    reasons = []
    if receipt is not None and not is_plain(receipt):
        reasons.append("receipt is not plain data")
    if not is_number(reward):
        reasons.append("reward is not a number a float holds")
    if checks is not None and not isinstance(checks, Checks):
        reasons.append("reward_checks is not a RewardChecks")
    if ctx is not None and not isinstance(ctx, Ctx):
        reasons.append("reward_log_context is not a RewardLogContext")
    return reasons


# ------------------------------------------------------------------------- strategies

CUTS = st.sampled_from([LIVE] * 9 + [DEAD])
POOL_IDS = ["g0", "g1", "g2", "g3"]
HOSTILE_IDS: list[Any] = [5, None, b"g0", ["g0"], "\ud800", ""]
GROUP = st.tuples(st.integers(0, 1000), st.sampled_from(["existing"] * 8 + ["missing", "hostile"]))
# "auto": a sibling whose current attempt is dispatched, if the group has one.
INDEX = st.sampled_from(["auto"] * 8 + [0, 1, 2, -1, 3, True, 0.0, "0", None])
IDX = st.sampled_from([1, 2, 3, 7])
TASK = st.sampled_from([None, "math", "code"])


def maybe(valid: st.SearchStrategy[Any], hostile: list[Any], weight: int = 2) -> Any:
    """Mostly ``valid``; one draw in ``weight + 1`` a hostile value."""
    return st.one_of(*([valid] * weight), st.sampled_from(hostile))


def receipt_for(kind: str, gate: Any, keys: int) -> Any:
    good = {"rollout_id": gate, "manifest": [{"staging_key": f"{gate}/c{k}"} for k in range(keys)]}
    variants: dict[str, Any] = {
        "none": None,
        "ok": good,
        "extra": {**good, "extra": {"nested": [1, 2.5, None, True, b"x", -3]}},
        "tuple": {**good, "pair": (1, "x")},
        "wrong_id": {**good, "rollout_id": "other"},
        "no_id": {"manifest": good["manifest"]},
        "no_manifest": {"rollout_id": gate},
        "manifest_str": {"rollout_id": gate, "manifest": "k"},
        "bad_key": {"rollout_id": gate, "manifest": [{"staging_key": 5}]},
        "bad_entry": {"rollout_id": gate, "manifest": ["k"]},
        "not_dict": [good],
        "set": {**good, "tags": {1, 2}},
        "big_int": {**good, "n": 2**64},
        "int_key": {**good, 1: "x"},
        "surrogate": {**good, "s": "\ud800"},
    }
    return variants[kind]


RECEIPT_KINDS = st.sampled_from(
    ["ok"] * 6
    + ["none"] * 2
    + ["extra", "tuple", "wrong_id", "no_id", "no_manifest", "manifest_str", "bad_key"]
    + ["bad_entry", "not_dict", "set", "big_int", "int_key", "surrogate"]
)
REWARD = maybe(
    st.sampled_from([1.0, 0.0, -2.5, 1, 0.25]),
    [True, float("nan"), float("inf"), "1.5", "x", None, 2**1100, [1], b"2"],
)
MASK = maybe(st.booleans(), [0, 1, None, "no"], weight=4)
CHECKS = st.one_of(
    st.none(),
    st.none(),
    st.builds(Checks, st.tuples(st.booleans(), st.booleans(), st.booleans())),
    st.sampled_from([{"low_effort": True}, (True, False, True)]),
)
CTX = st.one_of(
    st.none(),
    st.none(),
    st.sampled_from([Ctx("agent", None), Ctx("agent", '{"ok": 1}')]),
    st.sampled_from(["agent", {"agent_name": "a", "full_result_json": None}]),
)


def payload_for(kind: str, idx: Any, task_name: Any) -> Any:
    variants: dict[str, Any] = {
        "match": {"idx": idx, "task_name": task_name, "messages": ["hi"]},
        "no_task": {"idx": idx},
        "wrong_idx": {"idx": idx + 100 if type(idx) is int else 100, "task_name": task_name},
        "bool_idx": {"idx": True, "task_name": task_name},
        "str_idx": {"idx": str(idx), "task_name": task_name},
        "no_idx": {"task_name": task_name},
        "wrong_task": {"idx": idx, "task_name": "other"},
        "task_int": {"idx": idx, "task_name": 5},
        "task_bytes": {"idx": idx, "task_name": b"math"},
        "task_list": {"idx": idx, "task_name": ["math"]},
        "task_surrogate": {"idx": idx, "task_name": "\udc80"},
        "list": [idx],
        "none": None,
        "str": "payload",
    }
    return variants[kind]


PAYLOAD_FAULTS = [
    "no_task", "wrong_idx", "bool_idx", "str_idx", "no_idx", "wrong_task",
    "task_int", "task_bytes", "task_list", "task_surrogate", "list", "none", "str",
]  # fmt: skip
STATE_HOSTILE: list[Any] = [
    None, True, False, 0, 1, -1, 2**64, 2**1100, 1.5, float("nan"), "", "x", "sealed",
    "generating", "prompt_group", "\ud800", b"", bytes(16), [], {}, ["x"], {"x": 1},
]  # fmt: skip
SETTINGS_RECORDS: list[Any] = [
    None,
    {"version": 1, "penalties": {}, "effort": None},
    {"penalties": {"penalize_empty_final_answer": True}, "effort": None},
    {
        "version": 1,
        "penalties": {"penalize_unwanted_tokens": True, "token_ids": {"unwanted": [9, 5]}},
        "effort": {"low_weight": 0.5, "low_penalty": -1.0, "low_ub": 4096, "low_string": "lo"},
    },
    {"version": 2, "penalties": {}, "effort": None},
    {"version": True, "penalties": {}, "effort": None},
    {"version": 1, "penalties": {}},
    {"version": 1, "penalties": [], "effort": None},
    {"version": 1, "penalties": {}, "effort": None, "x": 1},
    {"version": 1, "penalties": {"penalize_empty_final_answer": 1}, "effort": None},
    "x",
    [],
]


def state_paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into dicts and lists, outside ``reward_settings`` (see the docstring)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "reward_settings":
                continue
            yield (*path, key)
            yield from state_paths(item, (*path, key))
    elif isinstance(value, list):
        for position, item in enumerate(value):
            yield (*path, position)
            yield from state_paths(item, (*path, position))


def mutate(state: Any, choice: int, action: str, hostile: Any) -> Any:
    """A deep copy of ``state`` with one fault at the path ``choice`` picks."""
    state = copy.deepcopy(state)
    paths = list(state_paths(state))
    if not paths:
        return hostile if action == "replace" else state
    path = paths[choice % len(paths)]
    parent = state
    for step in path[:-1]:
        parent = parent[step]
    key = path[-1]
    if action == "replace":
        parent[key] = copy.deepcopy(hostile)
    elif action == "delete":
        del parent[key]
    elif action == "unknown" and isinstance(parent[key], dict):
        parent[key]["unknown_field"] = 1
    elif action == "duplicate" and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[key]))
    elif action == "swap" and isinstance(parent, list) and len(parent) > 1:
        parent[0], parent[-1] = parent[-1], parent[0]
    return state


MUTATION = st.tuples(
    st.integers(0, 10_000),
    st.sampled_from(["replace"] * 4 + ["delete", "unknown", "duplicate", "swap"]),
    st.sampled_from(STATE_HOSTILE),
)


# Not a PromptRef, but it reads like one: the seed takes it.
DUCK_REF = SimpleNamespace(sample_id="7", task_name=None)
FAULTY_RESERVATION = st.fixed_dictionaries(
    {
        "cut": CUTS,
        "idx": IDX,
        "task": TASK,
        "prompt_id": maybe(st.just("idx"), ["", None, 0, 7, b"7", "\ud800"]),
        "payload": maybe(st.just("match"), PAYLOAD_FAULTS),
        "prompt_ref": maybe(
            st.sampled_from([None, None, "match"]),
            [Ref("8"), Ref("7", 5), Ref("7", "\ud800"), Ref(7), DUCK_REF, {"sample_id": "7"}, "7"],
        ),
        "n": maybe(st.integers(1, 3), [0, -1, False, True, 0.5, 2.0, float("nan"), "2", None]),
        "target_step": maybe(st.sampled_from([None, 0, 3]), [-1, 2**63, True, 1.5, "3"]),
        "weight": maybe(st.sampled_from([0, 1]), [-1, 2**63, None, 1.5, "0", True]),
        "source": maybe(st.sampled_from([None, "math_agent"]), [5, b"s", "\ud800", ""]),
        "granularity": maybe(
            st.sampled_from([Gran("sibling"), Gran("prompt_group")]),
            ["sibling", "prompt_group", "bogus", None, 1],
        ),
        "admitted": maybe(st.booleans(), [0, 1, None, "yes"]),
        "group_id": maybe(st.sampled_from([*POOL_IDS, None, "existing"]), HOSTILE_IDS),
        "admission_id": maybe(st.sampled_from([None, "a0", "a1"]), ["", 5, b"a", "\ud800"]),
    }
)


# ---------------------------------------------------------------------------- the machine


class SeedDifferential(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.seed = SEED.ledger()
        self.ours = OURS.ledger()
        self.step = 0
        self.last_seal: dict[str, Any] | None = None
        self.last_sidecar: Any = None

    # ------------------------------------------------------------------------ plumbing

    def both(
        self,
        label: str,
        call: Callable[[Impl, Any], Any],
        stricter: list[str] | tuple[str, ...] = (),
        laxer: str | None = None,
    ) -> tuple[Outcome, Outcome]:
        """Run ``call`` on both ledgers and check that they agree (see the docstring)."""
        self.step += 1
        seed_before = copy.deepcopy(self.seed)
        ours_before = dump(self.ours)
        with fixed_uuids(self.step << 20):
            theirs = outcome(lambda: call(SEED, self.seed))
        with fixed_uuids(self.step << 20):
            mine = outcome(lambda: call(OURS, self.ours))
        note(f"{label}: seed {describe(theirs)}; ours {describe(mine)}")
        if theirs.error is None and mine.error is None:
            event(f"{label}: accepted")
            assert norm(mine.value) == norm(theirs.value), f"{label}: return values differ"
        elif theirs.error is not None and mine.error is not None:
            self.check_same_refusal(label, theirs.error, mine.error)
            assert dump(self.ours) == ours_before, f"{label}: a refused call changed our ledger"
            if label in ("mark_sibling_sealed", "mark_group_sealed"):
                self.seed = seed_before  # it may hold part of a seal (see the docstring)
            else:
                assert dump(self.seed) == dump(seed_before), f"{label}: the seed changed"
        elif mine.error is not None:
            self.check_stricter(label, mine.error, stricter)
            assert dump(self.ours) == ours_before, f"{label}: a refused call changed our ledger"
            self.seed = seed_before
        else:
            assert laxer is not None, (
                f"{label}: ours accepted a call the seed refuses: {describe(theirs)}"
            )
            assert isinstance(theirs.error, ValueError), f"{label}: {describe(theirs)}"
            event(f"{label}: laxer ({laxer})")
            assert dump(self.ours) == ours_before, f"{label}: {laxer} changed our ledger"
            self.seed = seed_before
        return theirs, mine

    @staticmethod
    def check_stricter(label: str, mine: Exception, stricter: list[str] | tuple[str, ...]) -> None:
        """Ours refused a call the seed accepts: a stricter rule must name what ours names.

        Each reason starts with the field it covers, which ours names in its error.
        """
        named = [reason for reason in stricter if reason.split()[0] in str(mine)]
        assert named, (
            f"{label}: ours refused a call the seed accepts, and no stricter rule covers "
            f"{type(mine).__name__}: {mine} (rules that apply: {list(stricter)})"
        )
        assert isinstance(mine, RolloutRecoveryError), (
            f"{label}: a stricter refusal must be a project error: {mine!r}"
        )
        event(f"{label}: stricter ({named[0]})")

    @staticmethod
    def check_same_refusal(label: str, theirs: Exception, mine: Exception) -> None:
        base = builtin_base(theirs)
        if isinstance(mine, base):
            event(f"{label}: refused ({base.__name__})")
            return
        if base in ACCIDENTAL and isinstance(mine, RolloutRecoveryError):
            event(f"{label}: seed crashed with {base.__name__}")
            return
        raise AssertionError(
            f"{label}: the seed raises {type(theirs).__name__} ({theirs}), "
            f"ours {type(mine).__name__} ({mine})"
        )

    def check_written(self, label: str, theirs: Outcome, mine: Outcome, state: Any) -> bool:
        """Compare two writes of a state; True when both wrote one.

        Ours may refuse to write what the seed writes when the seed's own restore refuses
        it (``state`` gives the seed's written ledger state).
        """
        if theirs.error is None and mine.error is not None:
            restore = outcome(lambda: SEED.ledger.from_state_dict(copy.deepcopy(state())))
            assert restore.error is not None and isinstance(restore.error, ValueError), (
                f"{label}: ours refused to write a state the seed writes and restores: "
                f"{describe(mine)}"
            )
            assert isinstance(mine.error, RolloutRecoveryError) and isinstance(
                mine.error, ValueError
            ), f"{label}: {describe(mine)}"
            event(f"{label}: refused a state the seed cannot restore")
            return False
        if theirs.error is not None or mine.error is not None:
            assert theirs.error is not None and mine.error is not None, (
                f"{label}: seed {describe(theirs)}; ours {describe(mine)}"
            )
            self.check_same_refusal(label, theirs.error, mine.error)
            return False
        assert norm(mine.value) == norm(theirs.value), f"{label}: written states differ"
        return True

    def target(self, group: tuple[Any, ...]) -> Any:
        if group[1] == "id":
            return group[2]
        choice, kind = group
        existing = [record.group_id for record in self.seed.groups()]
        if kind == "existing" and existing:
            return existing[choice % len(existing)]
        if kind == "hostile":
            return HOSTILE_IDS[choice % len(HOSTILE_IDS)]
        return POOL_IDS[choice % len(POOL_IDS)] if choice % 3 else "nope"

    def dispatched_sibling(self, group: Any) -> tuple[Any, int]:
        """A group and a sibling index whose current attempt is dispatched, if any."""
        candidates = [
            (record.group_id, sibling.generation_index)
            for record in self.seed.groups()
            for sibling in record.siblings
            if sibling.current_attempt.status is seed.RolloutAttemptStatus.DISPATCHED
            and record.recovery_granularity is seed.RecoveryGranularity.SIBLING
        ]
        if group[1] != "existing":
            return self.target(group), 0
        if not candidates:
            return self.fresh_dispatched("sibling", group[0]), 0
        return candidates[group[0] % len(candidates)]

    def fresh_dispatched(self, granularity: str, choice: int) -> Any:
        """Reserve a new admitted group and dispatch all of it; its id (None if refused)."""
        before = {record.group_id for record in self.seed.groups()}
        self.reserve_valid(
            7, None, False, 1 + choice % 3, 3, 0, None, granularity, True, None, None
        )
        created = [r.group_id for r in self.seed.groups() if r.group_id not in before]
        if not created:
            return None
        self.dispatch(LIVE, (0, "id", created[0]), None)
        return created[0]

    def record(self, group_id: Any) -> Any:
        try:
            return self.seed.get_group(group_id)
        except Exception:
            return None

    def gate(self, group_id: Any, index: Any, kind: str) -> Any:
        record = self.record(group_id)
        if kind == "bogus" or record is None or type(index) is not int:
            return "bogus"
        if not 0 <= index < len(record.siblings):
            return f"{group_id}_g{index}_a0"
        attempts = record.siblings[index].attempts
        if kind == "stale" and len(attempts) > 1:
            return f"{group_id}_g{index}_a{attempts[-2].attempt_id}"
        return record.gate_rollout_id(index)

    # --------------------------------------------------------------------- invariants

    @invariant()
    def ledgers_agree(self) -> None:
        assert dump(self.ours) == dump(self.seed), "the ledgers' records differ"
        theirs = outcome(self.seed.state_dict)
        mine = outcome(self.ours.state_dict)
        self.check_written("state_dict", theirs, mine, lambda: theirs.value)

    @rule(
        sample_id=st.sampled_from(["7", "", None, 7, b"7", "\ud800"]),
        task_name=st.sampled_from([None, "math", 5, b"m"]),
    )
    def prompt_ref(self, sample_id: Any, task_name: Any) -> None:
        self.both("PromptRef", lambda impl, ledger: impl.prompt_ref(sample_id, task_name))

    @rule(group=GROUP)
    def reads(self, group: Any) -> None:
        group_id = self.target(group)
        self.both("get_group", lambda impl, ledger: ledger.get_group(group_id))
        self.both("__contains__", lambda impl, ledger: group_id in ledger)
        self.both("assert_checkpoint_safe", lambda impl, ledger: ledger.assert_checkpoint_safe())

    # ------------------------------------------------------------------ reserve, admit

    def reserve(self, args: dict[str, Any], stricter: list[str]) -> None:
        def call(impl: Impl, ledger: Any) -> Any:
            return ledger.reserve_group(
                mat(impl, args["cut"]),
                **{key: mat(impl, value) for key, value in args.items() if key != "cut"},
            )

        self.both("reserve_group", call, stricter)

    @initialize(
        groups=st.lists(
            st.tuples(
                IDX,
                st.sampled_from(["sibling", "prompt_group"]),
                st.integers(1, 3),
                st.booleans(),
                st.sampled_from([None, "a0"]),
                st.integers(0, 8),
            ),
            max_size=3,
        ),
        receipt_kind=st.sampled_from(["ok", "ok", "none", "extra"]),
    )
    def start(self, groups: list[tuple[Any, ...]], receipt_kind: str) -> None:
        """A few groups, each taken some valid steps along its life."""
        for position, (idx, granularity, n, admitted, admission_id, steps) in enumerate(groups):
            group_id = POOL_IDS[position]
            self.reserve_valid(
                idx, None, False, n, 3, 0, None, granularity, admitted, group_id, admission_id
            )
            self.advance((0, "id", group_id), receipt_kind, 1, 1.0, False, None, None, 3, steps)

    @rule(
        idx=IDX,
        task=TASK,
        with_ref=st.sampled_from([False, False, True]),
        n=st.integers(1, 3),
        target_step=st.sampled_from([None, 0, 3]),
        weight=st.sampled_from([0, 1]),
        source=st.sampled_from([None, "math_agent"]),
        granularity=st.sampled_from(["sibling", "prompt_group"]),
        admitted=st.booleans(),
        group_id=st.sampled_from([*POOL_IDS, None]),
        admission_id=st.sampled_from([None, "a0", "a1"]),
    )
    def reserve_valid(
        self,
        idx: int,
        task: str | None,
        with_ref: bool,
        n: int,
        target_step: int | None,
        weight: int,
        source: str | None,
        granularity: str,
        admitted: bool,
        group_id: str | None,
        admission_id: str | None,
    ) -> None:
        self.reserve(
            {
                "cut": LIVE,
                "prompt_id": str(idx),
                "prompt_payload": payload_for("match", idx, task),
                "expected_generations": n,
                "target_step": target_step,
                "start_weight_version": weight,
                "task_source": source,
                "recovery_granularity": Gran(granularity),
                "admitted": admitted,
                "group_id": group_id,
                "admission_id": admission_id,
                "prompt_ref": Ref(str(idx), task) if with_ref else None,
            },
            [],
        )

    @rule(calls=st.lists(FAULTY_RESERVATION, min_size=1, max_size=4))
    def reserve_faulty(self, calls: list[dict[str, Any]]) -> None:
        """A few reservations, each with wrong values in some of its arguments."""
        for call in calls:
            self.reserve_one_faulty(**call)

    def reserve_one_faulty(
        self,
        cut: Any,
        idx: int,
        task: Any,
        prompt_id: Any,
        payload: str,
        prompt_ref: Any,
        n: Any,
        target_step: Any,
        weight: Any,
        source: Any,
        granularity: Any,
        admitted: Any,
        group_id: Any,
        admission_id: Any,
    ) -> None:
        if prompt_id == "idx":
            prompt_id = str(idx)
        if prompt_ref == "match":
            prompt_ref = Ref(str(idx), task)
        if group_id == "existing":
            existing = [record.group_id for record in self.seed.groups()]
            group_id = existing[0] if existing else None
        prompt_payload = payload_for(payload, idx, task)
        stricter = []
        if not is_text(prompt_id, non_empty=True):
            stricter.append("prompt_id is not a non-empty UTF-8 str")
        if group_id and not is_text(group_id):
            stricter.append("group_id is not a UTF-8 str")
        if admission_id and not is_text(admission_id):
            stricter.append("admission_id is not a UTF-8 str")
        if not is_text(source, optional=True):
            stricter.append("task_source is not a UTF-8 str or None")
        if type(n) is not int:
            stricter.append("expected_generations is not an int")
        if prompt_ref is not None and not isinstance(prompt_ref, Ref):
            stricter.append("prompt_ref is not a PromptRef")
        task_name = (
            prompt_ref.task_name
            if isinstance(prompt_ref, Ref)
            else prompt_payload.get("task_name")
            if isinstance(prompt_payload, dict)
            else None
        )
        if isinstance(task_name, str) and not _utf8(task_name):
            stricter.append("prompt_ref.task_name is not UTF-8 (from the payload)")
        if isinstance(prompt_ref, Ref) and not is_text(prompt_ref.task_name, optional=True):
            stricter.append("prompt_ref.task_name is not a str or None")
        if not is_count(target_step, optional=True):
            stricter.append("target_step is not a non-negative int64 or None")
        if not is_count(weight):
            stricter.append("start_weight_version is not a non-negative int64")
        if not isinstance(granularity, Gran):
            stricter.append("recovery_granularity is not a RecoveryGranularity")
        self.reserve(
            {
                "cut": cut,
                "prompt_id": prompt_id,
                "prompt_payload": prompt_payload,
                "expected_generations": n,
                "target_step": target_step,
                "start_weight_version": weight,
                "task_source": source,
                "recovery_granularity": granularity,
                "admitted": admitted,
                "group_id": group_id,
                "admission_id": admission_id,
                "prompt_ref": prompt_ref,
            },
            stricter,
        )

    @rule(
        cut=CUTS,
        group=GROUP,
        target_step=maybe(st.sampled_from([None, 0, 3]), [-1, 2**63, True, 1.5, "3"]),
        weight=maybe(st.sampled_from([0, 2]), [-1, None, 1.5, "0"]),
    )
    def admit(self, cut: Any, group: Any, target_step: Any, weight: Any) -> None:
        group_id = self.target(group)
        stricter = []
        if not is_count(target_step, optional=True):
            stricter.append("target_step is not a non-negative int64 or None")
        if not is_count(weight):
            stricter.append("start_weight_version is not a non-negative int64")
        self.both(
            "mark_group_admitted",
            lambda impl, ledger: ledger.mark_group_admitted(
                cut, group_id, target_step=target_step, start_weight_version=weight
            ),
            stricter,
        )

    @rule(
        cut=CUTS,
        group=GROUP,
        indices=maybe(
            st.one_of(st.none(), st.lists(st.integers(0, 2), max_size=3, unique=True)),
            [[5], [-1], [0, 0], "0", 3, [0.0], [True], [None]],
        ),
    )
    def dispatch(self, cut: Any, group: Any, indices: Any) -> None:
        group_id = self.target(group)
        self.both(
            "mark_group_dispatched",
            lambda impl, ledger: ledger.mark_group_dispatched(
                cut, group_id, generation_indices=copy.copy(indices)
            ),
        )

    # ----------------------------------------------------------------------- seals

    @rule(
        cut=CUTS,
        group=GROUP,
        index=INDEX,
        gate_kind=st.sampled_from(["current"] * 6 + ["stale", "bogus"]),
        receipt_kind=RECEIPT_KINDS,
        keys=st.integers(0, 2),
        reward=REWARD,
        mask=MASK,
        checks=CHECKS,
        ctx=CTX,
    )
    def seal_sibling(
        self,
        cut: Any,
        group: Any,
        index: Any,
        gate_kind: str,
        receipt_kind: str,
        keys: int,
        reward: Any,
        mask: Any,
        checks: Any,
        ctx: Any,
    ) -> None:
        if index == "auto":
            group_id, index = self.dispatched_sibling(group)
        else:
            group_id = self.target(group)
        gate = self.gate(group_id, index, gate_kind)
        seal = Seal(gate, receipt_for(receipt_kind, gate, keys), reward, mask, checks, ctx)
        self.seal_once(cut, group_id, index, seal)

    def seal_once(self, cut: Any, group_id: Any, index: Any, seal: Seal) -> None:
        def call(impl: Impl, ledger: Any) -> Any:
            return ledger.mark_sibling_sealed(
                cut,
                group_id,
                generation_index=index,
                gate_rollout_id=seal.gate,
                receipt=mat(impl, seal.receipt),
                reward=seal.reward,
                mask_sample=seal.mask,
                reward_checks=mat(impl, seal.checks),
                reward_log_context=mat(impl, seal.ctx),
            )

        stricter = seal_reasons(seal.receipt, seal.reward, seal.checks, seal.ctx)
        laxer = None
        record = self.record(group_id)
        if record is not None and type(index) is int and 0 <= index < len(record.siblings):
            current = record.siblings[index].current_attempt
            if (
                current.status is seed.RolloutAttemptStatus.SEALED
                and isinstance(seal.reward, float)
                and math.isnan(seal.reward)
                and math.isnan(current.reward)
            ):
                # The seed compares rewards with ==, so a redelivered NaN conflicts with
                # itself; ours takes an exact redelivery as the duplicate it is.
                laxer = "a redelivered NaN reward is a duplicate"
        _, mine = self.both("mark_sibling_sealed", call, stricter, laxer)
        if mine.error is None:
            self.last_seal = {"group_id": group_id, "index": index, "seal": seal}

    @rule(
        change=st.sampled_from(
            ["none", "none", "reward", "mask", "receipt", "checks", "ctx", "reward_none"]
        )
    )
    def reseal(self, change: str) -> None:
        """Redeliver the last accepted seal, exactly or with one field changed."""
        if self.last_seal is None:
            return
        seal = self.last_seal["seal"]
        if change == "reward":
            seal = dataclasses.replace(seal, reward=-7.0)
        elif change == "reward_none":
            seal = dataclasses.replace(seal, reward=None)
        elif change == "mask":
            seal = dataclasses.replace(seal, mask=not seal.mask)
        elif change == "receipt":
            receipt = seal.receipt
            seal = dataclasses.replace(
                seal, receipt=None if receipt is None else {**receipt, "late": 1}
            )
        elif change == "checks":
            seal = dataclasses.replace(seal, checks=Checks((True, False, True)))
        elif change == "ctx":
            seal = dataclasses.replace(seal, ctx=Ctx("other", None))
        self.seal_once(LIVE, self.last_seal["group_id"], self.last_seal["index"], seal)

    @rule(
        cut=CUTS,
        group=GROUP,
        shape=st.sampled_from(["all"] * 6 + ["missing", "extra", "list", "none"]),
        faults=st.lists(
            st.tuples(
                st.integers(0, 2),
                st.sampled_from(["gate", "stale", "receipt", "mask", "reward", "checks", "ctx"]),
                st.integers(0, 1000),
            ),
            max_size=2,
        ),
        receipt_kind=RECEIPT_KINDS,
        keys=st.integers(0, 2),
    )
    def seal_group(
        self,
        cut: Any,
        group: Any,
        shape: str,
        faults: list[tuple[int, str, int]],
        receipt_kind: str,
        keys: int,
    ) -> None:
        sealable = [
            record.group_id
            for record in self.seed.groups()
            if record.recovery_granularity is seed.RecoveryGranularity.PROMPT_GROUP
            and all(
                sibling.current_attempt.status is seed.RolloutAttemptStatus.DISPATCHED
                for sibling in record.siblings
            )
        ]
        if group[1] == "existing" and group[0] % 4:
            group_id = (
                sealable[group[0] % len(sealable)]
                if sealable
                else self.fresh_dispatched("prompt_group", group[0])
            )
        else:
            group_id = self.target(group)
        record = self.record(group_id)
        count = 2 if record is None else record.expected_generations
        results: dict[Any, Seal] = {}
        for index in range(count):
            gate = self.gate(group_id, index, "current")
            kind = receipt_kind if index == 0 else "ok"
            results[index] = Seal(gate, receipt_for(kind, gate, keys), 1.0, False)
        for index, fault, choice in faults:
            if index not in results:
                continue
            result = results[index]
            if fault == "gate":
                result = dataclasses.replace(result, gate="bogus")
            elif fault == "stale":
                result = dataclasses.replace(result, gate=self.gate(group_id, index, "stale"))
            elif fault == "receipt":
                kinds = ["none", "wrong_id", "no_manifest", "bad_entry", "not_dict", "set"]
                result = dataclasses.replace(
                    result, receipt=receipt_for(kinds[choice % len(kinds)], result.gate, 1)
                )
            elif fault == "mask":
                result = dataclasses.replace(result, mask=[0, None, "no"][choice % 3])
            elif fault == "reward":
                rewards = [None, "x", "1.5", 2**1100, float("nan"), True, [1]]
                result = dataclasses.replace(result, reward=rewards[choice % len(rewards)])
            elif fault == "checks":
                result = dataclasses.replace(result, checks={"low_effort": True})
            elif fault == "ctx":
                result = dataclasses.replace(result, ctx="agent")
            results[index] = result
        stricter = [
            reason
            for result in results.values()
            for reason in seal_reasons(result.receipt, result.reward, result.checks, result.ctx)
        ]
        argument: Any = results
        if shape == "missing":
            argument = dict(list(results.items())[1:])
        elif shape == "extra":
            argument = {**results, count: results[0]}
        elif shape == "list":
            argument = list(results.values())
        elif shape == "none":
            argument = None
        self.both(
            "mark_group_sealed",
            lambda impl, ledger: ledger.mark_group_sealed(cut, group_id, mat(impl, argument)),
            stricter,
        )

    @rule(
        group=GROUP,
        receipt_kind=st.sampled_from(["ok", "ok", "none", "extra"]),
        keys=st.integers(0, 2),
        reward=st.sampled_from([1.0, 0.0, 0.5, -1, float("nan")]),
        mask=st.booleans(),
        checks=st.one_of(st.none(), st.builds(Checks, st.tuples(*[st.booleans()] * 3))),
        ctx=st.sampled_from([None, Ctx("agent", None), Ctx("agent", '{"ok": 1}')]),
        target_step=st.sampled_from([None, 0, 3]),
        steps=st.integers(1, 6),
    )
    def advance(
        self,
        group: Any,
        receipt_kind: str,
        keys: int,
        reward: Any,
        mask: bool,
        checks: Any,
        ctx: Any,
        target_step: int | None,
        steps: int,
    ) -> None:
        """Take one group up to ``steps`` valid steps further, so deep states are reached."""
        group_id = self.target(group)
        for _ in range(steps):
            record = self.record(group_id)
            if record is None:
                return
            group = (0, "id", group_id)  # type: ignore[assignment]
            self.advance_once(
                group, record, receipt_kind, keys, reward, mask, checks, ctx, target_step
            )

    def advance_once(
        self,
        group: Any,
        record: Any,
        receipt_kind: str,
        keys: int,
        reward: Any,
        mask: bool,
        checks: Any,
        ctx: Any,
        target_step: int | None,
    ) -> None:
        group_id = record.group_id
        status = seed.PromptGroupStatus
        attempt = seed.RolloutAttemptStatus
        if record.runtime_prompt_payload is None:
            self.bind(LIVE, group, "match")
        elif record.phase is seed.PromptGroupPhase.RESERVED:
            self.admit(LIVE, group, target_step, 1)
        elif record.status is status.GENERATING:
            currents = [sibling.current_attempt.status for sibling in record.siblings]
            reserved = [i for i, current in enumerate(currents) if current is attempt.RESERVED]
            dispatched = [i for i, c in enumerate(currents) if c is attempt.DISPATCHED]
            if reserved:
                self.dispatch(LIVE, group, reserved)
            elif record.recovery_granularity is seed.RecoveryGranularity.PROMPT_GROUP and len(
                dispatched
            ) == len(currents):
                self.seal_group(LIVE, group, "all", [], receipt_kind, keys)
            elif dispatched and record.recovery_granularity is seed.RecoveryGranularity.SIBLING:
                index = dispatched[0]
                gate = self.gate(group_id, index, "current")
                receipt = receipt_for(receipt_kind, gate, keys)
                self.seal_once(
                    LIVE, group_id, index, Seal(gate, receipt, reward, mask, checks, ctx)
                )
            else:
                self.retry(LIVE, group)
        elif record.status is status.READY_TO_FINALIZE:
            self.finalization(LIVE, group, False)
        elif record.status is status.FINALIZING and keys == 1:
            self.finalization(LIVE, group, True)
        else:
            self.discard(LIVE, group)

    # ------------------------------------------------------- abandon, retry, restart

    @rule(cut=CUTS, group=GROUP)
    def abandon(self, cut: Any, group: Any) -> None:
        group_id = self.target(group)
        self.both("abandon_unsealed", lambda impl, ledger: ledger.abandon_unsealed(cut, group_id))

    @rule(cut=CUTS, group=GROUP)
    def retry(self, cut: Any, group: Any) -> None:
        group_id = self.target(group)
        self.both(
            "prepare_incomplete_retry",
            lambda impl, ledger: ledger.prepare_incomplete_retry(cut, group_id),
        )

    @rule(cut=CUTS)
    def restart(self, cut: Any) -> None:
        self.both("prepare_for_restart", lambda impl, ledger: ledger.prepare_for_restart(cut))

    # ------------------------------------------------------ finalization and discards

    @rule(cut=CUTS, group=GROUP, unknown=st.booleans())
    def finalization(self, cut: Any, group: Any, unknown: bool) -> None:
        group_id = self.target(group)
        if unknown:
            self.both(
                "mark_finalization_unknown",
                lambda impl, ledger: ledger.mark_finalization_unknown(cut, group_id),
            )
        else:
            self.both(
                "mark_finalization_started",
                lambda impl, ledger: ledger.mark_finalization_started(cut, group_id),
            )

    @rule(cut=CUTS, group=GROUP)
    def discard(self, cut: Any, group: Any) -> None:
        group_id = self.target(group)
        self.both("discard_group", lambda impl, ledger: ledger.discard_group(cut, group_id))

    @rule(
        cut=CUTS,
        ids=st.sampled_from(
            [
                set(),
                {"g0"},
                {"g1", "g2", "nope"},
                frozenset({"g3"}),
                ["g0", "g0"],
                ("g2",),
                {"g1": 1},
                "g0",
                b"g1",
                None,
                5,
            ]
        ),
    )
    def discard_canonical(self, cut: Any, ids: Any) -> None:
        stricter = []
        if isinstance(ids, str | bytes):
            stricter.append("group_ids is a bare string, not a collection of ids")
        if not isinstance(ids, set | frozenset | list | tuple | dict | str | bytes):
            stricter.append("group_ids is not a collection of ids")
        self.both(
            "discard_canonical_groups",
            lambda impl, ledger: ledger.discard_canonical_groups(cut, copy.copy(ids)),
            stricter,
        )

    # ----------------------------------------------------------- prompts and restores

    @rule(
        cut=CUTS,
        group=GROUP,
        kind=st.sampled_from(["match"] * 4 + PAYLOAD_FAULTS),
    )
    def bind(self, cut: Any, group: Any, kind: str) -> None:
        group_id = self.target(group)
        record = self.record(group_id)
        ref = record.prompt_ref if record is not None else seed.PromptRef("7")
        sample_id = ref.sample_id
        idx = int(sample_id) if isinstance(sample_id, str) and sample_id.isdigit() else 7
        prompt_payload = payload_for(kind, idx, ref.task_name)
        self.both(
            "bind_runtime_prompt",
            lambda impl, ledger: ledger.bind_runtime_prompt(cut, group_id, prompt_payload),
        )

    @rule(load=st.booleans(), cut=CUTS)
    def round_trip(self, load: bool, cut: Any) -> None:
        """Restore both ledgers from their own state dicts (prompts must be bound again)."""
        theirs = outcome(self.seed.state_dict)
        mine = outcome(self.ours.state_dict)
        if theirs.error is not None or mine.error is not None:
            return  # compared by the invariant
        states = {"seed": theirs.value, "ours": mine.value}
        fresh: dict[str, Any] = {}

        def call(impl: Impl, ledger: Any) -> Any:
            state = copy.deepcopy(states[impl.name])
            if load:
                restored = impl.ledger()
                restored.load_state_dict(cut, state)
            else:
                restored = impl.ledger.from_state_dict(state)
            fresh[impl.name] = restored
            return dump(restored)

        seed_result, our_result = self.both("restore", call)
        if seed_result.error is None and our_result.error is None:
            self.seed, self.ours = fresh["seed"], fresh["ours"]

    @rule(cut=CUTS)
    def load_into_nonempty(self, cut: Any) -> None:
        theirs = outcome(self.seed.state_dict)
        if theirs.error is not None:
            return
        state = theirs.value
        self.both(
            "load_state_dict",
            lambda impl, ledger: ledger.load_state_dict(cut, copy.deepcopy(state)),
        )

    @rule(mutation=MUTATION, load=st.booleans())
    def restore_hostile(self, mutation: tuple[int, str, Any], load: bool) -> None:
        """Restore a state with one fault: both refuse it with one type, or both load it."""
        theirs = outcome(self.seed.state_dict)
        if theirs.error is not None:
            return
        state = mutate(theirs.value, *mutation)

        def call(impl: Impl, ledger: Any) -> Any:
            restored = impl.ledger()
            if load:
                restored.load_state_dict(LIVE, copy.deepcopy(state))
            else:
                restored = impl.ledger.from_state_dict(copy.deepcopy(state))
            return dump(restored)

        stricter = ["UTF-8 is what a string of the state is not"] if non_utf8_strings(state) else []
        self.both("restore (hostile state)", call, stricter)

    # -------------------------------------------------------------------- sidecars

    @rule(
        shortfall=maybe(
            st.sampled_from([{}, {0: 1}, {3: 2, 5: 0}]),
            [[], None, "x", {-1: 1}, {True: 1}, {1: -1}, {1: 2**63}, {2**63: 0}, {"1": 1}],
        ),
        stamps=maybe(st.booleans(), [None, 1, "yes"]),
        metrics=maybe(
            st.sampled_from([None, {}, {"g0": {"m": 1.0}}, {"g0": {"m": 1, "n": 2.5}, "g1": {}}]),
            [
                {"g0": {"m": True}},
                {"g0": []},
                {1: {}},
                {"g0": {"m": 2**1100}},
                {"g0": {1: 1.0}},
                [],
                "x",
            ],
        ),
        rewards=maybe(
            st.sampled_from(
                [
                    None,
                    {},
                    {"g0": [Final("3", "g0_g0_a1", 1.0)]},
                    {"g0": [Final("3", "r", 0, Ctx("agent", None))], "g1": []},
                ]
            ),
            [
                {"g0": [{"sample_id": "3", "rollout_id": "r", "reward": 1.0, "log_context": None}]},
                {"g0": "x"},
                {"g0": [Final("3", "r", 1.0), Final("3", "s", 2.0)]},
                {"g9": [Final("3", "r", 1.0)]},
                {1: []},
                [],
            ],
        ),
        reward_settings=maybe(st.sampled_from([None, Settings(0), Settings(1)]), [{}, "x"]),
        canonical=maybe(
            st.sampled_from([None, set(), {"g0"}, {"g0", "g1"}, frozenset({"g2"}), ["g1"]]),
            ["g0", b"g0", 5],
        ),
        split=st.sampled_from([False, False, True]),
    )
    def build(
        self,
        shortfall: Any,
        stamps: Any,
        metrics: Any,
        rewards: Any,
        reward_settings: Any,
        canonical: Any,
        split: bool,
    ) -> None:
        if split:
            # Half of an admission batch admitted: a controller passes through this state
            # between two admission calls, and the seed would write it (see the docstring).
            admission_id = f"batch{self.step}"
            for admitted in (False, True):
                self.reserve_valid(
                    7, None, False, 1, 3, 0, None, "sibling", admitted, None, admission_id
                )
        stricter = []
        if isinstance(canonical, str | bytes):
            stricter.append("canonical_group_ids is a bare string")
        if isinstance(shortfall, dict) and any(
            type(k) is int and type(v) is int and max(k, v) > INT64_MAX
            for k, v in shortfall.items()
        ):
            stricter.append("batch_shortfall holds an integer beyond int64")

        def call(impl: Impl, ledger: Any) -> Any:
            return impl.build(
                ledger,
                batch_shortfall=copy.deepcopy(shortfall),
                sampler_stamps_target_steps=stamps,
                finalizer_metrics_by_group=copy.deepcopy(metrics),
                finalizer_rewards_by_group=mat(impl, rewards),
                reward_settings=mat(impl, reward_settings),
                canonical_group_ids=copy.copy(canonical),
            )

        self.step += 1
        with fixed_uuids(self.step << 20):
            theirs = outcome(lambda: call(SEED, self.seed))
            mine = outcome(lambda: call(OURS, self.ours))
        note(f"build: seed {describe(theirs)}; ours {describe(mine)}")
        if theirs.error is None and mine.error is not None and stricter:
            self.check_stricter("build_rollout_recovery_state", mine.error, stricter)
            return
        written = self.check_written(
            "build_rollout_recovery_state",
            theirs,
            mine,
            lambda: {"schema_version": 3, "groups": theirs.value["groups"]},
        )
        if not written:
            return
        self.last_sidecar = theirs.value
        parsed = {"seed": theirs.value, "ours": mine.value}

        def parse_and_restore(impl: Impl, ledger: Any) -> Any:
            result = impl.parse(copy.deepcopy(parsed[impl.name]))
            restored = impl.ledger.from_state_dict(result.ledger_state)
            return (result, dump(restored))

        self.both("parse_rollout_recovery_state (built)", parse_and_restore)

    @rule(
        mutation=MUTATION,
        top=st.sampled_from(
            [None, "batch_shortfall", "sampler_stamps_target_steps", "reward_settings"]
        ),
        top_value=st.sampled_from(STATE_HOSTILE),
        settings_record=st.sampled_from(SETTINGS_RECORDS),
    )
    def parse_hostile(
        self,
        mutation: tuple[int, str, Any],
        top: str | None,
        top_value: Any,
        settings_record: Any,
    ) -> None:
        base = self.last_sidecar
        if base is None:
            base = {
                "schema_version": 3,
                "groups": [],
                "batch_shortfall": {1: 2},
                "sampler_stamps_target_steps": True,
                "finalizer_metrics_by_group": {"g0": {"m": 1.0}},
                "finalizer_rewards_by_group": {
                    "g0": [
                        {"sample_id": "1", "rollout_id": "r", "reward": 1.0, "log_context": None}
                    ]
                },
                "reward_settings": None,
            }
        state = mutate(base, *mutation)
        if isinstance(state, dict) and top is not None:
            state[top] = settings_record if top == "reward_settings" else top_value

        def call(impl: Impl, ledger: Any) -> Any:
            return impl.parse(copy.deepcopy(state))

        stricter = ["UTF-8 is what a string of the state is not"] if non_utf8_strings(state) else []
        shortfall = state.get("batch_shortfall") if isinstance(state, dict) else None
        if isinstance(shortfall, dict) and any(
            type(item) is int and item > INT64_MAX for pair in shortfall.items() for item in pair
        ):
            stricter.append("batch_shortfall holds an integer beyond int64")
        self.both("parse_rollout_recovery_state (hostile)", call, stricter)


# SEED_DIFFERENTIAL_EXAMPLES=5000 for a long local run.
SeedDifferential.TestCase.settings = settings(
    max_examples=int(os.environ.get("SEED_DIFFERENTIAL_EXAMPLES", "300")),
    stateful_step_count=30,
)
TestSeedDifferential = pytest.mark.slow(SeedDifferential.TestCase)
