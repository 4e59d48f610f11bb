"""SqliteDataPlane: the shared contract plus durability, format and threading specifics."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from dataplane_support import assert_rows_equal, make_row
from store_contract import MACHINE_SETTINGS, StoreContract, StoreFactory, StoreMachine

from rollout_recovery.dataplane import DataPlane, MemoryDataPlane, SqliteDataPlane
from rollout_recovery.dataplane._sqlite import SNAPSHOT_FILE
from rollout_recovery.errors import InvalidStateError


class TestSqliteContract(StoreContract):
    @pytest.fixture
    def new_store(self, tmp_path: Path) -> StoreFactory:
        counter = iter(range(1_000_000))

        def factory() -> DataPlane:
            return SqliteDataPlane(tmp_path / f"store{next(counter)}.sqlite3")

        return factory


class SqliteMachine(StoreMachine):
    def make_store(self, directory: Path) -> DataPlane:
        return SqliteDataPlane(directory / "store.sqlite3")


TestSqliteMachine = pytest.mark.slow(SqliteMachine.TestCase)
TestSqliteMachine.settings = MACHINE_SETTINGS


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SqliteDataPlane]:
    with SqliteDataPlane(tmp_path / "store.sqlite3") as store:
        yield store


def test_durability_settings(db: SqliteDataPlane) -> None:
    conn = db._conn
    assert conn is not None
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_rows_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    with SqliteDataPlane(path) as store:
        store.put("staging", {"r/c1": make_row(1), "r/c2": make_row(2)})
        store.clear("staging", ["r/c2"])
    with SqliteDataPlane(path) as store:
        assert store.keys("staging") == ["r/c1"]
        assert_rows_equal(store.get("staging", ["r/c1"])[0], make_row(1))


def test_refuses_a_foreign_database(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (text)")
    conn.commit()
    conn.close()
    with pytest.raises(InvalidStateError, match="not a rollout-recovery data-plane store"):
        SqliteDataPlane(path)
    conn = sqlite3.connect(path)
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_schema")] == ["notes"]
    conn.close()


def test_refuses_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.sqlite3"
    path.write_bytes(b"\x00junk" * 1000)
    with pytest.raises(InvalidStateError, match=r"junk\.sqlite3"):
        SqliteDataPlane(path)


def test_refuses_a_newer_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    SqliteDataPlane(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    with pytest.raises(InvalidStateError, match="schema version 2"):
        SqliteDataPlane(path)


def test_snapshot_is_one_self_contained_file(db: SqliteDataPlane, tmp_path: Path) -> None:
    db.put("a", {"k": make_row(1)})
    db.snapshot(tmp_path / "snap")
    assert sorted(p.name for p in (tmp_path / "snap").iterdir()) == [SNAPSHOT_FILE]
    conn = sqlite3.connect(f"file:{tmp_path / 'snap' / SNAPSHOT_FILE}?mode=ro", uri=True)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


@pytest.mark.parametrize("direction", ["memory->sqlite", "sqlite->memory"])
def test_backends_restore_each_others_snapshots(tmp_path: Path, direction: str) -> None:
    sqlite_store = SqliteDataPlane(tmp_path / "store.sqlite3")
    memory_store = MemoryDataPlane()
    source, target = (
        (memory_store, sqlite_store)
        if direction == "memory->sqlite"
        else (sqlite_store, memory_store)
    )
    rows = {f"k{i}": make_row(i, calls=[i, (i, "x")]) for i in range(6)}
    source.put("staging", rows)
    source.put("canonical", {"g_g0": make_row(99)})
    source.snapshot(tmp_path / "snap")
    target.put("staging", {"stale": make_row(50)})
    target.restore(tmp_path / "snap")
    assert target.keys("staging") == sorted(rows)
    assert target.keys("canonical") == ["g_g0"]
    for key, got in zip(sorted(rows), target.get("staging", sorted(rows)), strict=True):
        assert_rows_equal(got, rows[key])
    sqlite_store.close()


# --- leftovers of killed snapshots are removed by the next snapshot or open


_KILLED_SNAPSHOT = """
import os, signal, sys
from pathlib import Path
from rollout_recovery._durable import publish_directory

def fill(temporary):
    (temporary / "rows.sqlite3").write_bytes(b"x" * 1_000_000)
    os.kill(os.getpid(), signal.SIGKILL)  # killed mid-snapshot

publish_directory(Path(sys.argv[1]), fill)
"""


def _killed_snapshot(target: Path) -> Path:
    """Run a snapshot in a process that is SIGKILLed while filling; return its leftover."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _KILLED_SNAPSHOT, str(target)], timeout=120)
    assert result.returncode == -9
    (leftover,) = [p for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.tmp-")]
    assert (leftover / "rows.sqlite3").stat().st_size == 1_000_000
    return leftover


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_later_snapshot_removes_the_leftover_of_a_killed_one(
    tmp_path: Path, backend: str
) -> None:
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    leftover = _killed_snapshot(snapshots / "step-1")
    # Not ours to remove: another host's temporary, and a live process's.
    foreign = snapshots / ".step-1.tmp-1@some-other-host-abcd1234"
    foreign.mkdir()
    import os
    import re
    import socket

    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())
    live = snapshots / f".step-1.tmp-{os.getppid()}@{host}-abcd1234"
    live.mkdir()
    store: DataPlane = (
        MemoryDataPlane() if backend == "memory" else SqliteDataPlane(tmp_path / "store.db")
    )
    store.put("a", {"k": make_row(1)})
    store.snapshot(snapshots / "step-2")
    store.close()
    assert not leftover.exists()
    assert foreign.exists() and live.exists()
    assert sorted(p.name for p in snapshots.iterdir() if not p.name.startswith(".")) == ["step-2"]


def test_opening_a_store_removes_leftovers_next_to_it(tmp_path: Path) -> None:
    leftover = _killed_snapshot(tmp_path / "snap")
    SqliteDataPlane(tmp_path / "store.db").close()
    assert not leftover.exists()


# --- lock contention is its own retryable error, naming the holder


_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(120)
"""


def test_lock_contention_is_a_retryable_error_naming_the_holder(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from rollout_recovery.errors import DataPlaneBusyError, RolloutRecoveryError

    path = tmp_path / "store.db"
    store = SqliteDataPlane(path, busy_timeout=0.2)
    store.put("a", {"k": make_row(1)})
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(DataPlaneBusyError) as caught:
            store.put("a", {"k2": make_row(2)})
        error = caught.value
        assert isinstance(error, RolloutRecoveryError) and error.retryable is True
        assert error.operation == "put" and error.file == str(path)
        if os.path.exists("/proc/locks"):
            assert error.holder_pids == [holder.pid]
            assert f"held by pid {holder.pid}" in str(error)
        assert store.keys("a") == ["k"]  # reads are not blocked in WAL mode
        with pytest.raises(DataPlaneBusyError) as at_open:
            SqliteDataPlane(path, busy_timeout=0.2)
        assert at_open.value.operation == "open"
    finally:
        holder.kill()
        holder.wait()
    store.put("a", {"k2": make_row(2)})  # the same call succeeds once the lock is gone
    assert store.keys("a") == ["k", "k2"]
    store.close()
