"""The ``DataPlane`` protocol served by Ray actors, sharded by prompt group.

``RayShardedDataPlane`` is both the driver's store (the controller's canonical puts,
clears, the restore inventory pass, checkpoints through ``DeferredDeletionDataPlane``) and,
attached under a writer id, the store a generation actor stages into from any node.
Shards are named actors (``{prefix}-shard-{i}``), each a :class:`~._shard.DataShard` on
``{directory}/shard-{i}.sqlite``.

Calls and failures. Arguments are checked here first, so a refused call is refused the
same way as by the embedded store and never reaches a shard; an error a shard raises is
re-raised as itself. A call whose shard died (``RayActorError``) is retried once on the
shard's successor: the driver restarts the shard on the same file (its rows come back
from disk), a worker looks the name up again until the driver has. Retrying is safe:
a put replaces, a clear of a missing key is no error, reads change nothing.

A put spanning several shards is all or nothing per shard only; the controller never
makes one (a group's rows share a shard, see :mod:`._routing`).
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._checks import check_keys_argument, check_partition
from .._cut import MutationCut
from .._lifecycle import Resource
from ..dataplane import Row, SqliteDataPlane
from ..errors import DataPlaneClosedError, LivenessError, MissingRowError
from ._routing import shard_of
from ._shard import DataShard

__all__ = ["RayShardedDataPlane", "ShardDirectory"]

#: How long a call waits for a dead shard's successor before it gives up.
SUCCESSOR_WAIT_S = 60.0


@dataclass(frozen=True, slots=True)
class ShardDirectory:
    """What a process needs to reach the shards: their names, namespace and files."""

    prefix: str
    namespace: str
    directory: str
    shards: int
    cpus_per_shard: float = 0.25

    def name(self, index: int) -> str:
        return f"{self.prefix}-shard-{index}"

    def path(self, index: int) -> str:
        return str(Path(self.directory) / f"shard-{index}.sqlite")


# One remote class per process: Ray exports a class once per wrapper, not per actor.
_REMOTE_SHARD: Any = ray.remote(max_restarts=0, max_task_retries=0)(DataShard)


def _unwrap(error: RayTaskError) -> BaseException:
    # Ray wraps an exception raised in an actor; the caller should see the original.
    cause = error.cause
    return cause if isinstance(cause, BaseException) else error


def _fresh(row: Row) -> Row:
    return Row(
        token_ids=np.array(row.token_ids),
        token_mask=np.array(row.token_mask),
        logprobs=np.array(row.logprobs),
        metadata=row.metadata,
    )


class RayShardedDataPlane(Resource):
    """See the module docstring. ``writer`` is None for the driver (which owns the shards
    and restarts them), a worker id for a generation actor (fenced when it is declared
    dead). ``close()`` ends this plane's calls; the driver's ``close(stop_shards=True)``
    also stops the shard actors (their files stay)."""

    def __init__(self, layout: ShardDirectory, *, writer: str | None = None) -> None:
        self._layout = layout
        self._writer = writer
        self._handles: dict[int, Any] = {}
        self._nodes: dict[int, str] = {}
        # The controller's loop and the health loop's thread both replace dead shards.
        self._lock = threading.RLock()
        self._closed = False
        self.restarts = 0

    # -- shards ------------------------------------------------------------------------------

    @classmethod
    def start(cls, layout: ShardDirectory) -> RayShardedDataPlane:
        """The driver's store: start (or adopt, after a driver restart) every shard."""
        Path(layout.directory).mkdir(parents=True, exist_ok=True)
        plane = cls(layout)
        for index in range(layout.shards):
            plane._handles[index] = plane._create(index)
        return plane

    @property
    def layout(self) -> ShardDirectory:
        return self._layout

    def _create(self, index: int) -> Any:
        """Start shard ``index`` on its file, or adopt the running actor of that name."""
        deadline = time.monotonic() + SUCCESSOR_WAIT_S
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LivenessError(f"data shard {index} to start", SUCCESSOR_WAIT_S)
            try:
                # A shard's rows are on its node's disk: its first start spreads shards
                # over the nodes, every restart goes back to that node (and fails, rather
                # than opening an empty store elsewhere, when the node is gone).
                node = self._nodes.get(index)
                strategy: Any = (
                    "SPREAD"
                    if node is None
                    else NodeAffinitySchedulingStrategy(node_id=node, soft=False)
                )
                handle = _REMOTE_SHARD.options(
                    name=self._layout.name(index),
                    namespace=self._layout.namespace,
                    num_cpus=self._layout.cpus_per_shard,
                    get_if_exists=True,
                    scheduling_strategy=strategy,
                ).remote(self._layout.path(index))
                # An adopted (already running) shard may serve another file: name ours.
                ray.get(handle.open.remote(self._layout.path(index)), timeout=remaining)
                if self._writer is None:
                    self._nodes[index] = ray.get(handle.node.remote(), timeout=remaining)
                return handle
            except (RayActorError, ValueError, GetTimeoutError):
                # A dead actor's name is released a moment after its death.
                time.sleep(0.05)

    def _handle(self, index: int) -> Any:
        if self._closed:
            raise DataPlaneClosedError("the Ray data plane is closed")
        with self._lock:
            handle = self._handles.get(index)
            if handle is None:
                handle = ray.get_actor(self._layout.name(index), namespace=self._layout.namespace)
                self._handles[index] = handle
            return handle

    def restart_shard(self, index: int) -> None:
        """Replace shard ``index`` (dead or not) by a new actor on the same file."""
        with self._lock:
            self._restart_locked(index)

    def _restart_locked(self, index: int) -> None:
        if self._closed:
            return  # shut down while a restart was pending: start nothing new
        old = self._handles.pop(index, None)
        if old is not None:
            ray.kill(old, no_restart=True)
        self._handles[index] = self._create(index)
        self.restarts += 1

    def _pings(self, timeout: float) -> dict[int, Any]:
        """Shards that did not answer a ping within ``timeout``, with the handle pinged."""
        handles = {index: self._handle(index) for index in range(self._layout.shards)}
        refs = {index: handle.ping.remote() for index, handle in handles.items()}
        dead = {}
        for index, ref in refs.items():
            try:
                ray.get(ref, timeout=timeout)
            except (RayActorError, GetTimeoutError):
                dead[index] = handles[index]
        return dead

    def ping_shards(self, timeout: float) -> list[int]:
        """The indexes of shards that did not answer a ping within ``timeout``."""
        return sorted(self._pings(timeout))

    def revive_dead_shards(self, timeout: float) -> list[int]:
        """Ping every shard and restart the ones that did not answer (driver only)."""
        dead = self._pings(timeout)
        for index, handle in dead.items():
            self._successor(index, handle)
        return sorted(dead)

    def fence(self, writer: str) -> None:
        """Refuse every later put of ``writer`` on every shard (driver only)."""
        for index in range(self._layout.shards):
            self._call(index, "fence", writer)

    def shard_pid(self, index: int) -> int:
        pid: int = ray.get(self._handle(index).ping.remote())
        return pid

    def _call(self, index: int, method: str, *args: Any) -> Any:
        for attempt in (0, 1):
            handle = self._handle(index)
            try:
                return ray.get(getattr(handle, method).remote(*args))
            except RayTaskError as error:
                raise _unwrap(error) from None
            except RayActorError:
                if attempt:
                    raise
                self._successor(index, handle)
        raise AssertionError("unreachable")

    def _successor(self, index: int, failed: Any) -> None:
        """Replace the ``failed`` handle of shard ``index``, unless another thread (the
        health loop, a concurrent call) already has: one death, one restart."""
        with self._lock:
            current = self._handles.get(index)
            if current is None or current is not failed:
                return
            if self._writer is None:
                self._restart_locked(index)
                return
            del self._handles[index]
        # A worker waits for the driver to restart the shard, then uses the new actor.
        deadline = time.monotonic() + SUCCESSOR_WAIT_S
        while time.monotonic() < deadline:
            try:
                handle = ray.get_actor(self._layout.name(index), namespace=self._layout.namespace)
                ray.get(handle.ping.remote(), timeout=5.0)
                with self._lock:
                    self._handles.setdefault(index, handle)
                return
            except (ValueError, RayActorError, GetTimeoutError):
                time.sleep(0.1)
        raise LivenessError(f"a successor of data shard {index}", SUCCESSOR_WAIT_S)

    def _by_shard(self, keys: Iterable[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        for key in keys:
            groups.setdefault(shard_of(key, self._layout.shards), []).append(key)
        return groups

    # -- DataPlane -------------------------------------------------------------------------

    def put(
        self, partition: str, rows: Mapping[str, Row], *, cut: MutationCut | None = None
    ) -> None:
        if cut is not None:
            cut.require_live()
        check_partition(partition)
        keys = check_keys_argument(list(rows), operation="put")
        for index, shard_keys in sorted(self._by_shard(keys).items()):
            self._call(index, "put", partition, {k: rows[k] for k in shard_keys}, self._writer)

    def get(self, partition: str, keys: Sequence[str]) -> list[Row]:
        check_partition(partition)
        wanted = check_keys_argument(keys, operation="get")
        found: dict[str, Row] = {}
        missing: set[str] = set()
        for index, shard_keys in self._by_shard(dict.fromkeys(wanted)).items():
            try:
                rows = self._call(index, "get", partition, shard_keys)
            except MissingRowError as error:
                missing.update(error.keys)
                continue
            found.update(zip(shard_keys, rows, strict=True))
        if missing:
            # One error naming every missing key in request order, as a single store does.
            raise MissingRowError(partition, [k for k in dict.fromkeys(wanted) if k in missing])
        # Ray hands back read-only views of its object store: every caller gets its own
        # writable arrays, as from any store.
        return [_fresh(found[key]) for key in wanted]

    def clear(self, partition: str, keys: Iterable[str], *, cut: MutationCut | None = None) -> None:
        if cut is not None:
            cut.require_live()
        check_partition(partition)
        doomed = check_keys_argument(keys, operation="clear")
        for index, shard_keys in sorted(self._by_shard(doomed).items()):
            self._call(index, "clear", partition, shard_keys)

    def keys(self, partition: str) -> list[str]:
        check_partition(partition)
        found: list[str] = []
        for index in range(self._layout.shards):
            found.extend(self._call(index, "keys", partition))
        return sorted(found)

    def snapshot(self, directory: Path, *, cut: MutationCut | None = None) -> None:
        """One ordinary snapshot of every shard's rows (any backend can restore it)."""
        if cut is not None:
            cut.require_live()
        with tempfile.TemporaryDirectory(dir=self._layout.directory) as scratch:
            parts = [Path(scratch) / f"shard-{i}" for i in range(self._layout.shards)]
            for index, part in enumerate(parts):
                self._call(index, "snapshot", str(part))
            SqliteDataPlane.merge_snapshots(parts, Path(directory))

    def restore(self, directory: Path, *, cut: MutationCut | None = None) -> None:
        """Replace every shard's rows by the snapshot's, split by the routing; the
        snapshot is validated whole before any shard changes."""
        if cut is not None:
            cut.require_live()
        with tempfile.TemporaryDirectory(dir=self._layout.directory) as scratch:
            parts = [Path(scratch) / f"shard-{i}" for i in range(self._layout.shards)]
            SqliteDataPlane.split_snapshot(
                Path(directory), parts, lambda _partition, key: shard_of(key, self._layout.shards)
            )
            for index, part in enumerate(parts):
                self._call(index, "restore", str(part))

    def close(self, *, stop_shards: bool = False) -> None:
        """No call after this. ``stop_shards`` (the driver, at the job's end): stop every
        shard actor too (their files stay); a plane that other planes still use, such as a
        test's shared shards, is closed without. Closing again stops nothing new."""
        with self._lock:  # not while the health loop's thread restarts one
            self._closed = True
            if not stop_shards:
                return
            for index in range(self._layout.shards):
                handle = self._handles.pop(index, None)
                if handle is not None:
                    ray.kill(handle, no_restart=True)
