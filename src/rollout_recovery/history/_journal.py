"""The write-ahead journal: the run's history as checksummed JSON lines, group-committed.

``events.jsonl`` is both the audit trail and the journal a restore replays: one history.
Each line is one :data:`HistoryRecord` as a JSON object whose first field is a CRC32 of
the rest of the line::

    {"crc":"ab52c2c1","event":"sibling_sealed","group_id":"g0000003",...}

The checksum covers the record's JSON exactly as written (``{"event":...}``), so any
flipped or lost byte is caught; the line stays plain JSON for ``jq`` and friends.

Durability. :meth:`JournalWriter.append` writes a line with one ``os.write`` on an
``O_APPEND`` descriptor: once it returns, the bytes survive the process (a SIGKILL cannot
take them back). :meth:`JournalWriter.flush` makes everything appended so far survive the
machine too (``fdatasync``). Flushes are group-committed: callers that arrive while a sync
is running wait for it, and one more sync covers every line appended meanwhile, so a
burst of seals costs one or two syncs, not one each.

Reading. :func:`scan_journal` verifies every line from a byte offset on. A damaged line
at the end (a write a power cut tore, with nothing valid after it) is a *torn tail*: the
scan stops before it and says so, and :func:`cut_torn_tail` removes it. A damaged line
with valid lines after it cannot come from a crash: it is reported as
:class:`JournalCorruptError` with its offset, and nothing is repaired.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec

from .._crashpoints import crash_point
from .._durable import PRIVATE_FILE_MODE
from .._lifecycle import Resource
from ..errors import InvalidStateError, StorageFullError
from .records import HistoryRecord, decode_record, encode_record

__all__ = [
    "JournalCorruptError",
    "JournalEntry",
    "JournalScan",
    "JournalWriter",
    "cut_torn_tail",
    "frame_record",
    "scan_journal",
    "unframe_line",
]

# Fixed width (eight hex digits in a string), so a record edited in place keeps the length
# of its line whatever its new checksum.
_PREFIX = re.compile(rb'\A\{"crc":"([0-9a-f]{8})",')

# One name for the append syscall, so a test can make the disk "fill up" mid-line.
_write = os.write
# One name for the sync syscall, so a benchmark can measure the job without it
# (``benchmarks/bench_journal.py``); nothing else replaces it.
_fdatasync = os.fdatasync


class JournalCorruptError(InvalidStateError):
    """A journal line before the end is damaged: not what a crash leaves. Fatal.

    ``offset`` is the byte offset of the damaged line, ``line`` its line number.
    """

    fatal = True

    def __init__(self, message: str, *, file: str, offset: int, line: int) -> None:
        super().__init__(message, file=file)
        self.offset = offset
        self.line = line


def frame_record(record: HistoryRecord) -> bytes:
    """One journal line (with its newline) for ``record``."""
    body = encode_record(record)
    return b'{"crc":"%08x",%s\n' % (zlib.crc32(body), body[1:])


class _Damaged(ValueError):
    """Why one line is not a whole record (a reader turns it into a located error)."""


def unframe_line(line: bytes) -> HistoryRecord:
    """The record on one journal line (without its newline); ``_Damaged`` if it is not."""
    match = _PREFIX.match(line)
    if match is None:
        raise _Damaged("no checksum field where a journal line starts")
    body = b"{" + line[match.end() :]
    if zlib.crc32(body) != int(match.group(1), 16):
        raise _Damaged("checksum mismatch (the line was altered or torn)")
    try:
        return decode_record(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise _Damaged(f"not a history record: {error}") from None


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A verified record with where it sits: byte ``offset`` and ``line`` (from 1)."""

    offset: int
    line: int
    record: HistoryRecord


@dataclass(frozen=True, slots=True)
class JournalScan:
    """What :func:`scan_journal` found from its start offset on."""

    entries: list[JournalEntry]
    #: The offset just past the last whole record (where a torn tail begins, if any).
    end: int
    #: Bytes after ``end`` that are a torn tail (0 when the journal ends cleanly).
    torn_bytes: int
    #: Why the tail is torn ("" when it is not).
    torn_reason: str = ""
    #: The line number of the line that starts at ``end`` (the next record's).
    end_line: int = 1

    @staticmethod
    def read(
        path: Path, *, start: int = 0, limit: int | None = None, start_line: int | None = None
    ) -> JournalScan:
        """Scan the journal at ``path`` (see :func:`scan_journal`)."""
        return scan_journal(path, start=start, limit=limit, start_line=start_line)

    def cut_torn_tail(self, path: Path) -> None:
        """Cut the journal at ``path`` back to this scan's end, durably (see
        :func:`cut_torn_tail`)."""
        cut_torn_tail(path, self.end)


#: Chunk size for counting the lines before a scan's start (never held whole in memory).
_COUNT_CHUNK = 1 << 20


def _lines_before(handle: BinaryIO, offset: int) -> int:
    """How many newlines the file holds before byte ``offset``."""
    handle.seek(0)
    count, left = 0, offset
    while left > 0:
        chunk = handle.read(min(_COUNT_CHUNK, left))
        if not chunk:
            break
        count += chunk.count(b"\n")
        left -= len(chunk)
    return count


def _lines_with_offsets(
    data: bytes, base: int, first_line: int
) -> Iterator[tuple[int, int, bytes, bool]]:
    """``(offset, line number, line, complete)`` of each line of ``data``, which is the
    file's bytes from offset ``base`` on, whose first line is number ``first_line``."""
    number = first_line
    index = 0
    while index < len(data):
        newline = data.find(b"\n", index)
        complete = newline != -1
        end = newline if complete else len(data)
        yield base + index, number, data[index:end], complete
        index = end + 1
        number += 1


def scan_journal(
    path: Path, *, start: int = 0, limit: int | None = None, start_line: int | None = None
) -> JournalScan:
    """Verify and decode the journal at ``path`` from byte ``start`` (up to ``limit``).

    Only the bytes from ``start`` to ``limit`` are read, so a scan after a position costs
    what follows it, not the history before it. Line numbers (for messages) count from
    the file's start: pass ``start_line``, the number of the line at ``start``, when it
    is known (a follower tracks it as ``end_line``); otherwise the lines before ``start``
    are counted in chunks.

    A damaged or incomplete last stretch is returned as a torn tail; a damaged line with a
    whole record after it raises :class:`JournalCorruptError`. Blank lines are skipped.
    """
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        stop = size if limit is None else min(limit, size)
        if start > stop:
            raise JournalCorruptError(
                f"{path.name} is {stop} bytes, shorter than the position {start} a "
                "checkpoint recorded: the journal lost records that were synced",
                file=str(path),
                offset=stop,
                line=_lines_before(handle, stop) + 1,
            )
        first_line = _lines_before(handle, start) + 1 if start_line is None else start_line
        handle.seek(start)
        data = handle.read(stop - start)
    entries: list[JournalEntry] = []
    first_bad: tuple[int, int, str] | None = None
    end = start
    for offset, number, line, complete in _lines_with_offsets(data, start, first_line):
        if not line.strip():
            if first_bad is None and complete:
                end = offset + len(line) + 1
            continue
        try:
            if not complete:
                raise _Damaged("the last line has no newline (its write did not finish)")
            record = unframe_line(line)
        except _Damaged as damage:
            if first_bad is None:
                first_bad = (offset, number, str(damage))
            continue
        if first_bad is not None:
            bad_offset, bad_line, reason = first_bad
            raise JournalCorruptError(
                f"{path.name}:{bad_line} (byte {bad_offset}) is damaged ({reason}) but whole "
                f"records follow it (line {number}): this is not a torn tail, the journal "
                "was altered",
                file=str(path),
                offset=bad_offset,
                line=bad_line,
            )
        entries.append(JournalEntry(offset, number, record))
        end = offset + len(line) + 1
    end_line = first_line + data.count(b"\n", 0, end - start)
    torn = len(data) - (end - start)
    if first_bad is None:
        return JournalScan(entries=entries, end=end, torn_bytes=torn, end_line=end_line)
    return JournalScan(
        entries=entries, end=end, torn_bytes=torn, torn_reason=first_bad[2], end_line=end_line
    )


def cut_torn_tail(path: Path, end: int) -> None:
    """Cut the journal back to ``end`` (a scan's end) and make the cut durable."""
    crash_point("journal.before_cut")
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, end)
        os.fsync(fd)
    finally:
        os.close(fd)


class JournalWriter(Resource):
    """Appends records to one journal file; group-commits their durability."""

    def __init__(self, path: Path, *, sync_in_thread: bool = True) -> None:
        self._path = path
        # A sync in a worker thread keeps the event loop serving while the disk works; a
        # test that drives the loop step by step syncs inline instead.
        self.sync_in_thread = sync_in_thread
        self._fd = os.open(
            path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE
        )
        self._end = os.fstat(self._fd).st_size
        self._durable = self._end
        self._durable_lock = threading.Lock()
        self._syncing: asyncio.Future[None] | None = None
        self.appended = 0
        self.syncs = 0

    @property
    def path(self) -> Path:
        return self._path

    @property
    def position(self) -> int:
        """The byte offset after the last record appended (where the next one goes)."""
        return self._end

    @property
    def durable_position(self) -> int:
        """Everything before this offset is on disk (fdatasync'd)."""
        return self._durable

    def append(self, record: HistoryRecord) -> int:
        """Append ``record``; returns the position after it. Survives a SIGKILL at once;
        survives a power cut once a :meth:`flush` covering it returns."""
        return self.append_all([record])

    def append_all(self, records: Sequence[HistoryRecord]) -> int:
        """Append ``records`` (one mutation cut's) with a single write: a kill leaves all
        of them or none. Returns the position after the last."""
        data = b"".join(frame_record(record) for record in records)
        written = _write(self._fd, data)
        if written != len(data):
            # The disk filled mid-write: take back what landed, so no part of the cut is
            # ever read as if it were whole, and stop.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._end)
            raise StorageFullError(f"appending to {self._path.name}", filename=str(self._path))
        self._end += written
        self.appended += len(records)
        crash_point("journal.after_append")
        return self._end

    async def flush(self) -> None:
        """Return once everything appended before the call is durable (group commit)."""
        target = self._end
        while self._durable < target:
            if self._syncing is None:
                self._syncing = asyncio.ensure_future(self._sync_round())
            await asyncio.shield(self._syncing)

    async def _sync_round(self) -> None:
        covers = self._end
        try:
            if self.sync_in_thread:
                await asyncio.to_thread(_fdatasync, self._fd)
            else:
                _fdatasync(self._fd)
            crash_point("journal.after_fsync")
            self.syncs += 1
            self._advance_durable(covers)
        finally:
            self._syncing = None

    def sync(self) -> None:
        """Make everything appended before the call durable (from a worker thread).

        The event loop may go on appending while the sync runs: only the end captured
        before it started is covered, so only that becomes durable. A seal appended during
        the sync waits for a sync that started after it.
        """
        covers = self._end
        _fdatasync(self._fd)
        self._advance_durable(covers)

    def _advance_durable(self, covers: int) -> None:
        # Never backwards: a sync in a worker thread and one on the loop may finish in
        # either order (the lock makes the read and the write one step).
        with self._durable_lock:
            self._durable = max(self._durable, covers)

    def truncate(self, end: int) -> None:
        """Cut the file back to ``end`` (a fresh start, or a torn tail)."""
        os.ftruncate(self._fd, end)
        os.fsync(self._fd)
        self._end = self._durable = end

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
