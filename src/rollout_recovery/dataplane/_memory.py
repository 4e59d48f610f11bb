"""A data plane in process memory: for tests, demos and the simulated environment.

Rows are kept in the stored form of :mod:`._codec` (owned bytes), so a caller can never
alias stored data: ``put`` copies the arrays in, ``get`` builds fresh arrays out, and
metadata round-trips exactly as it would through SQLite (tuples come back as lists).
Snapshots use the SQLite snapshot format, so either backend restores the other's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .._cut import MutationCut
from .._lifecycle import Resource
from ..errors import DataPlaneClosedError
from ._codec import (
    EncodedRow,
    check_clear_arguments,
    check_key,
    check_keys_argument,
    check_mutation,
    check_partition,
    encode_row,
    rows_in_order,
)
from ._protocol import Row
from ._sqlite import read_snapshot, write_snapshot

__all__ = ["MemoryDataPlane"]


class MemoryDataPlane(Resource):
    """The :class:`~rollout_recovery.dataplane.DataPlane` in a dict; not durable.

    Thread-safe through one lock, like :class:`~rollout_recovery.dataplane.SqliteDataPlane`,
    so the two are interchangeable under ``asyncio.to_thread``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[str, dict[str, EncodedRow]] = {}
        self._closed = False

    def __repr__(self) -> str:
        sizes = {name: len(rows) for name, rows in sorted(self._partitions.items())}
        return f"MemoryDataPlane({sizes})"

    def _require_open(self) -> None:
        if self._closed:
            raise DataPlaneClosedError("memory data-plane store is closed")

    def put(
        self, partition: str, rows: Mapping[str, Row], *, cut: MutationCut | None = None
    ) -> None:
        check_mutation(partition, cut)
        # Encode (and so validate) everything first: a refused put stores nothing.
        encoded = {check_key(key): encode_row(key, row).owned() for key, row in rows.items()}
        with self._lock:
            self._require_open()
            if encoded:
                self._partitions.setdefault(partition, {}).update(encoded)

    def get(self, partition: str, keys: Sequence[str]) -> list[Row]:
        check_partition(partition)
        wanted = check_keys_argument(keys, operation="get")
        with self._lock:
            self._require_open()
            stored = self._partitions.get(partition, {})
            found = {key: stored[key] for key in wanted if key in stored}
        return rows_in_order(partition, wanted, found)

    def clear(self, partition: str, keys: Iterable[str], *, cut: MutationCut | None = None) -> None:
        doomed = check_clear_arguments(partition, keys, cut)
        with self._lock:
            self._require_open()
            stored = self._partitions.get(partition)
            if stored is None:
                return
            for key in doomed:
                stored.pop(key, None)
            if not stored:
                del self._partitions[partition]

    def keys(self, partition: str) -> list[str]:
        check_partition(partition)
        with self._lock:
            self._require_open()
            return sorted(self._partitions.get(partition, {}))

    def snapshot(self, directory: Path, *, cut: MutationCut | None = None) -> None:
        if cut is not None:
            cut.require_live()
        with self._lock:
            self._require_open()
            rows = [
                (partition, key, row)
                for partition, stored in self._partitions.items()
                for key, row in stored.items()
            ]
        # Stored bytes are immutable, so the file is written outside the lock.
        write_snapshot(Path(directory), rows)

    def restore(self, directory: Path, *, cut: MutationCut | None = None) -> None:
        if cut is not None:
            cut.require_live()
        # Fully validated before anything is replaced: a refused restore changes nothing.
        loaded = read_snapshot(Path(directory))
        partitions: dict[str, dict[str, EncodedRow]] = {}
        for partition, key, row in loaded:
            partitions.setdefault(partition, {})[key] = row
        with self._lock:
            self._require_open()
            self._partitions = partitions

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._partitions = {}
