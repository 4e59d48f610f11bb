"""Helpers shared by the Ray tests."""

from __future__ import annotations

import itertools
from pathlib import Path

from rollout_recovery.cluster import ShardDirectory

_names = itertools.count()


def layout(directory: Path, shards: int = 3, prefix: str | None = None) -> ShardDirectory:
    """Shards under ``directory``, named ``prefix`` (default: a name no other test uses)."""
    return ShardDirectory(
        prefix=prefix or f"test-{next(_names)}",
        namespace="rollout-recovery-tests",
        directory=str(directory),
        shards=shards,
        cpus_per_shard=0.01,
    )
