"""Helpers shared by the Ray tests."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError

from rollout_recovery._workers import WorkerHealth
from rollout_recovery.cluster import RayConfig
from rollout_recovery.cluster._pool import ActorStats, RayGenerationBackend, _Actor
from rollout_recovery.cluster._sharded_plane import ShardDirectory
from rollout_recovery.policy import NumpyGRPOTrainer, PolicySnapshot

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


def pool_without_ray(no_actor_wait_s: float) -> tuple[RayGenerationBackend, PolicySnapshot]:
    """A Ray actor pool that never creates an actor (no cluster is started) and its initial
    weights: the test adds the actors it needs with :func:`add_actor`."""
    weights = NumpyGRPOTrainer(seed=0).weights()
    backend = RayGenerationBackend(
        RayConfig(per_actor_concurrency=1, no_actor_wait_s=no_actor_wait_s),
        spec=None,  # type: ignore[arg-type]  # no actor is ever created here
        plane=None,  # type: ignore[arg-type]
        initial_weights=weights,
    )
    return backend, weights


def add_actor(backend: RayGenerationBackend, name: str, *, version: int) -> _Actor:
    """A healthy actor with one slot holding weights ``version`` (no process behind it)."""
    return backend._actors.add(
        _Actor(
            name=name,
            capacity=1,
            handle=None,
            stats=ActorStats(),
            version=version,
            health=WorkerHealth.HEALTHY,
        )
    )
