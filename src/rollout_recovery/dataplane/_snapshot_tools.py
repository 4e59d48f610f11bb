"""Snapshots of sharded stores: one shard per store, one snapshot format for all.

A sharded data plane (one store per shard, as the Ray backend runs them) keeps the
contract that every backend reads every backend's snapshots: its snapshot is the union of
its shards' snapshots in the ordinary single-file format, and restoring one splits the
rows back onto the shards by the same routing the store uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ._codec import EncodedRow
from ._sqlite import read_snapshot, write_snapshot

__all__ = ["merge_snapshots", "split_snapshot"]


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
