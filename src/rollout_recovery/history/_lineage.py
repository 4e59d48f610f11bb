"""What the journal establishes about every prompt group, re-derived record by record.

The auditor's own model of a run, written from ``docs/journal.md`` and independent of the
controller's transitions (an auditor that reused them would pass what they get wrong). Each
record is checked against the state the records before it established, then applied:

- ``prompt_taken`` makes a group with one reserved attempt per sibling; ``batch_admitted``
  gives it its target step; ``round_started`` dispatches exactly its siblings that need an
  attempt (a reserved one under its own id, an abandoned one under a fresh id);
- a seal seals the sibling's dispatched attempt, under that attempt's id; an abandon
  closes every attempt in flight; a drop ends the group;
- ``group_published`` needs every sibling sealed and keeps the seals it published;
  ``step_trained`` trains exactly the groups published for its step, each row stating what
  its seal, its prompt and its publish established;
- a ``restored`` record rebuilds the state at its snapshot and replays the records after
  it as the restore did: training rolled back, the groups it rewound skipped (their
  records after the snapshot void), then every attempt in flight abandoned.

The state keeps an undo log, so the state at any earlier position (a snapshot's) is the
live state with the entries after it undone: a restore costs the records it replays.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, assert_never

from ..ledger import RecoveryGranularity
from ..rollout import FailureReason
from ._trained_rows import check_trained_rows, close
from .records import (
    AttemptResumed,
    AttemptsAbandoned,
    BackendEvent,
    BatchAdmitted,
    CheckpointCommitted,
    GroupPublished,
    GroupSealed,
    HistoryRecord,
    PromptAliased,
    PromptDropped,
    PromptTaken,
    Restored,
    RoundStarted,
    RunStarted,
    Seal,
    SiblingSealed,
    StepTrained,
    TrainedRow,
)

__all__ = [
    "Lineage",
    "Sibling",
    "SiblingStatus",
    "Where",
    "restart_abandon",
    "seals_of",
]


def seals_of(record: SiblingSealed | GroupSealed) -> list[Seal]:
    return [record.seal] if isinstance(record, SiblingSealed) else list(record.seals)


class SiblingStatus(StrEnum):
    """The state of a sibling's current attempt (the ledger's, as the journal says it)."""

    RESERVED = "reserved"
    DISPATCHED = "dispatched"
    SEALED = "sealed"
    ABANDONED = "abandoned"


class Where(StrEnum):
    """Who owns a group: the ledger, the replay index (published), or nobody any more."""

    LEDGER = "ledger"
    PUBLISHED = "published"
    TRAINED = "trained"
    DROPPED = "dropped"


@dataclass(frozen=True, slots=True)
class Sibling:
    #: Every attempt id the sibling was given, the current one last.
    attempts: tuple[str, ...]
    status: SiblingStatus
    seal: Seal | None = None
    seal_line: int = 0

    @property
    def current(self) -> str:
        return self.attempts[-1]


@dataclass(frozen=True, slots=True)
class _Group:
    taken: PromptTaken
    line: int
    siblings: tuple[Sibling, ...]
    admitted: BatchAdmitted | None = None
    where: Where = Where.LEDGER
    published: GroupPublished | None = None

    @property
    def cohort(self) -> bool:
        return self.taken.granularity is RecoveryGranularity.PROMPT_GROUP

    @property
    def all_sealed(self) -> bool:
        return all(s.status is SiblingStatus.SEALED for s in self.siblings)

    def with_sibling(self, index: int, sibling: Sibling) -> _Group:
        siblings = list(self.siblings)
        siblings[index] = sibling
        return replace(self, siblings=tuple(siblings))


_MISSING = object()


@dataclass(slots=True)
class _Cells:
    """The state, every change undoable back to a journal offset."""

    groups: dict[str, _Group] = field(default_factory=dict)
    #: Dataloader batch -> its groups, in the order taken.
    batches: dict[int, tuple[str, ...]] = field(default_factory=dict)
    #: Target step -> groups published for it and not trained yet (the replay index).
    ready: dict[int, tuple[str, ...]] = field(default_factory=dict)
    #: ``step`` (the next step to train), ``version`` (the policy's weight version).
    scalars: dict[str, int] = field(default_factory=lambda: {"step": 0, "version": 0})
    _log: list[tuple[int, dict[Any, Any], Hashable, object]] = field(default_factory=list)
    offset: int = 0

    def set(self, cell: dict[Any, Any], key: Hashable, value: object) -> None:
        self._log.append((self.offset, cell, key, cell.get(key, _MISSING)))
        cell[key] = value

    def undo_to(self, offset: int) -> None:
        """Undo every change made by a record at ``offset`` or after."""
        log = self._log
        while log and log[-1][0] >= offset:
            _, cell, key, old = log.pop()
            if old is _MISSING:
                del cell[key]
            else:
                cell[key] = old


class Lineage:
    """The run as the journal establishes it: :meth:`apply` checks and applies one
    record, :meth:`restart` does what a restore does after its replay, and ``cells``
    undo back to any offset (the state a snapshot there held). Which records a restore
    replays, and how, is the walker's (``_trail_check``)."""

    def __init__(self, *, group_size: int | None, prompts_per_step: int | None) -> None:
        self.group_size = group_size
        self.prompts_per_step = prompts_per_step
        #: A run that takes prompts one at a time and trains them when its caller says
        #: (the recorder's, ``prompts_per_step = 0``: a foreign loop owns the schedule):
        #: no batch trains at the step of its number, and a step trains groups published
        #: for any step. Everything else is checked as for the controller's runs.
        self.unscheduled = prompts_per_step == 0
        self.cells = _Cells()
        #: The highest weight version any step produced (rolled-back ones included: the
        #: versions after a restore continue above it). Never undone.
        self.highest = 0
        #: Every attempt id any record named first, so none is given twice.
        self.attempt_ids: set[str] = set()
        #: Calls handed to each resumed attempt (``attempt_resumed``).
        self.handed: dict[str, int] = {}
        #: The history version the records were written under (``run_started``).
        self.version = 1
        #: True while a restore's replay re-applies records already checked live.
        self.replaying = False

    # -- reading the state -----------------------------------------------------------------

    @property
    def step(self) -> int:
        return self.cells.scalars["step"]

    @property
    def weight_version(self) -> int:
        return self.cells.scalars["version"]

    def group(self, group_id: str) -> _Group | None:
        return self.cells.groups.get(group_id)

    def in_ledger(self) -> Iterator[_Group]:
        return (g for g in self.cells.groups.values() if g.where is Where.LEDGER)

    def canonical_groups(self) -> int:
        return sum(len(groups) for groups in self.cells.ready.values())

    # -- one record --------------------------------------------------------------------------

    def apply(self, record: HistoryRecord, *, offset: int, line: int) -> list[str]:
        """Check ``record`` against the state, then apply it; returns what it contradicts
        (without its place: the caller adds it). Records without state effect (a restore,
        a checkpoint, a backend's event, a start) are the walker's to check."""
        self.cells.offset = offset
        match record:
            case PromptTaken():
                return self._prompt_taken(record, line)
            case PromptAliased():  # the recorder's caller's new ids for a taken prompt
                return self._known(record.group_id, "an alias")[1]
            case BatchAdmitted():
                return self._batch_admitted(record)
            case RoundStarted():
                return self._round_started(record)
            case AttemptResumed():
                return self._attempt_resumed(record)
            case SiblingSealed() | GroupSealed():
                return self._sealed(record, line)
            case AttemptsAbandoned():
                return self._abandoned(record)
            case PromptDropped():
                return self._dropped(record)
            case GroupPublished():
                return self._published(record)
            case StepTrained():
                return self._trained(record)
            case RunStarted() | CheckpointCommitted() | Restored() | BackendEvent():
                return []
            case _:
                assert_never(record)

    def _known(self, group_id: str, what: str) -> tuple[_Group | None, list[str]]:
        group = self.group(group_id)
        if group is None:
            return None, [f"{what} names group {group_id}, which was never taken"]
        return group, []

    def _in_ledger(self, group_id: str, what: str) -> tuple[_Group | None, list[str]]:
        group, problems = self._known(group_id, what)
        if group is not None and group.where is not Where.LEDGER:
            return None, [f"{what} names group {group_id}, which is {group.where.value} already"]
        return group, problems

    def _fresh_attempt(self, group_id: str, index: int, rollout_id: str) -> list[str]:
        problems = []
        if not rollout_id.startswith(f"{group_id}_g{index}_a"):
            problems.append(
                f"attempt id {rollout_id} does not name sibling ({group_id}, {index}) "
                f"(expected {group_id}_g{index}_a<id>)"
            )
        if rollout_id in self.attempt_ids and not self.replaying:
            problems.append(f"attempt id {rollout_id} was given before")
        self.attempt_ids.add(rollout_id)
        return problems

    def _at_version(self, stated: int, what: str) -> list[str]:
        """``what`` happened at weight version ``stated``: the policy's then. (A replay
        leaves rolled-back training out, so only the live pass knows the version.)"""
        if self.replaying or stated == self.weight_version:
            return []
        return [f"{what} at weight version {stated} while the policy was at {self.weight_version}"]

    def _prompt_taken(self, record: PromptTaken, line: int) -> list[str]:
        cells = self.cells
        group_id = record.group_id
        if group_id in cells.groups:
            return []  # the walker reports a group taken twice
        problems: list[str] = []
        size = self.group_size
        if size is not None and len(record.attempts) != size:
            problems.append(
                f"group {group_id} was taken with {len(record.attempts)} attempts for "
                f"{size} siblings"
            )
        for index, rollout_id in enumerate(record.attempts):
            problems += self._fresh_attempt(group_id, index, rollout_id)
        per_step = self.prompts_per_step
        if per_step and record.batch != record.position // per_step:
            problems.append(
                f"group {group_id} at dataloader position {record.position} says batch "
                f"{record.batch}, but {per_step} prompts per step put it in batch "
                f"{record.position // per_step}"
            )
        problems += self._at_version(record.weight_version, f"group {group_id} was taken")
        siblings = tuple(Sibling((rid,), SiblingStatus.RESERVED) for rid in record.attempts)
        cells.set(cells.groups, group_id, _Group(taken=record, line=line, siblings=siblings))
        batch = cells.batches.get(record.batch, ())
        cells.set(cells.batches, record.batch, (*batch, group_id))
        return problems

    def _batch_admitted(self, record: BatchAdmitted) -> list[str]:
        cells = self.cells
        problems: list[str] = []
        taken = cells.batches.get(record.batch, ())
        if sorted(record.group_ids) != sorted(taken):
            problems.append(
                f"batch {record.batch} was admitted as {record.group_ids}, but its prompts "
                f"were taken as {list(taken)}"
            )
        if record.target_step != record.batch and not self.unscheduled:
            problems.append(
                f"batch {record.batch} was admitted for step {record.target_step}; a batch "
                "trains at the step of its number"
            )
        problems += self._at_version(record.weight_version, f"batch {record.batch} was admitted")
        for group_id in dict.fromkeys(record.group_ids):
            group, found = self._in_ledger(group_id, f"batch {record.batch}'s admission")
            problems += found
            if group is None:
                continue
            if group.admitted is not None:
                problems.append(f"group {group_id} was admitted twice")
            cells.set(cells.groups, group_id, replace(group, admitted=record))
        return problems

    def _round_started(self, record: RoundStarted) -> list[str]:
        group_id = record.group_id
        group, problems = self._in_ledger(group_id, f"round {record.round}")
        if group is None:
            return problems
        if group.admitted is None:
            problems.append(f"group {group_id} started a round before its batch was admitted")
        problems += self._at_version(
            record.weight_version, f"group {group_id}'s round {record.round} started"
        )
        in_flight = [
            i for i, s in enumerate(group.siblings) if s.status is SiblingStatus.DISPATCHED
        ]
        if in_flight:
            problems.append(
                f"group {group_id} started round {record.round} with siblings {in_flight} "
                "still in flight"
            )
        needed = [i for i, s in enumerate(group.siblings) if s.status is not SiblingStatus.SEALED]
        indices = [fresh.generation_index for fresh in record.dispatched]
        if indices != needed:
            problems.append(
                f"group {group_id}'s round {record.round} dispatched siblings {indices}, but "
                f"siblings {needed} were the ones without a seal"
            )
        for fresh in record.dispatched:
            index, rollout_id = fresh.generation_index, fresh.rollout_id
            if not 0 <= index < len(group.siblings):
                continue
            sibling = group.siblings[index]
            if sibling.status is SiblingStatus.RESERVED:
                if rollout_id != sibling.current:
                    problems.append(
                        f"round {record.round} dispatched sibling ({group_id}, {index}) as "
                        f"{rollout_id}, but its reserved attempt is {sibling.current}"
                    )
                attempts = sibling.attempts
            elif sibling.status is SiblingStatus.ABANDONED:
                problems += self._fresh_attempt(group_id, index, rollout_id)
                attempts = (*sibling.attempts, rollout_id)
            else:
                continue
            group = group.with_sibling(index, Sibling(attempts, SiblingStatus.DISPATCHED))
        self.cells.set(self.cells.groups, group_id, group)
        return problems

    def _attempt_resumed(self, record: AttemptResumed) -> list[str]:
        sibling_key = (record.group_id, record.generation_index)
        group = self.group(record.group_id)
        sibling = (
            group.siblings[record.generation_index]
            if group is not None and 0 <= record.generation_index < len(group.siblings)
            else None
        )
        problems: list[str] = []
        if (
            sibling is None
            or sibling.current != record.rollout_id
            or sibling.status is not SiblingStatus.DISPATCHED
        ):
            problems.append(
                f"attempt {record.rollout_id} resumed for sibling {sibling_key} but no round "
                "dispatched it for that sibling before"
            )
        source = record.from_rollout_id
        if source is None:
            return problems
        self.handed[record.rollout_id] = len(record.calls)
        if sibling is None or source not in sibling.attempts or source == record.rollout_id:
            problems.append(
                f"attempt {record.rollout_id} of sibling {sibling_key} continues {source}, "
                "which is not an earlier attempt of that sibling (abandoned, or cut off by a "
                "restore, before it)"
            )
        foreign = [key for key in record.calls if key.partition("/")[0] != source]
        if not record.calls or foreign or len(record.weight_versions) != len(record.calls):
            problems.append(
                f"attempt {record.rollout_id} continues calls {(foreign or record.calls)[:3]} "
                f"that are not {len(record.weight_versions)} calls of {source}"
            )
        problems += self._versions(record.weight_versions, f"attempt {record.rollout_id}'s calls")
        return problems

    def _versions(self, versions: Sequence[int], what: str) -> list[str]:
        unknown = sorted({v for v in versions if not 0 <= v <= self.highest})
        if not unknown:
            return []
        return [
            f"{what} name weight versions {unknown} the run never had (it had 0 to "
            f"{self.highest} by then)"
        ]

    def _sealed(self, record: SiblingSealed | GroupSealed, line: int) -> list[str]:
        group_id = record.group_id
        group, problems = self._in_ledger(group_id, "a seal")
        if group is None:
            return problems
        seals = seals_of(record)
        if isinstance(record, GroupSealed) != group.cohort:
            kind = "a prompt-group cohort" if group.cohort else "sealed sibling by sibling"
            problems.append(
                f"group {group_id} is {kind} but was sealed by a {type(record).__name__} record"
            )
        indices = sorted(seal.generation_index for seal in seals)
        if isinstance(record, GroupSealed) and indices != list(range(len(group.siblings))):
            problems.append(
                f"cohort {group_id} sealed siblings {indices}, not all of its "
                f"{len(group.siblings)} at once"
            )
        for seal in seals:
            index, rollout_id = seal.generation_index, seal.rollout_id
            sibling = group.siblings[index] if 0 <= index < len(group.siblings) else None
            if sibling is None:
                problems.append(f"group {group_id} has no sibling {index} to seal as {rollout_id}")
                continue
            if sibling.current != rollout_id or sibling.status is not SiblingStatus.DISPATCHED:
                problems.append(
                    f"sibling ({group_id}, {index}) sealed as {rollout_id}, but its attempt "
                    f"in flight was "
                    + (
                        sibling.current
                        if sibling.status is SiblingStatus.DISPATCHED
                        else f"none ({sibling.current} is {sibling.status.value})"
                    )
                    + ": no round dispatched what was sealed"
                )
            receipt_id = seal.receipt.get("rollout_id")
            if receipt_id != rollout_id:
                problems.append(f"the seal of {rollout_id} holds the receipt of {receipt_id!r}")
            manifest = seal.receipt.get("manifest")
            if isinstance(manifest, list):
                called = [
                    call.get("weight_version") if isinstance(call, dict) else None
                    for call in manifest
                ]
                if called != seal.weight_versions:
                    problems.append(
                        f"the seal of {rollout_id} says its calls ran at weight versions "
                        f"{seal.weight_versions}, its receipt {called}"
                    )
            problems += self._versions(seal.weight_versions, f"the seal of {rollout_id}")
            handed = self.handed.get(rollout_id, 0)
            if seal.inherited_calls > handed:
                problems.append(
                    f"{rollout_id} sealed with {seal.inherited_calls} inherited calls but was "
                    f"handed {handed}"
                )
            attempts = (
                sibling.attempts
                if sibling.current == rollout_id
                else (*sibling.attempts, rollout_id)
            )
            group = group.with_sibling(
                index, Sibling(attempts, SiblingStatus.SEALED, seal=seal, seal_line=line)
            )
        self.cells.set(self.cells.groups, group_id, group)
        return problems

    def _abandoned(self, record: AttemptsAbandoned) -> list[str]:
        group_id = record.group_id
        group, problems = self._in_ledger(group_id, "an abandon")
        if group is None:
            return problems
        if record.whole_group != group.cohort:
            problems.append(
                f"group {group_id}'s abandon says whole_group={record.whole_group} for a "
                + ("cohort" if group.cohort else "group sealed sibling by sibling")
            )
        in_flight = {
            (i, s.current)
            for i, s in enumerate(group.siblings)
            if s.status is SiblingStatus.DISPATCHED
        }
        listed = {(a.generation_index, a.rollout_id) for a in record.attempts}
        if group.cohort:
            # The whole cohort goes: the attempts that succeeded with it are listed too.
            expected = {(i, s.current) for i, s in enumerate(group.siblings)}
            if listed != expected or in_flight != expected:
                problems.append(
                    f"cohort {group_id}'s abandon lists {sorted(listed)}, but its attempts "
                    f"in flight were {sorted(in_flight)}"
                )
        elif listed != in_flight:
            problems.append(
                f"group {group_id}'s abandon lists {sorted(listed)}, but its attempts in "
                f"flight were {sorted(in_flight)} (a sealed attempt is never abandoned)"
            )
        self._abandon_in_flight(group_id)
        return problems

    def _abandon_in_flight(self, group_id: str) -> None:
        """Every unsealed current attempt abandoned; a generating cohort's whole."""
        group = self.cells.groups[group_id]
        cohort_goes = group.cohort and not group.all_sealed
        siblings = tuple(
            sibling
            if sibling.status is SiblingStatus.SEALED and not cohort_goes
            else Sibling(sibling.attempts, SiblingStatus.ABANDONED)
            for sibling in group.siblings
        )
        self.cells.set(self.cells.groups, group_id, replace(group, siblings=siblings))

    def restart(self, *, offset: int) -> dict[str, set[tuple[int, str]]]:
        """A restore's ``prepare_for_restart`` (its record at ``offset``): abandon every
        attempt of every group still generating. Returns the attempts that were in flight,
        by group (the restart abandons the journal must record next)."""
        self.cells.offset = offset
        in_flight: dict[str, set[tuple[int, str]]] = {}
        for group in list(self.in_ledger()):
            if group.all_sealed:
                continue
            dispatched = {
                (i, s.current)
                for i, s in enumerate(group.siblings)
                if s.status is SiblingStatus.DISPATCHED
            }
            if dispatched:
                in_flight[group.taken.group_id] = dispatched
            self._abandon_in_flight(group.taken.group_id)
        return in_flight

    def _dropped(self, record: PromptDropped) -> list[str]:
        group_id = record.group_id
        group, problems = self._in_ledger(group_id, "a drop")
        if group is None:
            return problems
        if record.prompt_idx != group.taken.prompt_idx:
            problems.append(
                f"group {group_id} was dropped as prompt {record.prompt_idx}, but it took "
                f"prompt {group.taken.prompt_idx}"
            )
        target = None if group.admitted is None else group.admitted.target_step
        if record.target_step != target:
            problems.append(
                f"group {group_id} was dropped from step {record.target_step}, but it was "
                f"admitted for step {target}"
            )
        self.cells.set(self.cells.groups, group_id, replace(group, where=Where.DROPPED))
        return problems

    def _published(self, record: GroupPublished) -> list[str]:
        group_id = record.group_id
        group, problems = self._in_ledger(group_id, "a publish")
        if group is None:
            return problems
        unsealed = [i for i, s in enumerate(group.siblings) if s.status is not SiblingStatus.SEALED]
        if unsealed:
            problems.append(f"group {group_id} was published with siblings {unsealed} unsealed")
        target = None if group.admitted is None else group.admitted.target_step
        if record.target_step != target:
            problems.append(
                f"group {group_id} was published for step {record.target_step}, but it was "
                f"admitted for step {target}"
            )
        keys = [f"{group_id}_g{i}" for i in range(len(group.siblings))]
        if record.row_keys != keys:
            problems.append(f"group {group_id} was published as rows {record.row_keys}, not {keys}")
        if not 0 <= record.valid_rows <= len(group.siblings):
            problems.append(
                f"group {group_id} was published with {record.valid_rows} valid rows of "
                f"{len(group.siblings)}"
            )
        if record.min_weight_version > record.max_weight_version:
            problems.append(
                f"group {group_id} was published with weight versions "
                f"{record.min_weight_version} > {record.max_weight_version}"
            )
        cells = self.cells
        cells.set(cells.groups, group_id, replace(group, where=Where.PUBLISHED, published=record))
        ready = cells.ready.get(record.target_step, ())
        cells.set(cells.ready, record.target_step, (*ready, group_id))
        return problems

    def _trained(self, record: StepTrained) -> list[str]:
        cells = self.cells
        problems: list[str] = []
        step = record.step
        if step != self.step:
            problems.append(f"step {step} was trained while step {self.step} was due")
        if record.weight_version != self.highest + 1:
            problems.append(
                f"step {step} produced weight version {record.weight_version}; the next "
                f"version was {self.highest + 1} (one above every version produced before)"
            )
        ready = cells.ready.get(step, ())
        if sorted(record.group_ids) != sorted(ready) and not self.unscheduled:
            problems.append(
                f"step {step} trained groups {record.group_ids}, but the groups published "
                f"for it were {list(ready)}"
            )
        rows: dict[str, list[TrainedRow]] = {}
        for row in record.rows:
            rows.setdefault(row.group_id, []).append(row)
        trainable: list[float] = []
        for group_id, group_rows in rows.items():
            problems += self._trained_group(group_id, group_rows, trainable)
        if record.valid_rows != len(trainable):
            problems.append(
                f"step {step} says it trained {record.valid_rows} valid rows; its rows hold "
                f"{len(trainable)} valid rows whose seal did not mask them"
            )
        mean = math.fsum(trainable) / len(trainable) if trainable else None
        if (mean is None) != (record.mean_reward is None) or (
            mean is not None
            and record.mean_reward is not None
            and not close(mean, record.mean_reward)
        ):
            problems.append(
                f"step {step} says its mean reward was {record.mean_reward}; its trained rows' "
                f"rewards average {mean}"
            )
        for group_id in dict.fromkeys(record.group_ids):
            group = cells.groups.get(group_id)
            if group is not None and group.where is Where.PUBLISHED:
                cells.set(cells.groups, group_id, replace(group, where=Where.TRAINED))
        if self.unscheduled:
            trained = set(record.group_ids)
            for target, groups in list(cells.ready.items()):
                if trained & set(groups):
                    cells.set(cells.ready, target, tuple(g for g in groups if g not in trained))
        else:
            cells.set(cells.ready, step, ())
        cells.set(cells.scalars, "step", step + 1)
        cells.set(cells.scalars, "version", record.weight_version)
        self.highest = max(self.highest, record.weight_version)
        return problems

    def _trained_group(
        self, group_id: str, rows: list[TrainedRow], trainable: list[float]
    ) -> list[str]:
        group = self.group(group_id)
        if group is None or group.published is None or group.where is not Where.PUBLISHED:
            state = "never taken" if group is None else f"{group.where.value}, not published"
            return [f"rows of group {group_id} were trained, but the group was {state}"]
        return check_trained_rows(
            rows,
            taken=group.taken,
            published=group.published,
            seals=[sibling.seal for sibling in group.siblings],
            start_version=0 if group.admitted is None else group.admitted.weight_version,
            history_version=self.version,
            trainable=trainable,
        )


def restart_abandon(record: AttemptsAbandoned) -> bool:
    """Whether ``record`` is a restore's: every attempt abandoned for the restart."""
    return bool(record.attempts) and all(
        attempt.reason is FailureReason.RESTART for attempt in record.attempts
    )
