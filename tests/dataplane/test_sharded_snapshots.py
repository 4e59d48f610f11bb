"""A sharded store's snapshot is its shards' snapshots merged into the one format every
backend reads, and restoring one splits it back by the store's routing (the Ray data
plane's snapshot and restore; checked here without Ray)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rollout_recovery.dataplane import MemoryDataPlane, Row, SqliteDataPlane


def _row(n: int) -> Row:
    return Row(
        token_ids=np.arange(n, dtype=np.int32),
        token_mask=np.ones(n, np.float32),
        logprobs=np.zeros(n, np.float32),
    )


def test_merge_then_split_gives_each_shard_back_its_rows(tmp_path: Path) -> None:
    shards = [MemoryDataPlane(), MemoryDataPlane()]
    shards[0].put("staging", {"a/c0": _row(1), "a/c1": _row(2)})
    shards[1].put("staging", {"b/c0": _row(3)})
    shards[1].put("canonical", {"b/0": _row(4)})
    parts = [tmp_path / f"shard-{i}" for i in range(2)]
    for shard, part in zip(shards, parts, strict=True):
        shard.snapshot(part)

    SqliteDataPlane.merge_snapshots(parts, tmp_path / "merged")
    whole = MemoryDataPlane()
    whole.restore(tmp_path / "merged")
    assert whole.keys("staging") == ["a/c0", "a/c1", "b/c0"]
    assert whole.keys("canonical") == ["b/0"]

    targets = [tmp_path / f"split-{i}" for i in range(2)]
    SqliteDataPlane.split_snapshot(
        tmp_path / "merged", targets, lambda _partition, key: 0 if key.startswith("a/") else 1
    )
    back = [MemoryDataPlane(), MemoryDataPlane()]
    for store, target in zip(back, targets, strict=True):
        store.restore(target)
    assert back[0].keys("staging") == ["a/c0", "a/c1"] and back[0].keys("canonical") == []
    assert back[1].keys("staging") == ["b/c0"] and back[1].keys("canonical") == ["b/0"]
    assert len(back[1].get("canonical", ["b/0"])[0].token_ids) == 4
