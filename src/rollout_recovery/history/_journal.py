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

Reading. :class:`JournalStream` verifies every line from a byte offset on as it reads
the file in chunks, so a reader of the whole journal holds one record at a time;
``verify()`` checks the checksums only (a restore's pass over the whole history, at disk
speed), ``entries()`` decodes the records (of the types asked for). :func:`scan_journal`
is the same as a list, for the stretch a restore replays. A damaged line at the end (a
write a power cut tore, with nothing valid after it) is a *torn tail*: the scan stops
before it and says so, and :func:`cut_torn_tail` removes it. A damaged line with valid
lines after it cannot come from a crash: it is reported as :class:`JournalCorruptError`
with its offset, and nothing is repaired.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
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
    "JournalStream",
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
    # Damage a crash cannot make stays: the next start finds it again.
    rerun_resumes = False

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
    return _decoded(_checked_body(line))


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


#: How much of the file a reader holds at once (besides the line it is reading): readers
#: stream, so their memory follows the longest record, not the journal's length.
_READ_CHUNK = 1 << 20


def _lines_before(handle: BinaryIO, offset: int) -> int:
    """How many newlines the file holds before byte ``offset``."""
    handle.seek(0)
    count, left = 0, offset
    while left > 0:
        chunk = handle.read(min(_READ_CHUNK, left))
        if not chunk:
            break
        count += chunk.count(b"\n")
        left -= len(chunk)
    return count


def _raw_lines(handle: BinaryIO, start: int, stop: int) -> Iterator[tuple[int, bytes, bool]]:
    """``(offset, line, complete)`` of each line between bytes ``start`` and ``stop``
    (without its newline; the last is incomplete when no newline ends it), read in
    chunks."""
    handle.seek(start)
    buffer = bytearray()
    base, left = start, stop - start
    while left > 0:
        data = handle.read(min(_READ_CHUNK, left))
        if not data:
            break
        left -= len(data)
        search_from = len(buffer)
        buffer += data
        index = 0
        newline = buffer.find(b"\n", search_from)
        while newline != -1:
            yield base + index, bytes(buffer[index:newline]), True
            index = newline + 1
            newline = buffer.find(b"\n", index)
        del buffer[:index]
        base += index
    if buffer:
        yield base, bytes(buffer), False


def _checked_body(line: bytes) -> bytes:
    """The record JSON of one journal line whose checksum matches; ``_Damaged`` if not."""
    match = _PREFIX.match(line)
    if match is None:
        raise _Damaged("no checksum field where a journal line starts")
    body = b"{" + line[match.end() :]
    if zlib.crc32(body) != int(match.group(1), 16):
        raise _Damaged("checksum mismatch (the line was altered or torn)")
    return body


def _event_of(body: bytes) -> bytes:
    """The ``event`` name a record's JSON starts with (every record is framed so)."""
    if not body.startswith(b'{"event":"'):
        return b""
    return body[10 : body.find(b'"', 10)]


class JournalStream:
    """The journal at ``path`` from byte ``start`` (up to ``limit``), verified line by line
    as it is read: memory follows the longest record, not the journal.

    Iterate :meth:`entries` (decoded records) or call :meth:`verify` (checksums only, at
    disk speed); a damaged line with a whole record after it raises
    :class:`JournalCorruptError` when that record is reached. Once read to its end,
    ``end``, ``end_line``, ``torn_bytes`` and ``torn_reason`` say where the whole records
    end and what follows them (see :class:`JournalScan`); ``records`` counts them.
    """

    def __init__(
        self,
        path: Path,
        *,
        start: int = 0,
        limit: int | None = None,
        start_line: int | None = None,
    ) -> None:
        self.path = path
        self.start = start
        self._limit = limit
        self._start_line = start_line
        self.end = start
        self.end_line = 1 if start_line is None else start_line
        self.torn_bytes = 0
        self.torn_reason = ""
        self.records = 0

    def verify(self) -> JournalStream:
        """Read to the end checking every line's checksum, decoding nothing; returns self."""
        for _ in self._records(decode=lambda _: False):
            pass
        return self

    def entries(self, *, events: Collection[str] | None = None) -> Iterator[JournalEntry]:
        """The verified records, decoded, in order. With ``events``, only records of those
        types are decoded and yielded; the others are checksummed and passed over."""
        wanted = None if events is None else {event.encode() for event in events}

        def decode(body: bytes) -> bool:
            return wanted is None or _event_of(body) in wanted

        for offset, number, record in self._records(decode=decode):
            if record is not None:
                yield JournalEntry(offset, number, record)

    def _records(
        self, *, decode: Callable[[bytes], bool]
    ) -> Iterator[tuple[int, int, HistoryRecord | None]]:
        """``(offset, line number, record)`` of each whole line; the record is None for a
        line ``decode`` passes over (checksummed only). One to decode that does not is
        damage."""
        path, start = self.path, self.start
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            stop = size if self._limit is None else min(self._limit, size)
            if start > stop:
                raise JournalCorruptError(
                    f"{path.name} is {stop} bytes, shorter than the position {start} a "
                    "checkpoint recorded: the journal lost records that were synced",
                    file=str(path),
                    offset=stop,
                    line=_lines_before(handle, stop) + 1,
                )
            number = (
                _lines_before(handle, start) + 1 if self._start_line is None else self._start_line
            )
            self.end, self.end_line = start, number
            first_bad: tuple[int, int, str] | None = None
            for offset, line, complete in _raw_lines(handle, start, stop):
                at = number
                number += 1
                if not line.strip():
                    if first_bad is None and complete:
                        self.end, self.end_line = offset + len(line) + 1, number
                    continue
                try:
                    if not complete:
                        raise _Damaged("the last line has no newline (its write did not finish)")
                    body = _checked_body(line)
                    record = _decoded(body) if decode(body) else None
                except _Damaged as damage:
                    if first_bad is None:
                        first_bad = (offset, at, str(damage))
                    continue
                if first_bad is not None:
                    bad_offset, bad_line, reason = first_bad
                    raise JournalCorruptError(
                        f"{path.name}:{bad_line} (byte {bad_offset}) is damaged ({reason}) but "
                        f"whole records follow it (line {at}): this is not a torn tail, the "
                        "journal was altered",
                        file=str(path),
                        offset=bad_offset,
                        line=bad_line,
                    )
                self.end, self.end_line = offset + len(line) + 1, number
                self.records += 1
                yield offset, at, record
            self.torn_bytes = stop - self.end
            self.torn_reason = "" if first_bad is None else first_bad[2]


def _decoded(body: bytes) -> HistoryRecord:
    try:
        return decode_record(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise _Damaged(f"not a history record: {error}") from None


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
    The records are returned as a list: for a stretch a restore replays; a reader of the
    whole journal streams it (:class:`JournalStream`).
    """
    stream = JournalStream(path, start=start, limit=limit, start_line=start_line)
    entries = list(stream.entries())
    return JournalScan(
        entries=entries,
        end=stream.end,
        torn_bytes=stream.torn_bytes,
        torn_reason=stream.torn_reason,
        end_line=stream.end_line,
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
