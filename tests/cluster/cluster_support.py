"""Helpers shared by the Ray tests."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError

from rollout_recovery.cluster._sharded_plane import ShardDirectory

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


def kill_and_await_death(handle: Any) -> None:
    """``ray.kill`` the actor and return once it is dead: the kill is asynchronous, and a
    test that goes on at once may still be answered by the doomed actor."""
    ray.kill(handle, no_restart=True)
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        try:
            ray.get(handle.ping.remote(), timeout=5.0)
        except ActorDiedError:
            return
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            continue
    raise AssertionError("a killed actor still answered after 60 s")
