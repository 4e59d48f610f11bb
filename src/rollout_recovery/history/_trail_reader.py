"""Reading the history back: every record verified and decoded, or refused with its place.

A reader never guesses: a damaged line with whole records after it (altered, not torn)
raises :class:`~rollout_recovery.history.JournalCorruptError` naming ``file:line`` and
its byte offset. A torn tail (the last line of a live run being written, or one a power
cut tore) is not part of the history yet and is left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from ..errors import TrailLineError
from ._journal import JournalEntry, scan_journal
from .records import READABLE_HISTORY_VERSIONS, HistoryRecord, RunStarted

__all__ = ["read_entries", "read_json_lines", "read_records", "version_problems"]


def version_problems(entries: list[JournalEntry], name: str) -> list[str]:
    """Why a reader cannot take ``entries`` (of the journal called ``name``) as a history it
    reads: a ``run_started`` of a version it does not read, or of a version older than one
    before it (an older rollout-recovery appended to a newer history). Each names its line
    and byte offset."""
    readable = " and ".join(str(v) for v in sorted(READABLE_HISTORY_VERSIONS))
    problems: list[str] = []
    newest: tuple[int, int] | None = None  # (version, line)
    for entry in entries:
        record = entry.record
        if not isinstance(record, RunStarted):
            continue
        where = f"{name}:{entry.line} (byte {entry.offset})"
        if record.version not in READABLE_HISTORY_VERSIONS:
            problems.append(
                f"{where} is history version {record.version}; this rollout-recovery reads "
                f"versions {readable}: read it with the rollout-recovery that wrote it"
            )
        elif newest is not None and record.version < newest[0]:
            problems.append(
                f"{where} is history version {record.version}, after version {newest[0]} at "
                f"line {newest[1]}: an older rollout-recovery appended to this history"
            )
        if newest is None or record.version > newest[0]:
            newest = (record.version, entry.line)
    return problems


def read_entries(path: Path, *, start: int = 0, limit: int | None = None) -> list[JournalEntry]:
    """The verified records of the journal at ``path`` (from byte ``start``, up to
    ``limit``), with their offsets and line numbers; a torn tail is left out.

    Raises :class:`TrailLineError` for a history this version cannot read
    (:func:`version_problems`)."""
    entries = scan_journal(path, start=start, limit=limit).entries
    problems = version_problems(entries, path.name)
    if problems:
        raise TrailLineError(problems[0], file=str(path))
    return entries


def read_records(
    path: Path, *, start: int = 0, limit: int | None = None
) -> Iterator[tuple[int, HistoryRecord]]:
    """``(line number, record)`` of each verified record (see :func:`read_entries`)."""
    for entry in read_entries(path, start=start, limit=limit):
        yield entry.line, entry.record


def read_json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """The JSON objects of a plain JSON-lines file (metrics), numbered from 1.

    Raises :class:`TrailLineError` for a line that is not a JSON object.
    """
    # Line by line: a reader keeps what it needs, not the file (it grows with the run).
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = msgspec.json.decode(line)
            except msgspec.DecodeError as error:
                raise TrailLineError(
                    f"{path.name}:{number} is not valid JSON ({error})", file=str(path)
                ) from None
            if not isinstance(value, dict):
                raise TrailLineError(f"{path.name}:{number} is not a JSON object", file=str(path))
            yield number, value
