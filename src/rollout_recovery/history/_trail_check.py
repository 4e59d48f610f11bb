"""Checks a run's history against the invariants the run promises (DESIGN §5, 1-4, 9).

Read from ``events.jsonl`` only (the journal: every acknowledged record, never cut). A
restore's ``restored`` record undoes what it rolled back: the training steps after its
snapshot (their rows are trained again) and the seals its reuse policy discarded. What
survives must satisfy:

- the dataloader's positions are contiguous from 0, each taken once;
- steps are trained in order, each once, each with the groups it still expected (its
  prompts minus its drops); every trained group has exactly N rows, one per generation
  index, in one step; no sibling and no prompt is trained twice;
- every prompt taken is trained, dropped with a reason, or still in flight (a run not
  yet complete);
- every journaled seal is trained with its rollout id, or excused: abandoned after it,
  its prompt dropped, or discarded by a restore's reuse policy (listed in its record);
  a run not yet complete may still hold it;
- a resumed attempt (``attempt_resumed``) was dispatched for its sibling, and continues
  calls of an earlier attempt of the same sibling that was lost before it: abandoned, or
  dispatched before a restore (which abandons whatever it finds unsealed, a seal its
  reuse policy discarded included); a seal that inherited calls was handed at least that
  many.

Each violation names the ids and the ``events.jsonl:line`` involved.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TrailLineError
from ..rundir import RunDirectory
from ._journal import JournalCorruptError, JournalEntry
from ._trail_reader import read_entries
from .records import (
    AttemptResumed,
    AttemptsAbandoned,
    GroupSealed,
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

__all__ = ["TrailReport", "check_trail"]


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


@dataclass(slots=True)
class _Facts:
    """What the history says, gathered in one pass."""

    taken: dict[str, tuple[int, PromptTaken]] = field(default_factory=dict)
    positions: dict[int, int] = field(default_factory=dict)  # position -> line
    taken_twice: list[tuple[int, str]] = field(default_factory=list)
    dropped: dict[str, tuple[int, PromptDropped]] = field(default_factory=dict)
    seals: list[tuple[int, str, Seal]] = field(default_factory=list)
    excused: dict[str, int] = field(default_factory=dict)  # rollout id -> line
    steps: list[JournalEntry] = field(default_factory=list)
    started: RunStarted | None = None
    # rollout id -> (line, group id, generation index) of the record that dispatched it
    dispatched: dict[str, tuple[int, str, int]] = field(default_factory=dict)
    abandoned_at: dict[str, int] = field(default_factory=dict)  # rollout id -> first line
    resumed: list[tuple[int, AttemptResumed]] = field(default_factory=list)
    restores: list[int] = field(default_factory=list)  # lines of ``restored`` records


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
        facts = _gather(read_entries(events))
    except (JournalCorruptError, TrailLineError) as error:
        return TrailReport(violations=[str(error)])
    report = TrailReport()
    if facts.started is not None:
        report.group_size = facts.started.group_size
        report.steps_target = facts.started.steps
    size = group_size if group_size is not None else report.group_size
    if size is None:
        report.violations.append(f"{events.name} has no run_started record: not a run's history")
        return report
    _check(facts, events.name, size, complete, report)
    return report


def _gather(entries: list[JournalEntry]) -> _Facts:
    facts = _Facts()
    # A restore rolls back the steps between its snapshot and itself.
    windows = [
        (entry.record.snapshot_position, entry.offset)
        for entry in entries
        if isinstance(entry.record, Restored)
    ]
    for entry in entries:
        number, record = entry.line, entry.record
        if isinstance(record, PromptTaken):
            for index, rollout_id in enumerate(record.attempts):
                facts.dispatched.setdefault(rollout_id, (number, record.group_id, index))
            if record.group_id in facts.taken:
                facts.taken_twice.append((number, f"group {record.group_id}"))
            facts.taken.setdefault(record.group_id, (number, record))
            if record.position in facts.positions:
                facts.taken_twice.append((number, f"position {record.position}"))
            facts.positions.setdefault(record.position, number)
        elif isinstance(record, PromptDropped):
            facts.dropped[record.group_id] = (number, record)
        elif isinstance(record, SiblingSealed):
            facts.seals.append((number, record.group_id, record.seal))
        elif isinstance(record, GroupSealed):
            facts.seals.extend((number, record.group_id, seal) for seal in record.seals)
        elif isinstance(record, RoundStarted):
            for fresh in record.dispatched:
                facts.dispatched.setdefault(
                    fresh.rollout_id, (number, record.group_id, fresh.generation_index)
                )
        elif isinstance(record, AttemptResumed):
            facts.resumed.append((number, record))
        elif isinstance(record, AttemptsAbandoned):
            for attempt in record.attempts:
                facts.excused[attempt.rollout_id] = number
                facts.abandoned_at.setdefault(attempt.rollout_id, number)
        elif isinstance(record, Restored):
            facts.restores.append(number)
            for discarded in record.discarded:
                facts.excused[discarded.rollout_id] = number
        elif isinstance(record, StepTrained):
            if not any(start <= entry.offset < end for start, end in windows):
                facts.steps.append(entry)
        elif isinstance(record, RunStarted):
            facts.started = record
    return facts


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
            group_prompt[row.group_id] = row.prompt_idx
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
    _check_resumes(facts, name, bad)
    report.counts = {
        "steps_trained": len(facts.steps),
        "groups_trained": len(group_rows),
        "rows_trained": len(trained_sibling),
        "valid_rows_trained": sum(
            entry.record.valid_rows
            for entry in facts.steps
            if isinstance(entry.record, StepTrained)
        ),
        "prompts_taken": len(facts.taken),
        "prompts_dropped": len(facts.dropped),
        "seals": len(facts.seals),
        "seals_trained": reused,
        "seals_abandoned": excused,
        "attempts_resumed": sum(1 for _, r in facts.resumed if r.from_rollout_id is not None),
        "calls_resumed": sum(seal.inherited_calls for _, _, seal in facts.seals),
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
        if facts.excused.get(rollout_id, 0) > number or group_id in facts.dropped:
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
            + " with no abandon, drop or discard saying why (a lost seal)"
        )
    return reused, excused


def _check_resumes(facts: _Facts, name: str, bad: list[str]) -> None:
    """Resumed attempts continue lost attempts of their own sibling, and seals use at most
    the calls they were handed."""
    handed: dict[str, int] = {}
    for number, record in facts.resumed:
        where = f"{name}:{number}"
        sibling = (record.group_id, record.generation_index)
        fresh = facts.dispatched.get(record.rollout_id)
        if fresh is None or fresh[0] > number or fresh[1:] != sibling:
            bad.append(
                f"attempt {record.rollout_id} resumed for sibling {sibling} but no round "
                f"dispatched it for that sibling before ({where})"
            )
        source = record.from_rollout_id
        if source is None:
            continue
        handed[record.rollout_id] = len(record.calls)
        earlier = facts.dispatched.get(source)
        if source == record.rollout_id or earlier is None or earlier[1:] != sibling:
            bad.append(
                f"attempt {record.rollout_id} of sibling {sibling} continues {source}, which "
                f"is not an earlier attempt of that sibling ({where})"
            )
        elif facts.abandoned_at.get(source, number) >= number and not any(
            earlier[0] < restore < number for restore in facts.restores
        ):
            bad.append(
                f"attempt {record.rollout_id} continues {source}, which was neither abandoned "
                f"nor cut off by a restore before it ({where})"
            )
        foreign = [key for key in record.calls if key.partition("/")[0] != source]
        if not record.calls or foreign or len(record.weight_versions) != len(record.calls):
            bad.append(
                f"attempt {record.rollout_id} continues calls {(foreign or record.calls)[:3]} "
                f"that are not {len(record.weight_versions)} calls of {source} ({where})"
            )
    for number, _, seal in facts.seals:
        if seal.inherited_calls > handed.get(seal.rollout_id, 0):
            bad.append(
                f"{seal.rollout_id} sealed with {seal.inherited_calls} inherited calls but was "
                f"handed {handed.get(seal.rollout_id, 0)} ({name}:{number})"
            )
