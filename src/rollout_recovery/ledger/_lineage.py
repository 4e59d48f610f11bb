"""Which of NeMo-RL's two schema-3 lineages a sidecar is, judged from its content alone.

Both write ``schema_version: 3`` and share most field names, yet name an attempt
differently (``docs/nemo-rl-lineages.md`` has the sources):

* the **uuid** lineage (the seed this package re-implements, and every file it writes):
  an attempt is ``attempt_uuid`` (16 bytes) and its gate id ``<logical>_a<uuid hex>``;
* the **Gym** lineage (NVIDIA-NeMo/RL PR #4085 and its stack): an attempt is a numeric
  ``attempt_index`` (0, 1, 2, ... per sibling) and its capture key ``<logical>`` for
  attempt 0, ``<logical>-a<N>`` after.

An attempt of one lineage is never read as an attempt of the other: each lineage's
reader refuses an attempt of the other kind, naming its path, and the uuid reader refuses
a whole Gym-lineage state before looking inside it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from enum import StrEnum
from typing import Any, Final

from ..errors import InvalidStateError

__all__ = [
    "GYM_ONLY_SIDECAR_FIELDS",
    "UUID_ONLY_SIDECAR_FIELDS",
    "SidecarLineage",
    "gym_state_refusal",
    "is_gym_capture_key",
    "is_uuid_gate_id",
    "lineage_mismatches",
    "mismatch_error",
]

# Top-level fields only one lineage writes; either settles a file's lineage at once.
GYM_ONLY_SIDECAR_FIELDS: Final = frozenset({"pending_completed_execution_acknowledgements"})
UUID_ONLY_SIDECAR_FIELDS: Final = frozenset(
    {"reward_settings", "finalizer_metrics_by_group", "finalizer_rewards_by_group"}
)
_GYM_ONLY_GROUP_FIELD: Final = "resolved_agent_name"
_ATTEMPT_INDEX: Final = "attempt_index"
_NOT_REUSED: Final = "an attempt of one lineage is never read as an attempt of the other"
_UUID_GATE_SUFFIX: Final = re.compile(r"_a[0-9a-f]{32}")
_GYM_ATTEMPT_SUFFIX: Final = re.compile(r"-a[1-9][0-9]*")


class SidecarLineage(StrEnum):
    """A sidecar's lineage; a member equals its name as a string."""

    UUID = "uuid"
    GYM = "gym"

    @property
    def attempt_identity(self) -> str:
        """The attempt field that names an attempt in this lineage."""
        return "attempt_uuid" if self is SidecarLineage.UUID else _ATTEMPT_INDEX

    @property
    def capture_keys(self) -> str:
        """How this lineage spells an attempt's gate id (its receipt's ``rollout_id``)."""
        if self is SidecarLineage.UUID:
            return "<logical>_a<attempt_uuid hex>"
        return "<logical> for attempt 0, <logical>-a<N> after"

    def describe(self) -> str:
        """One line for people: the lineage, its attempt identity and its capture keys."""
        origin = (
            "NeMo-RL schema 3 as this package writes it"
            if self is SidecarLineage.UUID
            else "NeMo-RL schema 3 of the Gym checkpoint line, PR #4085"
        )
        return f"{self.value} ({origin}: {self.attempt_identity}, gate ids {self.capture_keys})"

    @classmethod
    def of(cls, state: object) -> SidecarLineage:
        """The lineage of a decoded sidecar or ledger state, from its content.

        Decided by the first evidence found: a top-level field only one lineage writes,
        else the first attempt (with ``attempt_index`` or without), else a group field
        only the Gym lineage writes; a state holding none of them (not a mapping, no
        attempts) is the uuid lineage's, whose reader reports what is wrong with it.
        Attempts disagreeing with the answer are the chosen lineage's reader's to refuse
        (:func:`lineage_mismatches`). Raises :class:`InvalidStateError` only for a state
        whose top level carries fields of both lineages.
        """
        return _decide(state)[0]


def _decide(state: object) -> tuple[SidecarLineage, str]:
    """The lineage and the evidence for it, in words an error message can quote."""
    if not isinstance(state, dict):
        return SidecarLineage.UUID, "not a mapping"
    gym = sorted(GYM_ONLY_SIDECAR_FIELDS & state.keys())
    uuid = sorted(UUID_ONLY_SIDECAR_FIELDS & state.keys())
    if gym and uuid:
        raise InvalidStateError(
            f"the sidecar holds fields of both lineages: {gym} only the Gym lineage writes "
            f"and {uuid} only the uuid lineage writes; a sidecar holds one lineage",
            path=f"$.{gym[0]}",
        )
    if gym:
        return SidecarLineage.GYM, f"its field {gym[0]!r}"
    if uuid:
        return SidecarLineage.UUID, f"its field {uuid[0]!r}"
    for path, attempt in _attempts(state):
        if _ATTEMPT_INDEX in attempt:
            return SidecarLineage.GYM, f"its first attempt, at {path}, has {_ATTEMPT_INDEX}"
        return SidecarLineage.UUID, f"its first attempt, at {path}, has no {_ATTEMPT_INDEX}"
    groups = state.get("groups")
    if isinstance(groups, list):
        for position, group in enumerate(groups):
            if isinstance(group, dict) and _GYM_ONLY_GROUP_FIELD in group:
                return SidecarLineage.GYM, f"its field $.groups[{position}].{_GYM_ONLY_GROUP_FIELD}"
    return SidecarLineage.UUID, "no attempt and no field only the Gym lineage writes"


def _attempts(state: dict[Any, Any]) -> Iterator[tuple[str, dict[Any, Any]]]:
    """Every attempt mapping in document order with its path; malformed parts skipped
    (the lineage's reader reports them)."""
    groups = state.get("groups")
    if not isinstance(groups, list):
        return
    for g, group in enumerate(groups):
        siblings = group.get("siblings") if isinstance(group, dict) else None
        if not isinstance(siblings, list):
            continue
        for s, sibling in enumerate(siblings):
            attempts = sibling.get("attempts") if isinstance(sibling, dict) else None
            if not isinstance(attempts, list):
                continue
            for a, attempt in enumerate(attempts):
                if isinstance(attempt, dict):
                    yield f"$.groups[{g}].siblings[{s}].attempts[{a}]", attempt


def mismatch_error(lineage: SidecarLineage, evidence: str | None = None) -> str:
    """The message for an attempt of the other lineage inside a ``lineage`` state.

    The uuid reader calls it for an attempt carrying ``attempt_index``; the Gym reader for
    one without it. ``evidence`` says why the state is of ``lineage`` when that is known.
    """
    why = f" ({evidence})" if evidence else ""
    if lineage is SidecarLineage.UUID:
        return (
            f"{_ATTEMPT_INDEX} names a Gym-lineage attempt, but this is a uuid-lineage "
            f"state{why} whose attempts are named by attempt_uuid; {_NOT_REUSED}"
        )
    return (
        f"missing {_ATTEMPT_INDEX}: this is a Gym-lineage state{why}, and an attempt without "
        f"one is a uuid-lineage attempt; {_NOT_REUSED}"
    )


def lineage_mismatches(state: object) -> Iterator[InvalidStateError]:
    """One error per attempt that is not of the state's lineage (see :meth:`SidecarLineage.of`),
    located at its ``attempt_index``; nothing for a state that is not a mapping."""
    if not isinstance(state, dict):
        return
    lineage, evidence = _decide(state)
    for path, attempt in _attempts(state):
        if (_ATTEMPT_INDEX in attempt) is not (lineage is SidecarLineage.GYM):
            yield InvalidStateError(
                mismatch_error(lineage, evidence), path=f"{path}.{_ATTEMPT_INDEX}"
            )


def gym_state_refusal(context: str) -> str:
    """Why the uuid lineage's reader refuses a whole Gym-lineage state."""
    return (
        f"{context} is NeMo-RL's Gym lineage (attempts named by {_ATTEMPT_INDEX}, gate ids "
        f"{SidecarLineage.GYM.capture_keys}); this ledger holds uuid-lineage attempts only "
        f"and {_NOT_REUSED}: `rollout-recovery inspect` and `validate` read it, a restore "
        "cannot"
    )


def is_uuid_gate_id(rollout_id: object, logical: str) -> bool:
    """Whether ``rollout_id`` is ``logical``'s gate id as the uuid lineage spells it."""
    return (
        isinstance(rollout_id, str)
        and rollout_id.startswith(logical)
        and _UUID_GATE_SUFFIX.fullmatch(rollout_id, len(logical)) is not None
    )


def is_gym_capture_key(rollout_id: object, logical: str) -> bool:
    """Whether ``rollout_id`` is a capture key of ``logical`` as the Gym lineage spells it."""
    return isinstance(rollout_id, str) and (
        rollout_id == logical
        or (
            rollout_id.startswith(logical)
            and _GYM_ATTEMPT_SUFFIX.fullmatch(rollout_id, len(logical)) is not None
        )
    )
