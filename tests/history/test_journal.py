"""The journal: checksummed lines, group commit, torn tails cut, damage refused.

The kill test SIGKILLs a child that appends and flushes in a loop and prints each record's
number once its flush returned (an acknowledgement); it synchronizes on those lines,
never on time.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trail_builders import good_history

from rollout_recovery.errors import StorageFullError
from rollout_recovery.history import _journal
from rollout_recovery.history._journal import (
    JournalCorruptError,
    JournalStream,
    JournalWriter,
    cut_torn_tail,
    frame_record,
    scan_journal,
    unframe_line,
)
from rollout_recovery.history.records import PromptTaken


def taken(number: int, pad: str = "") -> PromptTaken:
    return PromptTaken(group_id=f"g{number}{pad}", prompt_idx=number, position=number, batch=0)


def write(path: Path, records: list[PromptTaken]) -> list[int]:
    """Append ``records``; the positions after each."""
    writer = JournalWriter(path)
    try:
        return [writer.append(record) for record in records]
    finally:
        writer.close()


# -- lines ----------------------------------------------------------------------------------


def test_a_line_is_plain_json_with_a_checksum_of_the_rest() -> None:
    line = frame_record(taken(3))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    value = json.loads(line)
    assert value["event"] == "prompt_taken" and value["prompt_idx"] == 3
    body = b"{" + line[line.index(b",") + 1 : -1]
    assert value["crc"] == f"{zlib.crc32(body):08x}"  # fixed width: eight hex digits
    assert unframe_line(line[:-1]) == taken(3)


@settings(max_examples=200)
@given(record=st.builds(taken, st.integers(0, 10**9), st.text(max_size=30)))
def test_every_record_round_trips_through_a_line(record: PromptTaken) -> None:
    assert unframe_line(frame_record(record)[:-1]) == record


@settings(max_examples=300)
@given(
    record=st.builds(taken, st.integers(0, 10**6), st.text(max_size=20)),
    data=st.data(),
)
def test_any_single_byte_change_is_caught(record: PromptTaken, data: st.DataObject) -> None:
    line = bytearray(frame_record(record)[:-1])
    position = data.draw(st.integers(0, len(line) - 1))
    replacement = data.draw(st.integers(0, 255).filter(lambda b: b != line[position]))
    line[position] = replacement
    with pytest.raises(ValueError):
        unframe_line(bytes(line))


def test_the_full_history_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    history = good_history()
    writer = JournalWriter(path)
    positions = [writer.append(record) for record in history]
    writer.close()
    scan = scan_journal(path)
    assert [entry.record for entry in scan.entries] == history
    assert [entry.offset for entry in scan.entries] == [0, *positions[:-1]]
    assert [entry.line for entry in scan.entries] == list(range(1, len(history) + 1))
    assert scan.end == positions[-1] == path.stat().st_size
    assert scan.torn_bytes == 0


def test_a_scan_from_a_position_reads_only_what_follows(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    positions = write(path, [taken(i) for i in range(10)])
    scan = scan_journal(path, start=positions[4])
    assert [entry.record.prompt_idx for entry in scan.entries] == list(range(5, 10))
    assert scan.entries[0].line == 6
    limited = scan_journal(path, start=positions[1], limit=positions[3])
    assert [entry.record.prompt_idx for entry in limited.entries] == [2, 3]


class _CountingReads:
    """``open`` for the journal module: counts the bytes every scan reads."""

    def __init__(self) -> None:
        self.read = 0

    def __call__(self, path: Path, mode: str) -> Any:
        counter, handle = self, open(path, mode)  # noqa: SIM115 (the scan closes it)

        class Counted:
            def __enter__(self) -> Counted:
                return self

            def __exit__(self, *exc: object) -> None:
                handle.close()

            def __getattr__(self, name: str) -> Any:
                return getattr(handle, name)

            def read(self, size: int = -1) -> bytes:
                data = handle.read(size)
                counter.read += len(data)
                return data

        return Counted()


def test_a_scan_with_its_start_line_reads_only_the_bytes_it_scans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.jsonl"
    positions = write(path, [taken(i) for i in range(50)])
    reads = _CountingReads()
    monkeypatch.setattr(_journal, "open", reads, raising=False)
    scan = scan_journal(path, start=positions[39], limit=positions[44], start_line=41)
    assert [entry.record.prompt_idx for entry in scan.entries] == [40, 41, 42, 43, 44]
    assert [entry.line for entry in scan.entries] == [41, 42, 43, 44, 45]
    assert scan.end_line == 46
    assert reads.read == positions[44] - positions[39]  # not the 40 records before


def test_a_scan_without_its_start_line_counts_the_lines_before_it(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    positions = write(path, [taken(i) for i in range(30)])
    scan = scan_journal(path, start=positions[19])
    assert [entry.line for entry in scan.entries] == list(range(21, 31))
    assert scan.end_line == 31
    # From the end: nothing to read, the next line is the 31st.
    assert scan_journal(path, start=positions[-1]).end_line == 31


def test_a_reopened_writer_appends_after_the_existing_records(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write(path, [taken(0)])
    write(path, [taken(1)])
    assert [e.record for e in scan_journal(path).entries] == [taken(0), taken(1)]


def test_the_journal_is_private_to_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write(path, [taken(0)])
    assert path.stat().st_mode & 0o077 == 0


# -- streaming -------------------------------------------------------------------------------


def _outcome(path: Path, **kwargs: Any) -> tuple[Any, ...]:
    """What a stream of the journal found: its entries (or its error) and its extent."""
    stream = JournalStream(path, **kwargs)
    try:
        entries: Any = list(stream.entries())
    except JournalCorruptError as error:
        entries = ("corrupt", error.offset, error.line, str(error))
    return entries, stream.end, stream.end_line, stream.torn_bytes, stream.torn_reason


@settings(max_examples=150)
@given(
    sizes=st.lists(st.integers(0, 200), min_size=0, max_size=12),
    damage=st.one_of(
        st.none(),
        st.tuples(st.sampled_from(["flip", "tear", "garbage", "blank"]), st.integers(0, 10**6)),
    ),
    chunk=st.integers(1, 64),
    start_at=st.integers(0, 12),
)
def test_a_stream_finds_what_one_read_of_the_whole_file_finds_whatever_its_chunk(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    damage: tuple[str, int] | None,
    chunk: int,
    start_at: int,
) -> None:
    """Records cut across chunk boundaries, torn tails, damage with records after it and
    blank lines: read a few bytes at a time, the stream finds what it finds with the
    whole journal in one chunk (the records, their offsets and lines, the error)."""
    path = tmp_path_factory.mktemp("stream") / "events.jsonl"
    positions = write(path, [taken(i, "x" * size) for i, size in enumerate(sizes)])
    data = bytearray(path.read_bytes())
    if damage is not None and data:
        kind, where = damage
        at = where % len(data)
        if kind == "flip":
            data[at] ^= 0x20
        elif kind == "tear":
            del data[at:]
        elif kind == "garbage":
            data += b"\x00" * (where % 50)
        else:
            data[at:at] = b"\n"
    path.write_bytes(bytes(data))
    start = ([0, *positions][start_at % (len(positions) + 1)]) if positions else 0
    start = min(start, len(data))
    whole = _journal._READ_CHUNK
    expected = _outcome(path, start=start)
    _journal._READ_CHUNK = chunk
    try:
        assert _outcome(path, start=start) == expected
    finally:
        _journal._READ_CHUNK = whole
    if not isinstance(expected[0], tuple):
        scan = scan_journal(path, start=start)
        assert (scan.entries, scan.end, scan.end_line, scan.torn_bytes) == expected[:4]


def test_a_stream_decodes_only_the_types_asked_for_and_checksums_the_rest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.jsonl"
    history = good_history()
    write(path, history)
    stream = JournalStream(path)
    wanted = [e.record for e in stream.entries(events={"checkpoint_committed"})]
    assert wanted == [r for r in history if type(r).__name__ == "CheckpointCommitted"]
    assert wanted and stream.records == len(history)
    data = bytearray(path.read_bytes())
    data[5] ^= 0x01  # the first record, not of the type asked for: still checked
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorruptError) as caught:
        list(JournalStream(path).entries(events={"checkpoint_committed"}))
    assert caught.value.line == 1


def test_verifying_a_long_journal_holds_one_chunk_not_the_journal(tmp_path: Path) -> None:
    """Issue 24 items 3 and 7: a pass over the whole journal streams it."""
    path = tmp_path / "events.jsonl"
    write(path, [taken(i, "y" * 900) for i in range(20_000)])  # about 20 MB
    size = path.stat().st_size
    tracemalloc.start()
    try:
        stream = JournalStream(path).verify()
        peak = tracemalloc.get_traced_memory()[1]
        counted = sum(1 for _ in JournalStream(path).entries(events={"run_started"}))
        peak = max(peak, tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()
    assert stream.records == 20_000 and stream.end == size and counted == 0
    assert peak < 4 * _journal._READ_CHUNK, f"{peak} bytes held to verify {size}"


# -- tails and damage -----------------------------------------------------------------------


@pytest.mark.parametrize("cut", [1, 10, 40])
def test_a_torn_last_line_is_a_torn_tail_cut_at_the_last_whole_record(
    tmp_path: Path, cut: int
) -> None:
    path = tmp_path / "events.jsonl"
    positions = write(path, [taken(i) for i in range(5)])
    with open(path, "r+b") as handle:
        handle.truncate(positions[-1] - cut)  # the last write lost its end
    scan = scan_journal(path)
    assert [e.record.prompt_idx for e in scan.entries] == [0, 1, 2, 3]
    assert scan.end == positions[3]
    assert scan.torn_bytes == positions[4] - cut - positions[3]
    assert scan.torn_reason
    cut_torn_tail(path, scan.end)
    assert path.stat().st_size == positions[3]
    assert scan_journal(path).torn_bytes == 0


def test_a_garbage_tail_after_a_power_cut_is_torn(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    positions = write(path, [taken(i) for i in range(3)])
    with open(path, "ab") as handle:
        handle.write(b"\x00" * 300 + b"\n" + b"\x00" * 40)
    scan = scan_journal(path)
    assert len(scan.entries) == 3
    assert scan.end == positions[-1]
    assert scan.torn_bytes == 341


def test_a_damaged_line_with_records_after_it_is_fatal_with_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    positions = write(path, [taken(i) for i in range(5)])
    data = bytearray(path.read_bytes())
    data[positions[1] + 20] ^= 0x01  # inside record 2 (line 3)
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorruptError) as caught:
        scan_journal(path)
    assert caught.value.offset == positions[1]
    assert caught.value.line == 3
    assert "events.jsonl:3" in str(caught.value)
    assert caught.value.fatal
    assert not caught.value.rerun_resumes  # a rerun finds the same damage


def test_a_journal_shorter_than_a_recorded_position_is_fatal(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    positions = write(path, [taken(i) for i in range(2)])
    with pytest.raises(JournalCorruptError, match="shorter than the position"):
        scan_journal(path, start=positions[-1] + 10)


def test_a_short_write_stops_the_appends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "events.jsonl"
    writer = JournalWriter(path)
    writer.append(taken(0))
    real = _journal._write
    monkeypatch.setattr(_journal, "_write", lambda fd, data: real(fd, data[:7]))
    with pytest.raises(StorageFullError, match=r"appending to events\.jsonl"):
        writer.append(taken(1))
    writer.close()
    # What landed of the failed write is taken back: no part of it is ever read as whole.
    scan = scan_journal(path)
    assert [e.record for e in scan.entries] == [taken(0)] and scan.torn_bytes == 0


def test_a_cut_of_several_records_is_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.jsonl"
    writes: list[int] = []
    real = _journal._write

    def counting(fd: int, data: bytes) -> int:
        writes.append(len(data))
        return real(fd, data)

    monkeypatch.setattr(_journal, "_write", counting)
    writer = JournalWriter(path)
    writer.append_all([taken(0), taken(1), taken(2)])
    writer.close()
    assert len(writes) == 1
    assert [e.record for e in scan_journal(path).entries] == [taken(0), taken(1), taken(2)]


def test_a_failed_write_of_a_cut_leaves_none_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.jsonl"
    writer = JournalWriter(path)
    writer.append(taken(0))
    real = _journal._write
    # The disk fills after two and a half records of the three.
    monkeypatch.setattr(_journal, "_write", lambda fd, data: real(fd, data[: int(len(data) * 0.8)]))
    with pytest.raises(StorageFullError):
        writer.append_all([taken(1), taken(2), taken(3)])
    writer.close()
    assert [e.record for e in scan_journal(path).entries] == [taken(0)]


# -- group commit ---------------------------------------------------------------------------


def test_a_burst_of_flushes_shares_few_syncs(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = JournalWriter(path)

    async def one(number: int) -> None:
        writer.append(taken(number))
        await writer.flush()
        assert writer.durable_position >= writer.position or writer.durable_position > 0

    async def burst() -> None:
        await asyncio.gather(*(one(i) for i in range(200)))

    asyncio.run(burst())
    assert writer.durable_position == writer.position == path.stat().st_size
    # 200 appends, each acknowledged after a durable sync, in far fewer syncs.
    assert writer.syncs <= 20, writer.syncs
    writer.close()


def test_a_flush_with_nothing_new_does_not_sync(tmp_path: Path) -> None:
    writer = JournalWriter(tmp_path / "events.jsonl")
    writer.append(taken(0))
    asyncio.run(writer.flush())
    syncs = writer.syncs
    asyncio.run(writer.flush())
    assert writer.syncs == syncs
    writer.close()


def test_a_seal_appended_during_a_checkpoints_sync_waits_for_a_sync_that_covers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 item 1: the checkpoint's ``sync()`` runs in a worker thread while the loop
    appends seals. A seal appended after that sync began is not covered by it: the
    durable position stays before it and its flush syncs again. The instrumented
    ``fdatasync`` records the file's length when each sync starts (all it can cover)
    and holds the checkpoint's sync until the seal is appended."""
    path = tmp_path / "events.jsonl"
    covered: list[int] = []
    inside, appended = threading.Event(), threading.Event()
    main = threading.current_thread()

    def instrumented_fdatasync(fd: int) -> None:
        covered.append(os.fstat(fd).st_size)
        if threading.current_thread() is not main and not inside.is_set():
            inside.set()
            assert appended.wait(timeout=30)
        os.fdatasync(fd)

    monkeypatch.setattr(_journal, "_fdatasync", instrumented_fdatasync)
    writer = JournalWriter(path, sync_in_thread=False)

    async def scenario() -> int:
        writer.append(taken(0))
        checkpoint_sync = asyncio.ensure_future(asyncio.to_thread(writer.sync))
        await asyncio.to_thread(inside.wait)
        seal_end = writer.append(taken(1))  # a seal appended while the sync runs
        appended.set()
        await checkpoint_sync
        assert writer.durable_position < seal_end, "acknowledged before any sync covered it"
        await writer.flush()  # the seal's acknowledgement
        return seal_end

    seal_end = asyncio.run(scenario())
    assert max(covered) >= seal_end, "the seal's flush returned without a sync covering it"
    assert writer.durable_position == seal_end
    writer.close()


@settings(max_examples=30)
@given(schedule=st.lists(st.sampled_from(["append", "flush", "sync"]), max_size=40))
def test_the_durable_position_never_passes_what_a_finished_sync_covered(
    tmp_path_factory: pytest.TempPathFactory, schedule: list[str]
) -> None:
    """Whatever the order of appends, flushes and thread syncs, the durable position is
    never past the length the file had when a finished sync started."""
    path = tmp_path_factory.mktemp("journal") / "events.jsonl"
    covered = [0]
    original = _journal._fdatasync

    def recording(fd: int) -> None:
        start = os.fstat(fd).st_size
        original(fd)
        covered.append(start)

    writer = JournalWriter(path, sync_in_thread=False)

    async def run() -> None:
        pending: list[asyncio.Future[None]] = []
        for number, action in enumerate(schedule):
            if action == "append":
                writer.append(taken(number))
            elif action == "flush":
                pending.append(asyncio.ensure_future(writer.flush()))
            else:
                pending.append(asyncio.ensure_future(asyncio.to_thread(writer.sync)))
            await asyncio.sleep(0)
            assert writer.durable_position <= max(covered)
        await asyncio.gather(*pending)
        assert writer.durable_position <= max(covered)

    _journal._fdatasync = recording
    try:
        asyncio.run(run())
    finally:
        _journal._fdatasync = original
        writer.close()


# -- SIGKILL --------------------------------------------------------------------------------

CHILD = r"""
import asyncio, sys
from pathlib import Path
from rollout_recovery.history._journal import JournalWriter
from rollout_recovery.history.records import PromptTaken
path, start = Path(sys.argv[1]), int(sys.argv[2])
writer = JournalWriter(path)

async def main():
    number = start
    while True:
        batch = []
        for _ in range(1 + number % 7):
            writer.append(PromptTaken(group_id="g" * (number % 300), prompt_idx=number,
                                      position=number, batch=0))
            batch.append(number)
            number += 1
        await writer.flush()
        print(" ".join(map(str, batch)), flush=True)  # acknowledged: durable

asyncio.run(main())
"""


@pytest.mark.slow
def test_sigkill_during_appends_loses_no_acknowledged_record(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    rng = random.Random(7)
    acknowledged: list[int] = []
    applied: list[int] = []
    # 20 kills at random points of a run of appends (each costs a child interpreter).
    for _cycle in range(20):
        start = applied[-1] + 1 if applied else 0
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(start)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        for _ in range(rng.randint(1, 30)):
            line = child.stdout.readline()
            assert line, "the child died before its kill"
            acknowledged.extend(int(n) for n in line.split())
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        scan = scan_journal(path)
        if scan.torn_bytes:
            cut_torn_tail(path, scan.end)
        applied = [entry.record.prompt_idx for entry in scan.entries]
        # No record twice, in order, and every acknowledged one is there.
        assert applied == list(range(len(applied)))
        assert set(acknowledged) <= set(applied)
    assert len(acknowledged) > 40
