"""The job's Ray components, built from ``[ray]`` and the job's other config sections.

Importable without Ray: each builder imports the Ray modules when it runs, so a job that
does not ask for ``generation.backend = "ray"`` never loads Ray.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from ..dataplane import DataPlane
from ..errors import ConfigError
from ..policy import PolicySnapshot, TaskConfig
from ..rollout import FaultsConfig, GenerationBackend, GenerationConfig, HttpConfig
from ._config import RayConfig

__all__ = ["ray_backend", "ray_data_plane"]


@contextlib.contextmanager
def ray_data_plane(config: RayConfig, directory: Path) -> Iterator[DataPlane]:
    """SQLite shards in ``directory`` served by Ray actors, on the cluster ``config``
    names (attached to or started, and left as found); the shards stop on exit."""
    from ._runtime import ray_session
    from ._sharded_plane import RayShardedDataPlane, ShardDirectory

    with ray_session(config.address, config.num_cpus):
        layout = ShardDirectory(
            # Unique per job: two jobs on one cluster must not share shard actors.
            prefix=f"rr-{os.getpid()}-{int(time.time() * 1000) % 10**9}",
            namespace="rollout-recovery",
            directory=str(directory),
            shards=config.data_shards,
            cpus_per_shard=config.cpus_per_shard,
        )
        plane = RayShardedDataPlane.start(layout)
        try:
            yield plane
        finally:
            plane.close(stop_shards=True)


def ray_backend(
    config: RayConfig,
    *,
    data_plane: DataPlane,
    seed: int,
    task: TaskConfig,
    generation: GenerationConfig,
    faults: FaultsConfig,
    http: HttpConfig,
    vocab_size: int,
    api_key: str | None,
    initial_weights: PolicySnapshot,
) -> GenerationBackend[PolicySnapshot]:
    """Generation actors of ``config.worker``'s kind, each built from the job's sections
    (the same builders as the job's in-process backends) and staging into
    ``data_plane``, the job's :func:`ray_data_plane`."""
    from ._pool import ActorPoolSettings, RayGenerationBackend
    from ._sharded_plane import RayShardedDataPlane
    from ._worker import WorkerSpec

    if not isinstance(data_plane, RayShardedDataPlane):
        raise ConfigError(
            "the Ray backend stages into the Ray data plane; run it through run_job",
            path="$.generation.backend",
        )
    spec = WorkerSpec(
        kind=config.worker,
        shards=data_plane.layout,
        seed=seed,
        task=task,
        generation=generation,
        # A worker is its own process: a simulated worker crash would only be a subset of
        # a real actor death, which the pool handles (and the chaos tests cause).
        faults=msgspec.structs.replace(faults, worker_crash_rate=0.0),
        http=http,
        vocab_size=vocab_size,
        api_key=api_key,
    )
    settings = ActorPoolSettings(
        actors_per_node=config.actors_per_node,
        cpus_per_actor=config.cpus_per_actor,
        per_actor_concurrency=config.per_actor_concurrency,
        ping_interval_s=config.ping_interval_s,
        ping_timeout_s=config.ping_timeout_s,
        actor_start_timeout_s=config.actor_start_timeout_s,
        max_replacements=config.max_replacements,
    )
    return RayGenerationBackend(
        spec=spec, settings=settings, plane=data_plane, initial_weights=initial_weights
    )
