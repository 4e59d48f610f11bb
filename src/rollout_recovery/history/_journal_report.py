"""What a run's journal holds, for ``rollout-recovery journal DIR``: read-only.

:func:`inspect_journal` verifies every record of ``events.jsonl`` and reports its records
by type (count, bytes, first and last position), the snapshot marks (each committed
checkpoint's journal position, from its ``COMMITTED`` manifest, and what a restore from
it would replay), the torn tail if there is one, every restore and what it kept and
discarded, and, on request, the records themselves (from a position, of some types, up to
a count).

Read-only and safe on a live run, as the auditor is: the manifests are read under the
checkpoint store's shared lock (no checkpoint is pruned and ``LATEST`` does not move while
they are read); nothing is written, not even a lock file. A live run may be appending,
so its last line may be a write in progress: the report says the run is live.

The JSON document (:meth:`JournalReport.to_json`) is versioned (``format``,
``version``); its fields are documented in ``docs/journal-json.md``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ..errors import InvalidArgumentError, NotARunDirectoryError, RolloutRecoveryError
from ..rundir import CheckpointStore, RunDirectory
from ._journal import JournalCorruptError, JournalEntry, scan_journal
from ._trail_reader import version_problems
from .records import HISTORY_VERSION, RECORD_TYPES, HistoryRecord, Restored

__all__ = [
    "JOURNAL_REPORT_FORMAT",
    "JOURNAL_REPORT_VERSION",
    "JournalReport",
    "inspect_journal",
]

JOURNAL_REPORT_FORMAT = "rollout-recovery-journal"
#: The version of the ``--json`` document; a changed field means a new version.
JOURNAL_REPORT_VERSION = 1


def _tag(record: HistoryRecord) -> str:
    return str(type(record).__struct_config__.tag)


@dataclass(slots=True)
class _TypeStats:
    count: int = 0
    bytes: int = 0
    first: JournalEntry | None = None
    last: JournalEntry | None = None


def _place(entry: JournalEntry | None) -> dict[str, int] | None:
    return None if entry is None else {"offset": entry.offset, "line": entry.line}


@dataclass(frozen=True, slots=True)
class SnapshotMark:
    """A committed checkpoint's position in the journal (its manifest's mark)."""

    checkpoint: str
    step: int
    #: The journal position the checkpoint snapshots (None if it records none).
    position: int | None
    #: The line that starts there (None when the position is not a record boundary).
    line: int | None
    #: What a restore from it would replay: the whole records after the position.
    records_after: int
    bytes_after: int
    #: Why the mark is unusable ("" when it is fine).
    problem: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "step": self.step,
            "position": self.position,
            "line": self.line,
            "records_after": self.records_after,
            "bytes_after": self.bytes_after,
            "problem": self.problem or None,
        }


@dataclass(slots=True)
class JournalReport:
    """One inspection of a run's journal (see the module docstring)."""

    run_dir: Path
    journal: Path
    #: The file's size, and the offset just past its last whole record.
    size: int
    end: int
    #: Whether a live job held the run directory's lock during the inspection.
    live: bool
    entries: list[JournalEntry]
    #: Bytes of a torn tail after ``end``, and why it is one.
    torn_bytes: int = 0
    torn_reason: str = ""
    #: Damage with whole records after it (an altered journal): where, and why.
    corrupt: JournalCorruptError | None = None
    snapshots: list[SnapshotMark] = field(default_factory=list)
    #: Problems other than the journal's own damage (a checkpoint's manifest, a history
    #: of another version); each names its file and offset.
    problems: list[str] = field(default_factory=list)
    #: The records listed on request (``--from`` / ``--type`` / ``--limit``), or None.
    listed: list[JournalEntry] | None = None
    #: The request those records answer.
    listing: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No damage before the tail and no problem (a torn tail is a crash's leftover,
        which the next restore cuts; it is reported, not a failure)."""
        return self.corrupt is None and not self.problems

    def by_type(self) -> dict[str, _TypeStats]:
        stats: dict[str, _TypeStats] = {}
        for entry in self.entries:
            item = stats.setdefault(_tag(entry.record), _TypeStats())
            item.count += 1
            item.bytes += _length(entry, self.entries, self.end)
            item.first = item.first or entry
            item.last = entry
        return stats

    def restores(self) -> list[tuple[JournalEntry, Restored]]:
        return [(e, e.record) for e in self.entries if isinstance(e.record, Restored)]

    def to_json(self) -> dict[str, Any]:
        corrupt = self.corrupt
        stats = self.by_type()
        first = self.entries[0] if self.entries else None
        last = self.entries[-1] if self.entries else None
        return {
            "format": JOURNAL_REPORT_FORMAT,
            "version": JOURNAL_REPORT_VERSION,
            "run_dir": str(self.run_dir),
            "journal": str(self.journal),
            "verdict": "ok" if self.ok else "damaged",
            "live": self.live,
            "history_version": HISTORY_VERSION,
            "size": self.size,
            "end": self.end,
            "records": len(self.entries),
            "first": _place(first),
            "last": _place(last),
            "by_type": {
                name: {
                    "count": item.count,
                    "bytes": item.bytes,
                    "first": _place(item.first),
                    "last": _place(item.last),
                }
                for name, item in sorted(stats.items())
            },
            "torn_tail": (
                {"offset": self.end, "bytes": self.torn_bytes, "reason": self.torn_reason}
                if self.torn_bytes
                else None
            ),
            "corrupt": (
                None
                if corrupt is None
                else {"offset": corrupt.offset, "line": corrupt.line, "message": str(corrupt)}
            ),
            "snapshots": [mark.to_json() for mark in self.snapshots],
            "restores": [
                {"offset": entry.offset, "line": entry.line, **msgspec.to_builtins(record)}
                for entry, record in self.restores()
            ],
            "problems": list(self.problems),
            "listing": (
                None
                if self.listed is None
                else {
                    **self.listing,
                    "records": [
                        {
                            "offset": entry.offset,
                            "line": entry.line,
                            "bytes": _length(entry, self.entries, self.end),
                            "record": msgspec.to_builtins(entry.record),
                        }
                        for entry in self.listed
                    ],
                }
            ),
        }

    @staticmethod
    def inspect(
        run_dir: Path,
        *,
        start: int | str | None = None,
        types: Collection[str] = (),
        limit: int | None = None,
    ) -> JournalReport:
        """Inspect ``run_dir``'s journal (see :func:`inspect_journal`)."""
        return inspect_journal(run_dir, start=start, types=types, limit=limit)


def _length(entry: JournalEntry, entries: list[JournalEntry], end: int) -> int:
    """The bytes of ``entry``'s line (newline included): up to the next record."""
    index = _index_of(entries, entry.offset)
    following = entries[index + 1].offset if index + 1 < len(entries) else end
    return following - entry.offset


def _index_of(entries: list[JournalEntry], offset: int) -> int:
    """The index of the entry at ``offset`` (entries are sorted by offset)."""
    low, high = 0, len(entries)
    while low < high:
        middle = (low + high) // 2
        if entries[middle].offset < offset:
            low = middle + 1
        else:
            high = middle
    return low


def _scan(journal: Path) -> tuple[list[JournalEntry], int, int, str, JournalCorruptError | None]:
    """Every whole record; on damage before the tail, the records before the damage."""
    try:
        scan = scan_journal(journal)
    except JournalCorruptError as error:
        before = scan_journal(journal, limit=error.offset)
        return before.entries, before.end, 0, "", error
    return scan.entries, scan.end, scan.torn_bytes, scan.torn_reason, None


def _snapshot_marks(
    run: RunDirectory, entries: list[JournalEntry], end: int, size: int, problems: list[str]
) -> list[SnapshotMark]:
    store = CheckpointStore(run.root, keep=1)
    marks: list[SnapshotMark] = []
    offsets = [entry.offset for entry in entries]
    with store.reading():
        committed = store.committed()
        for checkpoint in committed:
            try:
                position = store.read_marks(checkpoint).get(run.events.name)
            except RolloutRecoveryError as error:
                problems.append(f"checkpoint {checkpoint.name}: {error}")
                continue
            if position is None:
                problem = f"records no position in {run.events.name}"
                marks.append(
                    SnapshotMark(checkpoint.name, checkpoint.step, None, None, 0, 0, problem)
                )
                problems.append(f"checkpoint {checkpoint.name}: {problem}")
                continue
            index = _index_of(entries, position)
            at_boundary = position == end or (index < len(offsets) and offsets[index] == position)
            problem = ""
            if position > size:
                problem = (
                    f"its position {position} is past the end of {run.events.name} ({size} "
                    "bytes): the journal lost records the checkpoint had synced"
                )
            elif position > end:
                problem = (
                    f"its position {position} is inside the damaged or torn stretch of "
                    f"{run.events.name} after byte {end}"
                )
            elif not at_boundary:
                problem = (
                    f"its position {position} is not the start of a record of {run.events.name}"
                )
            if problem:
                problems.append(f"checkpoint {checkpoint.name}: {problem}")
            line = (
                None
                if problem
                else (entries[index].line if index < len(entries) else _end_line(entries))
            )
            after = entries[index:] if not problem else []
            marks.append(
                SnapshotMark(
                    checkpoint=checkpoint.name,
                    step=checkpoint.step,
                    position=position,
                    line=line,
                    records_after=len(after),
                    bytes_after=end - position if not problem else 0,
                    problem=problem,
                )
            )
    return marks


def _end_line(entries: list[JournalEntry]) -> int:
    return entries[-1].line + 1 if entries else 1


def inspect_journal(
    run_dir: Path,
    *,
    start: int | str | None = None,
    types: Collection[str] = (),
    limit: int | None = None,
) -> JournalReport:
    """Inspect ``run_dir``'s journal; list records when ``start``, ``types`` or ``limit``
    is given: the records at or after ``start`` (a byte offset, or a committed
    checkpoint's name for the records after its snapshot), of ``types``, at most ``limit``.

    Raises :class:`NotARunDirectoryError` when ``run_dir`` is not a run or holds no
    journal, and ``ValueError`` for an unknown type or checkpoint, or a negative start or
    limit. Damage in the journal or a checkpoint is reported, not raised.
    """
    run = RunDirectory(run_dir)
    if not run.root.is_dir() or not run.job_file.is_file():
        raise NotARunDirectoryError(
            f"{run_dir} is not a rollout-recovery run directory (no {run.job_file.name})"
        )
    if not run.events.is_file():
        raise NotARunDirectoryError(f"{run_dir} holds no journal ({run.events.name})")
    unknown = sorted(set(types) - set(RECORD_TYPES))
    if unknown:
        raise InvalidArgumentError(
            f"unknown record type(s) {', '.join(unknown)}; known: {', '.join(RECORD_TYPES)}"
        )
    if isinstance(start, int) and start < 0:
        raise InvalidArgumentError(f"--from must be a byte offset >= 0, got {start}")
    if limit is not None and limit < 0:
        raise InvalidArgumentError(f"--limit must be >= 0, got {limit}")
    live = run.is_locked()
    size = run.events.stat().st_size
    entries, end, torn, reason, corrupt = _scan(run.events)
    problems = version_problems(entries, run.events.name)
    report = JournalReport(
        run_dir=run_dir,
        journal=run.events,
        size=size,
        end=end,
        live=live,
        entries=entries,
        torn_bytes=torn,
        torn_reason=reason,
        corrupt=corrupt,
        problems=problems,
    )
    report.snapshots = _snapshot_marks(run, entries, end, size, problems)
    if start is not None or types or limit is not None:
        offset = _start_offset(start, report.snapshots)
        wanted = set(types)
        listed = [
            entry
            for entry in entries[_index_of(entries, offset) :]
            if not wanted or _tag(entry.record) in wanted
        ]
        report.listed = listed if limit is None else listed[:limit]
        report.listing = {
            "from": offset,
            "types": sorted(wanted),
            "limit": limit,
            "matched": len(listed),
        }
    return report


def _start_offset(start: int | str | None, snapshots: list[SnapshotMark]) -> int:
    """The byte offset ``start`` names: itself, or a checkpoint's snapshot position."""
    if start is None:
        return 0
    if isinstance(start, int):
        return start
    for mark in snapshots:
        if mark.checkpoint == start:
            if mark.position is None or mark.problem:
                raise InvalidArgumentError(f"checkpoint {start} has no usable journal position")
            return mark.position
    names = ", ".join(mark.checkpoint for mark in snapshots) or "none"
    raise InvalidArgumentError(f"no committed checkpoint {start!r} (committed: {names})")
