"""Clusters on Ray: generation workers and the data plane as Ray actors (``[ray]`` extra).

:class:`RayGenerationBackend` runs attempts on a pool of generation actors (the
simulated environment with the numpy policy, or a proxy to HTTP servers) and replaces the
ones that die; :class:`RayShardedDataPlane` serves the ``DataPlane`` protocol from
SQLite-backed shard actors that workers on any node reach, fencing the writers of dead
actors. Importing this package needs Ray; the rest of the library never imports it unless
a job asks for ``generation.backend = "ray"``.
"""

from ._pool import ActorPoolSettings, ActorStats, RayGenerationBackend
from ._routing import group_of, shard_of
from ._runtime import ray_session
from ._shard import FENCE_PARTITION, DataShard
from ._sharded_plane import RayShardedDataPlane, ShardDirectory
from ._worker import GenerationWorker, WorkerSpec

__all__ = [
    "FENCE_PARTITION",
    "ActorPoolSettings",
    "ActorStats",
    "DataShard",
    "GenerationWorker",
    "RayGenerationBackend",
    "RayShardedDataPlane",
    "ShardDirectory",
    "WorkerSpec",
    "group_of",
    "ray_session",
    "shard_of",
]
