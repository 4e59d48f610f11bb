"""A put that returned survives SIGKILL, and no row is ever torn.

A real child process (``crash_writer.py``) puts rows into a SqliteDataPlane and prints an
acknowledgement after each returned ``put``. The test reads acknowledgements from the pipe
and sends SIGKILL the moment the N-th arrives, with no sleeps: the child is by then already
inside the next put. Reopening must show every acknowledged row byte for byte, and any
extra row (a put that completed but was not acknowledged yet) must be whole too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from crash_writer import PARTITION, crash_key, crash_row
from dataplane_support import assert_rows_equal

from rollout_recovery.dataplane import SqliteDataPlane

WRITER = Path(__file__).resolve().parent / "crash_writer.py"


def _run_and_kill(db: Path, acks_wanted: int) -> int:
    """Start the writer, SIGKILL it right after ``acks_wanted`` acknowledgements (counted
    in this run); return the highest row index it acknowledged before it died."""
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    last = -1
    try:
        first = proc.stdout.readline()
        assert first == "ready\n", f"writer failed to start: {first!r} {proc.stderr.read()!r}"
        for _ in range(acks_wanted):
            line = proc.stdout.readline()
            assert line.startswith("ack "), f"writer died: {line!r} {proc.stderr.read()!r}"
            last = int(line.split()[1])
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        # The child may have acknowledged more puts before the signal landed (this
        # process can be descheduled between reading an ack and sending the kill).
        for line in proc.stdout.read().splitlines():
            if line.startswith("ack "):
                last = max(last, int(line.split()[1]))
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return last


def _check_store(db: Path, last_acked: int) -> int:
    with SqliteDataPlane(db) as store:
        keys = store.keys(PARTITION)
        present = {int(key.split("-")[1].split("/")[0]) for key in keys}
        acked = set(range(last_acked + 1))
        assert acked <= present, f"acknowledged rows lost: {sorted(acked - present)[:10]}"
        # At most the row whose put was in flight may be there without an acknowledgement.
        assert present - acked <= {last_acked + 1}
        for i, row in zip(sorted(present), store.get(PARTITION, keys), strict=True):
            assert_rows_equal(row, crash_row(i))
        return len(present)


@pytest.mark.slow
@pytest.mark.parametrize("kill_points", [(1, 3, 9), (17, 2), (40,)])
def test_acknowledged_puts_survive_sigkill(tmp_path: Path, kill_points: tuple[int, ...]) -> None:
    db = tmp_path / "store.sqlite3"
    for acks in kill_points:
        last = _run_and_kill(db, acks)
        # The kill left an un-checkpointed WAL behind: reopening exercises WAL recovery.
        assert db.with_name(db.name + "-wal").stat().st_size > 0
        count = _check_store(db, last)
        assert count >= last + 1
    # After all the kills the store still works normally.
    with SqliteDataPlane(db) as store:
        store.put(PARTITION, {"after": crash_row(0)})
        assert_rows_equal(store.get(PARTITION, ["after"])[0], crash_row(0))


def test_crash_rows_are_deterministic() -> None:
    assert crash_key(3) == "rollout-00003/call-0"
    assert_rows_equal(crash_row(5), crash_row(5))
