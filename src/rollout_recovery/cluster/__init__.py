"""Clusters on Ray: generation workers and the data plane as Ray actors (``[ray]`` extra).

:class:`RayGenerationBackend` runs attempts on a pool of generation actors (the
simulated environment with the numpy policy, or a proxy to HTTP servers) and replaces the
ones that die; :class:`RayShardedDataPlane` serves the ``DataPlane`` protocol from
SQLite-backed shard actors that workers on any node reach, fencing the writers of dead
actors. Only :class:`RayConfig` (the ``[ray]`` section of the config tree) is importable
without Ray: every other name imports Ray on first use, so the rest of the library never
imports it unless a job asks for ``generation.backend = "ray"``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._config import RayConfig

if TYPE_CHECKING:
    from ._pool import ActorPoolSettings, RayGenerationBackend
    from ._runtime import ray_session
    from ._sharded_plane import RayShardedDataPlane, ShardDirectory
    from ._worker import WorkerSpec

__all__ = [
    "ActorPoolSettings",
    "RayConfig",
    "RayGenerationBackend",
    "RayShardedDataPlane",
    "ShardDirectory",
    "WorkerSpec",
    "ray_session",
]

# Name -> the private module that defines it (each of them imports Ray).
_LAZY = {
    "ActorPoolSettings": "_pool",
    "ActorStats": "_pool",
    "RayGenerationBackend": "_pool",
    "group_of": "_routing",
    "shard_of": "_routing",
    "ray_session": "_runtime",
    "FENCE_PARTITION": "_shard",
    "DataShard": "_shard",
    "RayShardedDataPlane": "_sharded_plane",
    "ShardDirectory": "_sharded_plane",
    "GenerationWorker": "_worker",
    "WorkerSpec": "_worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this hook
    return value
