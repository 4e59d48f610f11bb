"""One data-plane shard: a durable SQLite store on its node's disk, served by a Ray actor.

The actor class is plain Python (``DataShard``); :mod:`._sharded_plane` wraps it with
``ray.remote`` (``max_restarts=0``: a dead shard is restarted by the driver, on the same
file, so its rows come back from disk). A put returns only after SQLite committed it with
an fsync, so a put that returned survives a SIGKILL of the shard's process.

Fencing. A generation actor declared dead may still have a put in flight (Ray can report
a task as failed although it ran). The driver fences its writer id on every shard before
it redispatches the work, and a fenced writer's later puts are refused. Fences are stored
in the shard's own file, so a restarted shard keeps refusing them. Whatever slipped in
before the fence is an orphan staged row: no sealed receipt names it (the attempt was
abandoned), so finalization never reads it and the restore inventory pass deletes it.
Workers may only write staging rows; canonical rows are the controller's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import ray

from ..capture import CaptureWriter
from ..dataplane import Row, SqliteDataPlane
from ..errors import DataPlaneClosedError, FencedWriterError, InvalidArgumentError

__all__ = ["FENCE_PARTITION", "DataShard"]

#: Where a shard keeps its fences (one empty row per fenced writer id).
FENCE_PARTITION = "rollout_recovery_fences"


def _empty_row() -> Row:
    return Row(
        token_ids=np.zeros(0, np.int32),
        token_mask=np.zeros(0, np.float32),
        logprobs=np.zeros(0, np.float32),
    )


class DataShard:
    """The shard actor's body: the DataPlane calls plus fences, on one SQLite file."""

    def __init__(self, path: str) -> None:
        self._path = ""
        self._store: SqliteDataPlane | None = None
        self._fenced: set[str] = set()
        self.open(path)

    def open(self, path: str) -> None:
        """Serve the store at ``path`` (a driver adopting a running shard names its file)."""
        if path == self._path and self._store is not None:
            return
        if self._store is not None:
            self._open_store.close()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._store = SqliteDataPlane(path)
        self._path = path
        self._fenced = set(self._open_store.keys(FENCE_PARTITION))

    @property
    def _open_store(self) -> SqliteDataPlane:
        if self._store is None:
            raise DataPlaneClosedError(f"data shard {self._path} is closed")
        return self._store

    def ping(self) -> int:
        return os.getpid()

    def node(self) -> str:
        """The Ray node this shard's file lives on."""
        node_id: str = ray.get_runtime_context().get_node_id()
        return node_id

    def put(self, partition: str, rows: Mapping[str, Row], writer: str | None) -> None:
        if writer is not None:
            if writer in self._fenced:
                raise FencedWriterError(writer, partition)
            if partition != CaptureWriter.staging_partition:
                raise InvalidArgumentError(
                    f"worker {writer!r} may only stage rows, not write {partition!r}",
                    path="$.partition",
                )
        self._open_store.put(partition, rows)

    def get(self, partition: str, keys: Sequence[str]) -> list[Row]:
        return self._open_store.get(partition, keys)

    def clear(self, partition: str, keys: Sequence[str]) -> None:
        self._open_store.clear(partition, keys)

    def keys(self, partition: str) -> list[str]:
        return self._open_store.keys(partition)

    def fence(self, writer: str) -> None:
        """Refuse every later put of ``writer``, durably."""
        self._open_store.put(FENCE_PARTITION, {writer: _empty_row()})
        self._fenced.add(writer)

    def snapshot(self, directory: str) -> None:
        self._open_store.snapshot(Path(directory))

    def restore(self, directory: str) -> None:
        self._open_store.restore(Path(directory))
        self._fenced = set(self._open_store.keys(FENCE_PARTITION))

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
