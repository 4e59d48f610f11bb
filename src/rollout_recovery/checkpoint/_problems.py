"""Every problem of a sidecar state, one per line, for ``rollout-recovery validate``.

The loaders stop at the first fault (a restore needs one reason to refuse, and must refuse
fast). A person repairing or triaging a file wants all of them, so this module reruns the
same validators on independent slices of the state: each top-level field alone, each
group alone, then the rules that span groups (unique group ids, unique attempt identities
across the whole ledger, shared admissions agreeing). The loaders stay the authority: when
the slices find nothing, the full validation runs once more, and a fault it reports (one
the slicing cannot see) is a problem too. So the list is empty exactly when the state loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from ..errors import InvalidStateError, InvalidStateTypeError
from ..ledger import (
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    RolloutRecoveryLedger,
    parse_rollout_recovery_state,
)
from ..ledger.codec_support import (
    SIDECAR_STATE_FIELDS,
    SidecarLineage,
    gym_sidecar_problems,
    lineage_mismatches,
)
from ._native import read_native_envelope

__all__ = ["SidecarProblem", "find_sidecar_problems"]

_SchemaErrors = (InvalidStateError, InvalidStateTypeError)
# A state every top-level check accepts; each field under test is put into a copy of it.
_NEUTRAL: dict[str, Any] = {
    "schema_version": ROLLOUT_RECOVERY_SCHEMA_VERSION,
    "groups": [],
    "reward_settings": None,
    "finalizer_metrics_by_group": {},
    "finalizer_rewards_by_group": {},
}


@dataclass(frozen=True)
class SidecarProblem:
    """One fault: the JSON path of the field at fault and what is wrong with it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _problem(error: InvalidStateError | InvalidStateTypeError, prefix: str = "") -> SidecarProblem:
    path = error.path or "$"
    message = error.message
    if prefix:
        # A group validated alone sits at $.groups[0]; put it back at its real position.
        path = prefix + path.removeprefix("$.groups[0]")
        message = message.replace("$.groups[0]", prefix)
    return SidecarProblem(path=path, message=message)


def find_sidecar_problems(state: object) -> list[SidecarProblem]:
    """All faults of a decoded sidecar state; empty exactly when it fully validates.

    ``state`` may also be the bytes of a native file whose typed decode stopped at its
    first type error: the checksum proves the payload is what the writer wrote, so it is
    decoded without the schema and the per-field validators list everything. Any surprise
    there gives an empty list (the caller reports the typed decoder's own error).
    """
    if isinstance(state, bytes | bytearray | memoryview):
        try:
            untyped: Any = msgspec.msgpack.decode(read_native_envelope(state).payload)
            return find_sidecar_problems(untyped)
        except Exception:  # a best-effort listing
            return []
    if not isinstance(state, dict):
        try:
            parse_rollout_recovery_state(state)
        except _SchemaErrors as error:
            return [_problem(error)]
        raise AssertionError("a non-dict sidecar passed validation")  # pragma: no cover
    try:
        lineage = SidecarLineage.of(state)
    except _SchemaErrors as error:  # both lineages' fields at the top: nothing else to say
        return [_problem(error)]
    if lineage is SidecarLineage.GYM:
        return _unique([_problem(error) for error in gym_sidecar_problems(state)])
    # Every attempt of the other lineage, then the rest; a group's own check stops at its
    # first such attempt with the same path.
    mismatches = [_problem(error) for error in lineage_mismatches(state)]
    mismatched = {problem.path for problem in mismatches}
    problems = mismatches + [p for p in _uuid_problems(state) if p.path not in mismatched]
    return _unique(problems)


def _uuid_problems(state: dict[Any, Any]) -> list[SidecarProblem]:
    problems = _top_level_problems(state)
    groups = state.get("groups")
    if isinstance(groups, list):
        problems += _group_problems(groups)
    if not problems:
        try:
            parsed = parse_rollout_recovery_state(state)
            RolloutRecoveryLedger.from_state_dict(parsed.ledger_state)
        except _SchemaErrors as error:
            problems.append(_problem(error))
    return problems


def _unique(problems: list[SidecarProblem]) -> list[SidecarProblem]:
    return list(dict.fromkeys(problems))


def _check(candidate: dict[str, Any]) -> SidecarProblem | None:
    try:
        parse_rollout_recovery_state(candidate)
    except _SchemaErrors as error:
        return _problem(error)
    return None


def _top_level_problems(state: dict[Any, Any]) -> list[SidecarProblem]:
    problems: list[SidecarProblem] = []
    unknown = {key: value for key, value in state.items() if key not in SIDECAR_STATE_FIELDS}
    if unknown:
        found = _check({**_NEUTRAL, **unknown})
        if found is not None:
            problems.append(found)
    for key in sorted(SIDECAR_STATE_FIELDS):
        if key not in state:
            if key in _NEUTRAL:  # the others may be absent (older sidecars omit them)
                problems.append(
                    SidecarProblem(f"$.{key}", f"rollout recovery sidecar is missing {key!r}")
                )
            continue
        if key == "finalizer_rewards_by_group":
            continue  # checked with the metrics it must match, below
        # groups: only its container type here; each group is checked on its own.
        value = [] if key == "groups" and isinstance(state[key], list) else state[key]
        found = _check({**_NEUTRAL, key: value})
        if found is not None:
            problems.append(found)
    if "finalizer_rewards_by_group" in state:
        metrics = state.get("finalizer_metrics_by_group", {})
        found = _check(
            {
                **_NEUTRAL,
                "finalizer_metrics_by_group": metrics if isinstance(metrics, dict) else {},
                "finalizer_rewards_by_group": state["finalizer_rewards_by_group"],
            }
        )
        if found is not None and found.path != "$.finalizer_metrics_by_group":
            problems.append(found)
    return problems


def _group_problems(groups: list[Any]) -> list[SidecarProblem]:
    problems: list[SidecarProblem] = []
    first_by_id: dict[str, int] = {}
    first_by_uuid: dict[bytes, str] = {}
    admissions: dict[str, tuple[Any, Any]] = {}
    for position, group in enumerate(groups):
        prefix = f"$.groups[{position}]"
        try:
            RolloutRecoveryLedger.from_state_dict(
                {"schema_version": ROLLOUT_RECOVERY_SCHEMA_VERSION, "groups": [group]}
            )
        except _SchemaErrors as error:
            problems.append(_problem(error, prefix))
            continue
        # The group is valid on its own, so its fields have their schema types now.
        group_id = group["group_id"]
        if group_id in first_by_id:
            problems.append(
                SidecarProblem(
                    f"{prefix}.group_id",
                    f"duplicate recovery group_id={group_id!r} (first at "
                    f"$.groups[{first_by_id[group_id]}])",
                )
            )
        else:
            first_by_id[group_id] = position
        for s, sibling in enumerate(group["siblings"]):
            for a, attempt in enumerate(sibling["attempts"]):
                where = f"{prefix}.siblings[{s}].attempts[{a}].attempt_uuid"
                uuid_bytes = attempt["attempt_uuid"]
                if uuid_bytes in first_by_uuid:
                    problems.append(
                        SidecarProblem(
                            where,
                            f"duplicate rollout attempt identity {uuid_bytes.hex()} (first at "
                            f"{first_by_uuid[uuid_bytes]})",
                        )
                    )
                else:
                    first_by_uuid[uuid_bytes] = where
        # target_step may be absent: the seed reads it with .get (None).
        signature = (group["phase"], group.get("target_step"))
        if admissions.setdefault(group["admission_id"], signature) != signature:
            problems.append(
                SidecarProblem(
                    f"{prefix}.admission_id",
                    "rollout recovery groups sharing admission_id="
                    f"{group['admission_id']!r} disagree on phase or target_step",
                )
            )
    return problems
