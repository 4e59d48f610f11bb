"""The embedded default data plane: one SQLite file, durable on every returned ``put``.

Choices (DESIGN.md section 8, measured in ``benchmarks/bench_dataplane.py``):

- WAL journal with ``synchronous=FULL``: each ``put`` is one transaction whose commit
  fsyncs the WAL, so a row whose ``put`` returned survives a SIGKILL (and a power cut).
- One rowid table with a ``UNIQUE (partition, key)`` index, *not* the ``WITHOUT ROWID``
  table DESIGN.md section 8 first chose. A ``WITHOUT ROWID`` table is an index B-tree whose
  cells are whole rows, and SQLite loads a cell's entire overflowing payload to compare
  keys, so with 1.5 MB token rows every lookup reads megabytes and listing a partition's
  keys reads every blob. Measured on this machine with 64 rows of 131,072 tokens: get 268
  vs 1,464 rows/s, keys 1.8k vs 690k keys/s; with 100-token rows the two are within noise
  (put about 30k rows/s in batches of 1,000, get about 55k rows/s). The small index stays
  sorted by ``(partition, key)``, so a partition's keys are one contiguous, ordered range.
- Rows are stored in the shared compact form of :mod:`._codec` (raw little-endian array
  bytes, a msgspec layout and msgspec metadata); nothing is ever pickled.
- Thread safety: one connection guarded by one ``threading.Lock``. SQLite admits a single
  writer anyway, a lock makes ``restore`` and ``close`` trivially exclusive, and a
  connection per thread would leave connections of finished ``asyncio.to_thread`` workers
  open with no owner to close them. Decoding rows into arrays happens outside the lock.
- Snapshots use the SQLite backup API into a temporary directory that is fsynced and
  renamed; the snapshot file is switched to a rollback journal so it is one
  self-contained file. ``restore`` validates a snapshot completely (format, structure, every
  row's layout and metadata) before it replaces the content in a single transaction.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from .._cut import MutationCut
from .._durable import fsync_directory, publish_directory, remove_stale_temporaries
from .._lifecycle import Resource
from ..errors import (
    DataPlaneBusyError,
    DataPlaneClosedError,
    InvalidRowError,
    InvalidStateError,
    StorageFullError,
)
from ._codec import (
    EncodedRow,
    check_clear_arguments,
    check_key,
    check_keys_argument,
    check_mutation,
    check_partition,
    check_stored,
    encode_row,
    rows_in_order,
)
from ._protocol import Row

__all__ = [
    "SNAPSHOT_FILE",
    "SqliteDataPlane",
    "merge_snapshots",
    "read_snapshot",
    "split_snapshot",
    "write_snapshot",
]

#: The one file inside a snapshot directory; every backend writes and reads this format.
SNAPSHOT_FILE = "rows.sqlite3"

# "RRDP" in the database header marks our files, so opening some other SQLite database
# fails with a clear message instead of creating a table inside it.
_APPLICATION_ID = 0x52524450
_SCHEMA_VERSION = 1
_TABLE_SQL = (
    "CREATE TABLE rows ("
    "id INTEGER PRIMARY KEY, partition TEXT NOT NULL, key TEXT NOT NULL, "
    "layout BLOB NOT NULL, metadata BLOB NOT NULL, "
    "token_ids BLOB NOT NULL, token_mask BLOB NOT NULL, logprobs BLOB NOT NULL, "
    "UNIQUE (partition, key))"
)
_COLUMNS = "layout, token_ids, token_mask, logprobs, metadata"  # EncodedRow order
_INSERT_SQL = (
    f"INSERT OR REPLACE INTO rows (partition, key, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
# Large pages cut the per-page overhead of megabyte-sized token rows (overflow chains of
# 16 pages instead of 384 for a 131k-token row); see the benchmark. Only applies to new files.
_PAGE_SIZE = 65536
# Stay well below SQLite's bound-parameter limit in ``IN (...)`` lookups.
_LOOKUP_CHUNK = 500
# Reads of checkpointed pages come straight from the OS page cache instead of a pread copy
# per page; the mapping costs address space only.
_MMAP_SIZE = 1 << 30
# Checkpoint every 16 MiB of WAL (256 pages of 64 KiB) rather than SQLite's 1,000 pages, so
# freshly staged rows reach the memory-mapped main file soon. The bytes copied are the same.
_WAL_AUTOCHECKPOINT = 256
# Cap the WAL file left behind after a checkpoint; without it the file keeps its peak size.
_JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024


# SQLITE_BUSY and SQLITE_LOCKED (primary result codes): another connection holds the lock.
_BUSY_CODES = frozenset({5, 6})


def _is_busy(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _BUSY_CODES
    text = str(exc)
    return "database is locked" in text or "database table is locked" in text


def _lock_holders(path: Path) -> list[int]:
    """Processes holding a write lock on the store (its file or WAL index), if knowable.

    SQLite locks with POSIX advisory locks, which Linux lists in ``/proc/locks``; elsewhere
    (or if anything is unreadable) the answer is an empty list, meaning unknown.
    """
    wanted: set[tuple[str, int]] = set()
    for candidate in (path, path.with_name(path.name + "-shm")):
        try:
            info = os.stat(candidate)
        except OSError:
            continue
        device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}"
        wanted.add((device, info.st_ino))
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as handle:
            lines = handle.readlines()
    except OSError:
        return []
    holders: set[int] = set()
    for line in lines:
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 19447 fe:00:2146732 120 120"; waiters have a "->".
        if len(fields) < 6 or "->" in fields or fields[3] != "WRITE":
            continue
        device, _, inode = fields[5].rpartition(":")
        try:
            if (device, int(inode)) in wanted:
                holders.add(int(fields[4]))
        except ValueError:
            continue
    return sorted(holders)


def _busy_error(path: Path, operation: str, exc: BaseException) -> DataPlaneBusyError:
    holders = _lock_holders(path)
    if holders:
        own = os.getpid()
        named = ", ".join(f"{pid} (this process)" if pid == own else str(pid) for pid in holders)
        who = f"held by pid {named}"
    else:
        who = "the holder is unknown"
    return DataPlaneBusyError(
        f"data-plane store is locked by another connection ({who}); "
        f"{operation} waited its busy timeout and changed nothing; retry it ({exc})",
        file=str(path),
        operation=operation,
        holder_pids=holders,
    )


@contextmanager
def _busy_is_retryable(path: Path, operation: str) -> Iterator[None]:
    """Turn SQLite's "database is locked" into :class:`DataPlaneBusyError`."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if _is_busy(exc):
            raise _busy_error(path, operation, exc) from exc
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            what = f"writing the data plane ({operation})"
            raise StorageFullError(what, filename=str(path)) from exc
        raise


def _uri(path: Path, *, read_only: bool) -> str:
    suffix = "?mode=ro" if read_only else ""
    return f"file:{quote(str(path.resolve()))}{suffix}"


def _check_format(conn: sqlite3.Connection, schema: str, where: str) -> None:
    """Refuse a database that is not a data-plane store of this version."""
    app_id = conn.execute(f"PRAGMA {schema}.application_id").fetchone()[0]
    version = conn.execute(f"PRAGMA {schema}.user_version").fetchone()[0]
    if app_id != _APPLICATION_ID:
        raise InvalidStateError(
            "not a rollout-recovery data-plane store "
            f"(application_id={app_id:#x}, expected {_APPLICATION_ID:#x})",
            file=where,
        )
    if version != _SCHEMA_VERSION:
        raise InvalidStateError(
            f"data-plane schema version {version}; this reader knows {_SCHEMA_VERSION}",
            file=where,
        )
    found = conn.execute(
        f"SELECT sql FROM {schema}.sqlite_schema WHERE type = 'table' AND name = 'rows'"
    ).fetchone()
    if found is None or found[0] != _TABLE_SQL:
        raise InvalidStateError("no data-plane 'rows' table of the expected shape", file=where)


def _create_schema(conn: sqlite3.Connection) -> None:
    conn.execute(_TABLE_SQL)
    conn.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")


def _validate_rows(conn: sqlite3.Connection, schema: str, where: str) -> int:
    """Check structure and every stored row's layout and metadata without loading arrays."""
    check = conn.execute(f"PRAGMA {schema}.quick_check").fetchall()
    if check != [("ok",)]:
        problems = [str(line[0]) for line in check[:10]]
        raise InvalidStateError(f"data-plane store is corrupt: {problems}", file=where)
    count = 0
    # length() of a BLOB reads the record header only, not the overflow pages.
    cursor = conn.execute(
        "SELECT partition, key, layout, length(token_ids), length(token_mask), "
        f"length(logprobs), metadata FROM {schema}.rows"
    )
    for partition, key, layout, n_ids, n_mask, n_logprobs, metadata in cursor:
        try:
            check_partition(partition)
            check_key(key)
            if not isinstance(layout, bytes) or not isinstance(metadata, bytes):
                raise InvalidRowError(
                    f"stored row {key!r} has non-BLOB layout or metadata", key=key
                )
            check_stored(key, layout, (n_ids, n_mask, n_logprobs), metadata)
        except InvalidRowError as exc:
            raise InvalidStateError(
                f"partition {partition!r}: {exc}",
                path=f"$.rows[{partition!r}][{key!r}]",
                file=where,
            ) from None
        count += 1
    return count


def _open_snapshot(directory: Path) -> tuple[Path, str]:
    path = Path(directory) / SNAPSHOT_FILE
    if not path.is_file():
        raise InvalidStateError(f"snapshot has no {SNAPSHOT_FILE}", file=str(directory))
    return path, str(path)


def write_snapshot(directory: Path, rows: Iterable[tuple[str, str, EncodedRow]]) -> None:
    """Publish ``rows`` as a snapshot directory (used by backends without the backup API)."""

    def fill(temporary: Path) -> None:
        conn = sqlite3.connect(
            _uri(temporary / SNAPSHOT_FILE, read_only=False), uri=True, isolation_level=None
        )
        try:
            conn.execute(f"PRAGMA page_size = {_PAGE_SIZE}")
            conn.execute("BEGIN IMMEDIATE")
            _create_schema(conn)
            conn.executemany(_INSERT_SQL, ((p, k, *row) for p, k, row in rows))
            conn.execute("COMMIT")
        finally:
            conn.close()

    publish_directory(Path(directory), fill)


def read_snapshot(directory: Path) -> list[tuple[str, str, EncodedRow]]:
    """Load and fully validate a snapshot; raises :class:`InvalidStateError`."""
    path, where = _open_snapshot(directory)
    try:
        conn = sqlite3.connect(_uri(path, read_only=True), uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise InvalidStateError(f"cannot open snapshot: {exc}", file=where) from None
    try:
        conn.execute("BEGIN")  # one read transaction: validation and load see the same data
        _check_format(conn, "main", where)
        _validate_rows(conn, "main", where)
        loaded = [
            (partition, key, EncodedRow(*blobs))
            for partition, key, *blobs in conn.execute(
                f"SELECT partition, key, {_COLUMNS} FROM rows"
            )
        ]
        conn.execute("COMMIT")
        return loaded
    except sqlite3.DatabaseError as exc:
        raise InvalidStateError(f"snapshot is unreadable: {exc}", file=where) from None
    finally:
        conn.close()


def merge_snapshots(sources: Sequence[Path], target: Path) -> None:
    """Publish one snapshot at ``target`` holding every row of the ``sources`` snapshots
    (which must not share a key within a partition; the later one wins if they do)."""
    rows: dict[tuple[str, str], EncodedRow] = {}
    for source in sources:
        for partition, key, row in read_snapshot(source):
            rows[(partition, key)] = row
    write_snapshot(target, ((p, k, row) for (p, k), row in sorted(rows.items())))


def split_snapshot(source: Path, targets: Sequence[Path], route: Callable[[str, str], int]) -> None:
    """Publish one snapshot per target, ``targets[route(partition, key)]`` getting each row
    of ``source`` (validated first: a bad snapshot publishes nothing)."""
    buckets: list[list[tuple[str, str, EncodedRow]]] = [[] for _ in targets]
    for partition, key, row in read_snapshot(source):
        buckets[route(partition, key)].append((partition, key, row))
    for target, bucket in zip(targets, buckets, strict=True):
        write_snapshot(target, bucket)


class SqliteDataPlane(Resource):
    """The :class:`~rollout_recovery.dataplane.DataPlane` on one SQLite file.

    ``path`` is the database file (created if missing; its ``-wal`` and ``-shm`` files sit
    next to it). Safe to call from several threads, for example through
    ``asyncio.to_thread``. Use one instance per file per process.

    When another connection (another process) holds the store's lock for longer than
    ``busy_timeout`` seconds, the call (``__init__`` included) raises
    :class:`~rollout_recovery.errors.DataPlaneBusyError`, which is retryable and names the
    holding process when the OS can tell; nothing was changed.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 5.0) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        where = str(self._path)
        created = not self._path.exists()
        try:
            conn = sqlite3.connect(
                _uri(self._path, read_only=False),
                uri=True,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # guarded by self._lock instead
                timeout=busy_timeout,
            )
        except sqlite3.Error as exc:
            raise InvalidStateError(f"cannot open data-plane store: {exc}", file=where) from None
        try:
            conn.execute(f"PRAGMA page_size = {_PAGE_SIZE}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise InvalidStateError(f"cannot use WAL (journal_mode={mode})", file=where)
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute(f"PRAGMA journal_size_limit = {_JOURNAL_SIZE_LIMIT}")
            conn.execute(f"PRAGMA mmap_size = {_MMAP_SIZE}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {_WAL_AUTOCHECKPOINT}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                empty = conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0] == 0
                if empty and conn.execute("PRAGMA application_id").fetchone()[0] == 0:
                    _create_schema(conn)
                else:
                    _check_format(conn, "main", where)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.DatabaseError as exc:
            conn.close()
            if _is_busy(exc):
                raise _busy_error(self._path, "open", exc) from None
            raise InvalidStateError(f"cannot open data-plane store: {exc}", file=where) from None
        except BaseException:
            conn.close()
            raise
        # Snapshots killed mid-write leave temporary directories; remove the dead ones.
        remove_stale_temporaries(self._path.parent)
        if created:
            # The new file's directory entry must be durable too, or a power cut could lose
            # the whole store while its rows' puts had returned.
            fsync_directory(self._path.parent)
        self._conn = conn

    @property
    def path(self) -> Path:
        return self._path

    def __repr__(self) -> str:
        state = "closed" if self._conn is None else "open"
        return f"SqliteDataPlane({str(self._path)!r}, {state})"

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise DataPlaneClosedError(f"data-plane store {str(self._path)!r} is closed")
        return self._conn

    @contextmanager
    def _write(self, operation: str) -> Iterator[sqlite3.Connection]:
        """One write transaction; the caller holds the lock. Rolled back on any error, so a
        failed call leaves the store as it was."""
        conn = self._connection()
        with _busy_is_retryable(self._path, operation):
            conn.execute("BEGIN IMMEDIATE")
        try:
            # A full disk can surface at any statement of the transaction, not just COMMIT.
            with _busy_is_retryable(self._path, operation):
                yield conn
                conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def put(
        self, partition: str, rows: Mapping[str, Row], *, cut: MutationCut | None = None
    ) -> None:
        check_mutation(partition, cut)
        # Validate every row before the transaction starts; encoding borrows the caller's
        # arrays and sqlite3 copies them on bind.
        params = [(partition, key, *encode_row(check_key(key), row)) for key, row in rows.items()]
        if not params:
            return
        with self._lock, self._write("put") as conn:
            conn.executemany(_INSERT_SQL, params)

    def get(self, partition: str, keys: Sequence[str]) -> list[Row]:
        check_partition(partition)
        wanted = check_keys_argument(keys, operation="get")
        unique = list(dict.fromkeys(wanted))
        found: dict[str, EncodedRow] = {}
        with self._lock, _busy_is_retryable(self._path, "get"):
            conn = self._connection()
            conn.execute("BEGIN")  # one read snapshot across all chunks
            try:
                for start in range(0, len(unique), _LOOKUP_CHUNK):
                    chunk = unique[start : start + _LOOKUP_CHUNK]
                    marks = ", ".join("?" * len(chunk))
                    cursor = conn.execute(
                        f"SELECT key, {_COLUMNS} FROM rows "
                        f"WHERE partition = ? AND key IN ({marks})",
                        (partition, *chunk),
                    )
                    for key, *blobs in cursor:
                        found[key] = EncodedRow(*blobs)
            finally:
                conn.execute("COMMIT")
        return rows_in_order(partition, wanted, found)

    def clear(self, partition: str, keys: Iterable[str], *, cut: MutationCut | None = None) -> None:
        doomed = check_clear_arguments(partition, keys, cut)
        if not doomed:
            return
        with self._lock, self._write("clear") as conn:
            conn.executemany(
                "DELETE FROM rows WHERE partition = ? AND key = ?",
                ((partition, key) for key in doomed),
            )

    def keys(self, partition: str) -> list[str]:
        check_partition(partition)
        with self._lock, _busy_is_retryable(self._path, "keys"):
            cursor = self._connection().execute(
                "SELECT key FROM rows WHERE partition = ? ORDER BY key", (partition,)
            )
            return [key for (key,) in cursor]

    # A sharded data plane (one store per shard, as the Ray backend runs them) keeps the
    # contract that every backend reads every backend's snapshots: its snapshot is the
    # union of its shards' snapshots in this one format, and restoring one splits the rows
    # back onto the shards by the store's own routing.
    merge_snapshots = staticmethod(merge_snapshots)
    split_snapshot = staticmethod(split_snapshot)

    def snapshot(self, directory: Path, *, cut: MutationCut | None = None) -> None:
        if cut is not None:
            cut.require_live()

        def fill(temporary: Path) -> None:
            target = sqlite3.connect(
                _uri(temporary / SNAPSHOT_FILE, read_only=False), uri=True, isolation_level=None
            )
            try:
                self._connection().backup(target)
                # The copied header says WAL; a rollback journal makes the snapshot one
                # self-contained file that can be opened read-only.
                mode = target.execute("PRAGMA journal_mode = DELETE").fetchone()[0]
                if mode != "delete":
                    raise InvalidStateError(f"snapshot kept journal_mode={mode}")
            finally:
                target.close()

        with self._lock, _busy_is_retryable(self._path, "snapshot"):
            self._connection()
            publish_directory(Path(directory), fill)

    def restore(self, directory: Path, *, cut: MutationCut | None = None) -> None:
        if cut is not None:
            cut.require_live()
        path, where = _open_snapshot(directory)
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("ATTACH DATABASE ? AS snap", (_uri(path, read_only=True),))
            except sqlite3.Error as exc:
                raise InvalidStateError(f"cannot open snapshot: {exc}", file=where) from None
            try:
                with self._write("restore"):
                    # Validation runs inside the write transaction, so the content we check
                    # is the content we copy.
                    _check_format(conn, "snap", where)
                    _validate_rows(conn, "snap", where)
                    conn.execute("DELETE FROM main.rows")
                    conn.execute(
                        f"INSERT INTO main.rows (partition, key, {_COLUMNS}) "
                        f"SELECT partition, key, {_COLUMNS} FROM snap.rows"
                    )
            except sqlite3.DatabaseError as exc:
                raise InvalidStateError(f"snapshot is unreadable: {exc}", file=where) from None
            finally:
                conn.execute("DETACH DATABASE snap")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
