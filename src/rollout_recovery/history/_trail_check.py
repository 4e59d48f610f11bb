"""Checks a run's history against what the run promises (DESIGN §5, 1-4, 9): a proof, in
that every fact a record states is checked against the records that established it.

Read from ``events.jsonl`` only (the journal: every acknowledged record, never cut). Two
passes. The first collects every restore's window (its snapshot to itself) and the groups
it rewound. The second walks the records in order through :class:`~._lineage.Lineage`,
the auditor's own model of the run, checking each record against the state before it
(which attempt each sibling has in flight, which seal it holds, which groups each step
must train); a ``restored`` record rebuilds the state at its snapshot and replays what
came after as the restore did, and its own counts are checked against that replay.
``docs/journal.md`` ("What the auditor checks") lists every fact and the check that
covers it. What survives the restores must then satisfy:

- the dataloader's positions are contiguous from 0, each taken once;
- steps are trained in order, each once, each with the groups it still expected (its
  prompts minus its drops); every trained group has exactly N rows, one per generation
  index, in one step; no sibling and no prompt is trained twice;
- every prompt taken is trained, dropped with a reason, or still in flight (a run not
  yet complete);
- every journaled seal is trained with its rollout id, or excused: its prompt dropped, or
  discarded by a restore's reuse policy (listed in its record); a run not yet complete
  may still hold it. Nothing else excuses a seal: an abandon never closes a sealed
  attempt.

Each violation names the ids and the ``events.jsonl:line`` involved.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import assert_never

from ..errors import TrailLineError
from ..rundir import RunDirectory
from ._journal import JournalCorruptError, JournalEntry
from ._lineage import Lineage, restart_abandon, seals_of
from ._trail_reader import read_entries
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
    ReusePolicy,
    RoundStarted,
    RunStarted,
    Seal,
    SiblingSealed,
    StepTrained,
    TrainedRow,
)

__all__ = ["TrailReport", "check_trail", "group_of"]


@dataclass(slots=True)
class TrailReport:
    violations: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    #: The newest ``run_started`` record's facts (None if the trail has none).
    group_size: int | None = None
    steps_target: int | None = None
    #: Steps that survive (trained and not rolled back), in order.
    surviving_steps: list[int] = field(default_factory=list)
    #: Byte offsets of the surviving ``step_trained`` records.
    surviving_step_offsets: list[int] = field(default_factory=list)
    #: ``(step, row)`` of every trained row that survives, in training order.
    rows: list[tuple[int, TrainedRow]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def complete(self) -> bool:
        return self.steps_target is not None and len(self.surviving_steps) >= self.steps_target


def group_of(record: HistoryRecord) -> str | None:
    """The prompt group a record is about (None for run-wide records)."""
    match record:
        case (
            PromptTaken()
            | PromptAliased()
            | RoundStarted()
            | AttemptResumed()
            | SiblingSealed()
            | GroupSealed()
            | AttemptsAbandoned()
            | PromptDropped()
            | GroupPublished()
        ):
            return record.group_id
        case (
            RunStarted()
            | BatchAdmitted()
            | StepTrained()
            | CheckpointCommitted()
            | Restored()
            | BackendEvent()
        ):
            return None
        case _:
            assert_never(record)


@dataclass(frozen=True, slots=True)
class _Window:
    """What one restore undid: the records in [start, end) after its snapshot."""

    start: int
    end: int
    line: int
    #: The groups it rewound: those of the seals it discarded.
    rewound: frozenset[str]

    def holds(self, offset: int) -> bool:
        return self.start <= offset < self.end


@dataclass(slots=True)
class _Facts:
    """What the history says, gathered in the walk, for the run-wide checks."""

    taken: dict[str, tuple[int, PromptTaken]] = field(default_factory=dict)
    positions: dict[int, int] = field(default_factory=dict)  # position -> line
    taken_twice: list[tuple[int, str]] = field(default_factory=list)
    dropped: dict[str, tuple[int, PromptDropped]] = field(default_factory=dict)
    seals: list[tuple[int, str, Seal]] = field(default_factory=list)
    discarded: dict[str, int] = field(default_factory=dict)  # rollout id -> restore line
    steps: list[JournalEntry] = field(default_factory=list)  # the surviving ones
    started: RunStarted | None = None
    restores: list[Restored] = field(default_factory=list)
    #: Attempts handed the calls of a lost attempt (``attempt_resumed`` with a source).
    resumed: int = 0
    #: Valid rows of each surviving step the trainer refused (``logprob_mismatch``).
    refused_rows: list[int] = field(default_factory=list)


def check_trail(
    events: Path, *, group_size: int | None = None, complete: bool | None = None
) -> TrailReport:
    """Check the history in ``events`` (the journal file, or a run directory holding it).

    ``group_size`` defaults to the one the newest ``run_started`` record names;
    ``complete`` (the run trained every step) defaults to what the history says. A damaged
    line is itself the one violation reported (nothing after it can be trusted).
    """
    if events.is_dir():
        events = RunDirectory(events).events
    try:
        entries = read_entries(events)
    except (JournalCorruptError, TrailLineError) as error:
        return TrailReport(violations=[str(error)])
    report = TrailReport()
    started = [e.record for e in entries if isinstance(e.record, RunStarted)]
    if started:
        report.group_size = started[-1].group_size
        report.steps_target = started[-1].steps
    size = group_size if group_size is not None else report.group_size
    if size is None:
        report.violations.append(f"{events.name} has no run_started record: not a run's history")
        return report
    walk = _Walk(events.name, entries, size)
    walk.run()
    report.violations.extend(walk.bad)
    _check(walk.facts, events.name, size, complete, report)
    return report


class _Walk:
    """The second pass: every record checked against the lineage, restores replayed."""

    def __init__(self, name: str, entries: list[JournalEntry], group_size: int) -> None:
        self.name = name
        self.entries = entries
        self.facts = _Facts()
        self.bad: list[str] = []
        first = next((e.record for e in entries if isinstance(e.record, RunStarted)), None)
        self.lineage = Lineage(
            group_size=group_size,
            prompts_per_step=None if first is None else first.prompts_per_step,
        )
        # A restore rolls back the records between its snapshot and itself.
        self.windows = [
            _Window(
                entry.record.snapshot_position,
                entry.offset,
                entry.line,
                frozenset(d.group_id for d in entry.record.discarded),
            )
            for entry in entries
            if isinstance(entry.record, Restored)
        ]
        self.index_at = {entry.offset: index for index, entry in enumerate(entries)}
        #: The step the run was at before each record (what a snapshot there holds).
        self.step_at: dict[int, int] = {}
        #: After a restore: the attempts it found in flight, which its restart abandons
        #: (the records right after it) must name; and that restore's line.
        self.restarting: dict[str, set[tuple[int, str]]] | None = None
        self.restart_line = 0
        #: The checkpoint of the last restore since the last ``run_started``.
        self.resumed_from: str | None = None
        #: The records the last restore replayed.
        self.replayed = 0

    def at(self, entry: JournalEntry) -> str:
        return f"{self.name}:{entry.line}"

    def run(self) -> None:
        for index, entry in enumerate(self.entries):
            self.step_at[entry.offset] = self.lineage.step
            # Typed here, not only through JournalEntry: each match below stays exhaustive
            # to a checker that reads this module alone.
            record: HistoryRecord = entry.record
            if self.restarting is not None and not (
                isinstance(record, AttemptsAbandoned) and restart_abandon(record)
            ):
                self._restart_done()
            self._gather(entry)
            match record:
                case Restored():
                    self._restore(index, entry, record)
                case AttemptsAbandoned() if restart_abandon(record):
                    self._restart_abandon(entry, record)
                case RunStarted():
                    self._run_started(entry, record)
                case CheckpointCommitted():
                    self._checkpoint(entry, record)
                case (
                    PromptTaken()
                    | PromptAliased()
                    | BatchAdmitted()
                    | RoundStarted()
                    | AttemptResumed()
                    | SiblingSealed()
                    | GroupSealed()
                    | AttemptsAbandoned()
                    | PromptDropped()
                    | GroupPublished()
                    | StepTrained()
                    | BackendEvent()
                ):
                    for problem in self.lineage.apply(record, offset=entry.offset, line=entry.line):
                        self.bad.append(f"{problem} ({self.at(entry)})")
                case _:
                    assert_never(record)
        # A journal that ends inside a restore's cut (a live run's being written, read as a
        # torn tail) may still get its restart abandons: only a record after them proves
        # them missing.

    def _gather(self, entry: JournalEntry) -> None:
        facts, number = self.facts, entry.line
        record: HistoryRecord = entry.record
        match record:
            case PromptTaken():
                if record.group_id in facts.taken:
                    facts.taken_twice.append((number, f"group {record.group_id}"))
                facts.taken.setdefault(record.group_id, (number, record))
                if record.position in facts.positions:
                    facts.taken_twice.append((number, f"position {record.position}"))
                facts.positions.setdefault(record.position, number)
            case PromptDropped():
                facts.dropped[record.group_id] = (number, record)
            case SiblingSealed() | GroupSealed():
                facts.seals.extend((number, record.group_id, seal) for seal in seals_of(record))
            case Restored():
                facts.restores.append(record)
                for discarded in record.discarded:
                    facts.discarded[discarded.rollout_id] = number
            case StepTrained():
                if not any(window.holds(entry.offset) for window in self.windows):
                    facts.steps.append(entry)
            case RunStarted():
                facts.started = facts.started or record
            case AttemptResumed():
                facts.resumed += record.from_rollout_id is not None
            case BackendEvent(kind="logprob_mismatch"):  # control's record of a refused step
                if not any(window.holds(entry.offset) for window in self.windows):
                    facts.refused_rows.append(int(record.detail.get("rows", 0)))
            case (
                PromptAliased()
                | BatchAdmitted()
                | RoundStarted()
                | AttemptsAbandoned()
                | GroupPublished()
                | CheckpointCommitted()
                | BackendEvent()
            ):
                pass
            case _:
                assert_never(record)

    # -- run-wide records -------------------------------------------------------------------

    def _run_started(self, entry: JournalEntry, record: RunStarted) -> None:
        where = self.at(entry)
        first = self.facts.started
        self.lineage.version = record.version
        if first is not None and (record.group_size, record.prompts_per_step) != (
            first.group_size,
            first.prompts_per_step,
        ):
            self.bad.append(
                f"a run started with {record.prompts_per_step} prompts of {record.group_size} "
                f"per step in a run of {first.prompts_per_step} of {first.group_size} ({where})"
            )
        if record.resumed_from != self.resumed_from:
            self.bad.append(
                f"a run started resumed from {record.resumed_from!r}, but the restore before "
                f"it restored {self.resumed_from!r} ({where})"
            )
        if record.step != self.lineage.step:
            self.bad.append(
                f"a run started at step {record.step}, but the history before it had trained "
                f"to step {self.lineage.step} ({where})"
            )
        self.resumed_from = None

    def _position(self, entry: JournalEntry, position: int, what: str) -> int | None:
        """The step a snapshot at ``position`` holds; None (reported) if no record
        boundary before ``entry`` is there."""
        if position in self.step_at and position <= entry.offset:
            return self.step_at[position]
        self.bad.append(
            f"{what} names journal position {position}, which is not the start of a record "
            f"before it ({self.at(entry)})"
        )
        return None

    def _checkpoint(self, entry: JournalEntry, record: CheckpointCommitted) -> None:
        step = self._position(entry, record.position, f"checkpoint {record.name}")
        if step is not None and step != record.step:
            self.bad.append(
                f"checkpoint {record.name} says step {record.step}, but its position "
                f"{record.position} follows {step} trained steps ({self.at(entry)})"
            )

    # -- restores ---------------------------------------------------------------------------

    def _restore(self, index: int, entry: JournalEntry, record: Restored) -> None:
        where = self.at(entry)
        lineage = self.lineage
        self.resumed_from = record.checkpoint
        start = record.snapshot_position
        step = self._position(entry, start, f"the restore of {record.checkpoint}")
        # A restore replays every record after its snapshot (a group it rewound included).
        self.replayed = index - self.index_at[start] if step is not None else 0
        if step is not None:
            if step != record.step:
                self.bad.append(
                    f"the restore of {record.checkpoint} says step {record.step}, but its "
                    f"snapshot follows {step} trained steps ({where})"
                )
            lineage.cells.undo_to(start)
            self._replay(index, entry, record)
        self.restarting = lineage.restart(offset=entry.offset)
        self.restart_line = entry.line
        in_ledger = list(lineage.in_ledger())
        kept = sum(
            1 for group in in_ledger for sibling in group.siblings if sibling.seal is not None
        )
        counted = {
            "groups_in_ledger": (record.groups_in_ledger, len(in_ledger)),
            "sealed_siblings_kept": (record.sealed_siblings_kept, kept),
            "canonical_groups": (record.canonical_groups, lineage.canonical_groups()),
            "seals_lost": (record.seals_lost, len(record.discarded)),
            "replayed_records": (record.replayed_records, self.replayed),
            "tokens_lost": (record.tokens_lost, sum(d.tokens for d in record.discarded)),
        }
        for name, (stated, found) in counted.items():
            if stated != found:
                self.bad.append(
                    f"the restore of {record.checkpoint} says {name} = {stated}; its replay "
                    f"of the journal gives {found} ({where})"
                )

    def _replay(self, index: int, entry: JournalEntry, record: Restored) -> None:
        """Re-apply the records after the snapshot as the restore did, and check what its
        record says it rolled back and discarded."""
        lineage = self.lineage
        current = _Window(
            record.snapshot_position,
            entry.offset,
            entry.line,
            frozenset(d.group_id for d in record.discarded),
        )
        inner = [w for w in self.windows if current.start < w.end < current.end]
        rolled_back: list[int] = []
        discards: list[tuple[str, int, str, int, list[int]]] = []
        sealed_groups: set[str] = set()
        dropped: set[str] = set()
        lineage.replaying = True
        try:
            for replayed in self.entries[self.index_at[current.start] : index]:
                window = next((w for w in inner if w.holds(replayed.offset)), current)
                self._replay_one(replayed, window, current, rolled_back, discards)
                rec = replayed.record
                if isinstance(rec, PromptDropped):
                    dropped.add(rec.group_id)
                if window is current and isinstance(rec, SiblingSealed | GroupSealed):
                    sealed_groups.add(rec.group_id)
        finally:
            lineage.replaying = False
        where = self.at(entry)
        name = record.checkpoint
        if record.rolled_back_steps != rolled_back:
            self.bad.append(
                f"the restore of {name} says it rolled back steps {record.rolled_back_steps}; "
                f"the steps trained after its snapshot were {rolled_back} ({where})"
            )
        stated = [
            (d.group_id, d.generation_index, d.rollout_id, d.tokens, list(d.weight_versions))
            for d in record.discarded
        ]
        if sorted(stated) != sorted(discards):
            self.bad.append(
                f"the restore of {name} lists discarded seals "
                f"{sorted((g, i, r) for g, i, r, _, _ in stated)[:5]}, but the seals of the "
                f"groups it rewound after its snapshot were "
                f"{sorted((g, i, r) for g, i, r, _, _ in discards)[:5]} ({where})"
            )
        rewound = current.rewound
        if record.reuse is ReusePolicy.ALL and rewound:
            self.bad.append(
                f"the restore of {name} keeps every seal (reuse = all) but rewound groups "
                f"{sorted(rewound)[:5]} ({where})"
            )
        if record.reuse is ReusePolicy.NONE and rewound != sealed_groups - dropped:
            self.bad.append(
                f"the restore of {name} keeps no seal after its snapshot (reuse = none) but "
                f"rewound groups {sorted(rewound)[:5]}, not the groups sealed after it "
                f"{sorted(sealed_groups - dropped)[:5]} ({where})"
            )

    def _replay_one(
        self,
        entry: JournalEntry,
        window: _Window,
        current: _Window,
        rolled_back: list[int],
        discards: list[tuple[str, int, str, int, list[int]]],
    ) -> None:
        """Apply one record as a restore's replay does (or skip it, as it does)."""
        record: HistoryRecord = entry.record
        group_id = group_of(record)
        if group_id is not None and group_id in window.rewound:
            match record:
                case PromptTaken():
                    pass  # its place in the dataloader stays
                case SiblingSealed() | GroupSealed():
                    if window is current:
                        discards.extend(
                            (
                                record.group_id,
                                seal.generation_index,
                                seal.rollout_id,
                                seal.tokens,
                                list(seal.weight_versions),
                            )
                            for seal in seals_of(record)
                        )
                    return
                case _:
                    return
        match record:
            case StepTrained():
                # Training after a snapshot: its policy was lost, it runs again.
                if window is current:
                    rolled_back.append(record.step)
                return
            case Restored():
                self.lineage.restart(offset=entry.offset)
                return
            case AttemptsAbandoned() if restart_abandon(record):
                return  # its restore's restart did it
            case RunStarted() | CheckpointCommitted() | BackendEvent():
                return
            case (
                PromptTaken()
                | PromptAliased()
                | BatchAdmitted()
                | RoundStarted()
                | AttemptResumed()
                | SiblingSealed()
                | GroupSealed()
                | AttemptsAbandoned()
                | PromptDropped()
                | GroupPublished()
            ):
                for problem in self.lineage.apply(record, offset=entry.offset, line=entry.line):
                    self.bad.append(
                        f"{problem} ({self.at(entry)}, when the restore at "
                        f"{self.name}:{current.line} replays it)"
                    )
                return
            case _:
                assert_never(record)

    def _restart_abandon(self, entry: JournalEntry, record: AttemptsAbandoned) -> None:
        where = self.at(entry)
        if self.restarting is None:
            self.bad.append(
                f"group {record.group_id}'s attempts were abandoned for a restart with no "
                f"restore before them ({where})"
            )
            return
        in_flight = self.restarting.pop(record.group_id, set())
        listed = {(a.generation_index, a.rollout_id) for a in record.attempts}
        group = self.lineage.group(record.group_id)
        cohort = group is not None and group.cohort
        if listed != in_flight or record.whole_group != cohort:
            self.bad.append(
                f"the restart abandons {sorted(listed)} of group {record.group_id}, but the "
                f"restore at {self.name}:{self.restart_line} found {sorted(in_flight)} in "
                f"flight ({where})"
            )

    def _restart_done(self) -> None:
        left = self.restarting or {}
        if left:
            named = sorted((g, i, r) for g, attempts in left.items() for i, r in attempts)
            self.bad.append(
                f"the restore at {self.name}:{self.restart_line} found attempts {named[:5]} "
                f"in flight (total={len(named)}) and recorded no restart abandon for them"
            )
        self.restarting = None


def _check(
    facts: _Facts,
    name: str,
    group_size: int,
    complete: bool | None,
    report: TrailReport,
) -> None:
    bad = report.violations
    _check_taken(facts, name, bad)
    trained_sibling: dict[tuple[str, int], tuple[int, str]] = {}
    group_rows: dict[str, list[tuple[int, int]]] = defaultdict(list)  # group -> (line, step)
    group_prompt: dict[str, int] = {}
    prompts_per_step = facts.started.prompts_per_step if facts.started is not None else 0
    drops_for: dict[int, int] = defaultdict(int)
    for _, dropped in facts.dropped.values():
        drops_for[dropped.target_step] += 1
    for expected_step, entry in enumerate(facts.steps):
        trained = entry.record
        assert isinstance(trained, StepTrained)
        where = f"{name}:{entry.line}"
        if trained.step != expected_step:
            bad.append(f"step {trained.step} trained where step {expected_step} was due ({where})")
        report.surviving_steps.append(trained.step)
        report.surviving_step_offsets.append(entry.offset)
        per_group: dict[str, list[int]] = defaultdict(list)
        for row in trained.rows:
            report.rows.append((trained.step, row))
            key = (row.group_id, row.generation_index)
            if key in trained_sibling:
                bad.append(
                    f"sibling {key} trained twice ({name}:{trained_sibling[key][0]}, {where})"
                )
            trained_sibling[key] = (entry.line, row.rollout_id)
            per_group[row.group_id].append(row.generation_index)
            group_rows[row.group_id].append((entry.line, trained.step))
            group_prompt.setdefault(row.group_id, row.prompt_idx)
        for group_id, indices in per_group.items():
            if sorted(indices) != list(range(group_size)):
                bad.append(
                    f"group {group_id} trained rows for generation indices {sorted(indices)}, "
                    f"expected 0..{group_size - 1} ({where})"
                )
        expected_groups = prompts_per_step - drops_for.get(trained.step, 0)
        if prompts_per_step and len(trained.group_ids) != expected_groups:
            bad.append(
                f"step {trained.step} trained {len(trained.group_ids)} groups, expected "
                f"{expected_groups} ({prompts_per_step} per step minus "
                f"{drops_for.get(trained.step, 0)} dropped) ({where})"
            )
        if sorted(per_group) != sorted(trained.group_ids):
            bad.append(
                f"step {trained.step} names groups {trained.group_ids} but trained rows of "
                f"{sorted(per_group)} ({where})"
            )
    for group_id, rows in group_rows.items():
        steps = sorted({step for _, step in rows})
        if len(steps) != 1:
            lines = sorted({line for line, _ in rows})
            bad.append(f"group {group_id} trained in steps {steps} ({name}:{lines})")
    finished = report.complete if complete is None else complete
    _check_prompts(facts, name, group_prompt, group_rows, finished, bad)
    reused, excused = _check_seals(facts, name, trained_sibling, finished, bad)
    restores = facts.restores
    report.counts = {
        "steps_trained": len(facts.steps),
        "groups_trained": len(group_rows),
        "rows_trained": len(trained_sibling),
        "valid_rows_trained": sum(
            entry.record.valid_rows
            for entry in facts.steps
            if isinstance(entry.record, StepTrained)
        ),
        "steps_refused": len(facts.refused_rows),
        "valid_rows_refused": sum(facts.refused_rows),
        "prompts_taken": len(facts.taken),
        "prompts_dropped": len(facts.dropped),
        "seals": len(facts.seals),
        "seals_trained": reused,
        "seals_abandoned": excused,
        "attempts_resumed": facts.resumed,
        "calls_resumed": sum(seal.inherited_calls for _, _, seal in facts.seals),
        "restores": len(restores),
        "restored_seals_kept": sum(r.sealed_siblings_kept for r in restores),
        "restored_seals_discarded": sum(r.seals_lost for r in restores),
        "replayed_records": sum(r.replayed_records for r in restores),
    }


def _check_taken(facts: _Facts, name: str, bad: list[str]) -> None:
    """Each group taken once, and the dataloader's positions contiguous from 0."""
    for number, what in facts.taken_twice:
        bad.append(f"{what} taken twice ({name}:{number})")
    if facts.positions and sorted(facts.positions) != list(range(len(facts.positions))):
        last = max(facts.positions)
        missing = sorted(set(range(last + 1)) - set(facts.positions))
        bad.append(
            f"the dataloader's positions are not contiguous: missing {missing[:10]} "
            f"(total={len(missing)}) before position {last} ({name}:{facts.positions[last]})"
        )


def _check_prompts(
    facts: _Facts,
    name: str,
    group_prompt: dict[str, int],
    group_rows: dict[str, list[tuple[int, int]]],
    complete: bool,
    bad: list[str],
) -> None:
    times_taken: dict[int, int] = defaultdict(int)
    for _, record in facts.taken.values():
        times_taken[record.prompt_idx] += 1
    prompts_trained: dict[int, int] = defaultdict(int)
    for group_id, prompt_idx in group_prompt.items():
        prompts_trained[prompt_idx] += 1
        first_line = group_rows[group_id][0][0]
        if group_id not in facts.taken:
            bad.append(
                f"group {group_id} trained but never taken from the dataloader "
                f"({name}:{first_line})"
            )
        if group_id in facts.dropped:
            bad.append(
                f"group {group_id} both trained and dropped ({name}:{facts.dropped[group_id][0]})"
            )
    for prompt_idx, count in prompts_trained.items():
        if count > times_taken[prompt_idx]:
            groups = sorted(g for g, p in group_prompt.items() if p == prompt_idx)
            bad.append(
                f"prompt {prompt_idx} trained {count} times but taken {times_taken[prompt_idx]} "
                f"(groups {groups})"
            )
    if complete:
        for group_id, (number, taken) in facts.taken.items():
            if group_id not in group_rows and group_id not in facts.dropped:
                bad.append(
                    f"prompt {taken.prompt_idx} (group {group_id}, {name}:{number}) was neither "
                    "trained nor dropped"
                )


def _check_seals(
    facts: _Facts,
    name: str,
    trained_sibling: dict[tuple[str, int], tuple[int, str]],
    complete: bool,
    bad: list[str],
) -> tuple[int, int]:
    reused = excused = 0
    for number, group_id, seal in facts.seals:
        index, rollout_id = seal.generation_index, seal.rollout_id
        trained = trained_sibling.get((group_id, index))
        if trained is not None and trained[1] == rollout_id:
            reused += 1
            continue
        if facts.discarded.get(rollout_id, 0) > number or group_id in facts.dropped:
            excused += 1
            continue
        if trained is None and not complete:
            continue  # still owned: the run goes on
        bad.append(
            f"sibling ({group_id}, {index}) sealed as {rollout_id} ({name}:{number}) but "
            + (
                "never trained"
                if trained is None
                else f"trained as {trained[1]} ({name}:{trained[0]})"
            )
            + " with no drop or restore's discard saying why (a lost seal)"
        )
    return reused, excused
