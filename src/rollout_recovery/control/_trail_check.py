"""Checks a finished run's audit trail against the invariants the run promises.

Read from ``trained_rows.jsonl`` and ``events.jsonl`` only (the trail tells one history:
every resume cut it back to its checkpoint):

- every trained group was trained in exactly one step, with exactly N rows, one per
  generation index; no sibling and no prompt was trained twice;
- every prompt taken was trained or dropped with a reason;
- every sealed sibling was trained with the rollout id it was sealed with (reused, not
  regenerated), unless an ``attempt_abandoned`` event after the seal, or the prompt's
  drop, says why not.

Each violation names the ids and the file lines involved.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._audit import EVENTS, TRAINED_ROWS

__all__ = ["CommittedOwnership", "TrailLineError", "TrailReport", "check_trail"]


@dataclass(slots=True)
class TrailReport:
    violations: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


class TrailLineError(ValueError):
    """A trail line that is not one JSON object (a damaged or hand-edited trail)."""


def _lines(path: Path, limit: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """The file's JSON lines, numbered from 1; only its first ``limit`` bytes if given.

    Raises :class:`TrailLineError` naming ``file:line`` for a line that is not a JSON object.
    """
    with open(path, "rb") as handle:
        data = handle.read() if limit is None else handle.read(limit)
    for number, line in enumerate(data.splitlines(), start=1):
        if line.strip():
            try:
                record = json.loads(line)
            except ValueError as error:
                raise TrailLineError(f"{path.name}:{number} is not valid JSON ({error})") from None
            if not isinstance(record, dict):
                raise TrailLineError(f"{path.name}:{number} is not a JSON object")
            yield number, record


@dataclass(frozen=True, slots=True)
class CommittedOwnership:
    """What the newest committed checkpoint still owns, for a run that has not finished.

    ``ledger_groups`` maps each group the ledger owns to its sealed siblings
    (generation index -> rollout id); ``replay_groups`` are the canonical groups waiting to
    train. ``offsets`` are the audit files' lengths in that checkpoint: the committed
    prefix of the trail.
    """

    ledger_groups: dict[str, dict[int, str]]
    replay_groups: frozenset[str]
    offsets: dict[str, int]


def check_trail(
    run_dir: Path,
    *,
    group_size: int,
    complete: bool = True,
    committed: CommittedOwnership | None = None,
) -> TrailReport:
    """Check the trail in ``run_dir``; ``complete`` means the run finished every step.

    With ``committed``, only the trail's committed prefix is read, and work the
    checkpoint still owns (prompts in its ledger or replay index, siblings sealed in its
    ledger) counts as accounted for. A line that is not a JSON object is itself the one
    violation reported (nothing after it can be trusted).
    """
    try:
        return _check_trail(run_dir, group_size=group_size, complete=complete, committed=committed)
    except TrailLineError as error:
        return TrailReport(violations=[str(error)])


def _check_trail(
    run_dir: Path,
    *,
    group_size: int,
    complete: bool,
    committed: CommittedOwnership | None,
) -> TrailReport:
    rows_limit = events_limit = None
    if committed is not None:
        rows_limit = committed.offsets.get(TRAINED_ROWS)
        events_limit = committed.offsets.get(EVENTS)
    report = TrailReport()
    bad = report.violations
    rows_by_group: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    trained_sibling: dict[tuple[str, int], tuple[int, str]] = {}
    for number, row in _lines(run_dir / TRAINED_ROWS, rows_limit):
        key = (row["group_id"], row["generation_index"])
        where = f"{TRAINED_ROWS}:{number}"
        if key in trained_sibling:
            bad.append(
                f"sibling {key} trained twice ({TRAINED_ROWS}:{trained_sibling[key][0]}, {where})"
            )
        trained_sibling[key] = (number, row["rollout_id"])
        rows_by_group[row["group_id"]].append((number, row))
    group_prompt: dict[str, int] = {}
    group_lines: dict[str, list[int]] = {}
    for group_id, rows in rows_by_group.items():
        steps = {row["step"] for _, row in rows}
        lines = [n for n, _ in rows]
        if len(steps) != 1:
            bad.append(
                f"group {group_id} trained in steps {sorted(steps)} ({TRAINED_ROWS}:{lines})"
            )
        indices = sorted(row["generation_index"] for _, row in rows)
        if indices != list(range(group_size)):
            bad.append(
                f"group {group_id} trained rows for generation indices {indices}, expected "
                f"0..{group_size - 1} ({TRAINED_ROWS}:{lines[:8]})"
            )
        group_prompt[group_id] = rows[0][1]["prompt_idx"]
        group_lines[group_id] = lines

    taken: dict[str, tuple[int, int]] = {}
    times_taken: dict[int, int] = defaultdict(int)
    dropped: dict[str, int] = {}
    sealed: list[tuple[int, str, int, str]] = []
    abandoned: dict[str, int] = {}  # rollout id -> line
    for number, event in _lines(run_dir / EVENTS, events_limit):
        kind = event.get("event")
        if kind == "prompt_taken":
            if event["group_id"] in taken:
                bad.append(f"group {event['group_id']} taken twice ({EVENTS}:{number})")
            taken[event["group_id"]] = (number, event["prompt_idx"])
            times_taken[event["prompt_idx"]] += 1
        elif kind == "prompt_dropped":
            if not event.get("reason"):
                bad.append(
                    f"prompt of group {event['group_id']} dropped without a reason "
                    f"({EVENTS}:{number})"
                )
            dropped[event["group_id"]] = number
        elif kind == "sibling_sealed":
            sealed.append(
                (number, event["group_id"], event["generation_index"], event["rollout_id"])
            )
        elif kind == "attempt_abandoned":
            for rollout_id in [event.get("rollout_id"), *(event.get("rollout_ids") or [])]:
                if rollout_id:
                    abandoned[rollout_id] = number

    prompts_trained: dict[int, int] = defaultdict(int)
    for group_id, prompt_idx in group_prompt.items():
        prompts_trained[prompt_idx] += 1
        if group_id not in taken:
            bad.append(
                f"group {group_id} trained but never taken from the dataloader "
                f"({TRAINED_ROWS}:{group_lines[group_id][:8]})"
            )
        if group_id in dropped:
            bad.append(f"group {group_id} both trained and dropped ({EVENTS}:{dropped[group_id]})")
    for prompt_idx, count in prompts_trained.items():
        if count > times_taken[prompt_idx]:
            groups = sorted(g for g, p in group_prompt.items() if p == prompt_idx)
            bad.append(
                f"prompt {prompt_idx} trained {count} times but taken {times_taken[prompt_idx]} "
                f"(groups {groups}, {TRAINED_ROWS}:{[group_lines[g][0] for g in groups]})"
            )
    owned: set[str] = set()
    if committed is not None:
        owned = set(committed.ledger_groups) | set(committed.replay_groups)
    if complete or committed is not None:
        for group_id, (number, prompt_idx) in taken.items():
            if group_id not in rows_by_group and group_id not in dropped and group_id not in owned:
                bad.append(
                    f"prompt {prompt_idx} (group {group_id}, {EVENTS}:{number}) was neither "
                    "trained nor dropped"
                    + ("" if committed is None else ", and the newest checkpoint does not own it")
                )
    reused = regenerated = 0
    for number, group_id, index, rollout_id in sealed:
        trained = trained_sibling.get((group_id, index))
        if trained is not None and trained[1] == rollout_id:
            reused += 1
            continue
        if abandoned.get(rollout_id, 0) > number or group_id in dropped:
            regenerated += 1
            continue
        if trained is None and committed is not None:
            held = committed.ledger_groups.get(group_id, {})
            if held.get(index) == rollout_id or group_id in committed.replay_groups:
                continue
        if trained is None and not complete and committed is None:
            continue
        bad.append(
            f"sibling ({group_id}, {index}) sealed as {rollout_id} ({EVENTS}:{number}) but "
            + (
                "never trained"
                if trained is None
                else f"trained as {trained[1]} ({TRAINED_ROWS}:{trained[0]})"
            )
            + " with no abandon or drop event saying why"
        )
    report.counts = {
        "groups_trained": len(rows_by_group),
        "rows_trained": len(trained_sibling),
        "prompts_taken": len(taken),
        "prompts_dropped": len(dropped),
        "seals": len(sealed),
        "seals_trained": reused,
        "seals_abandoned": regenerated,
    }
    return report
