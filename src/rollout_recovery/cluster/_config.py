"""``[ray]``: placement and liveness on Ray (used when ``generation.backend = "ray"``),
and the job's Ray components built from it and the job's other sections.

Importable without Ray: the config tree holds this section whatever the backend, and
each builder imports the Ray modules when it runs, so a job that does not ask for
``generation.backend = "ray"`` never loads Ray.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from .._settings import OPERATIONAL, NonNegativeInt, PositiveFloat, PositiveInt, Section
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..dataplane import DataPlane
    from ..policy import PolicySnapshot
    from ..rollout import (
        EpisodeTask,
        FaultsConfig,
        GenerationBackend,
        GenerationConfig,
        HttpConfig,
    )

__all__ = ["RayConfig"]


class RayConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything about where things run: actors per node, CPUs per actor, shards.

    Operational, except the number of data shards: a row's shard is its group's hash
    modulo that number, so the shard files of a run only make sense with the same count.
    """

    #: "" starts a local cluster with ``num_cpus``; "auto" or "ray://host:port" attaches.
    address: Annotated[str, OPERATIONAL] = ""
    num_cpus: Annotated[PositiveInt, OPERATIONAL] = 2
    #: What a generation actor runs: "simulated" (the numpy policy in the actor, the
    #: [faults] of the simulated environment) or "http" (a proxy to the [http] servers).
    worker: Annotated[Literal["simulated", "http"], OPERATIONAL] = "simulated"
    actors_per_node: Annotated[PositiveInt, OPERATIONAL] = 2
    cpus_per_actor: Annotated[PositiveFloat, OPERATIONAL] = 0.25
    per_actor_concurrency: Annotated[PositiveInt, OPERATIONAL] = 32
    #: Data-plane shards, each a SQLite file in the run directory's shards/.
    data_shards: PositiveInt = 2
    cpus_per_shard: Annotated[PositiveFloat, OPERATIONAL] = 0.25
    ping_interval_s: Annotated[PositiveFloat, OPERATIONAL] = 1.0
    ping_timeout_s: Annotated[PositiveFloat, OPERATIONAL] = 5.0
    actor_start_timeout_s: Annotated[PositiveFloat, OPERATIONAL] = 60.0
    #: Dead actors replaced per run at most; then the run goes on with what is left and
    #: stops once nothing is.
    max_replacements: Annotated[NonNegativeInt, OPERATIONAL] = 100
    #: How long an attempt waits for an actor holding the current weights before it fails
    #: (``no_live_actor``, retried within the group's rounds).
    no_actor_wait_s: Annotated[PositiveFloat, OPERATIONAL] = 60.0

    @contextlib.contextmanager
    def data_plane(self, directory: Path) -> Iterator[DataPlane]:
        """SQLite shards in ``directory`` served by Ray actors, on the cluster this
        section names (attached to or started, and left as found); the shards stop on
        exit."""
        from ._runtime import ray_session
        from ._sharded_plane import RayShardedDataPlane, ShardDirectory

        with ray_session(self.address, self.num_cpus):
            layout = ShardDirectory(
                # Unique per job: two jobs on one cluster must not share shard actors.
                prefix=f"rr-{os.getpid()}-{int(time.time() * 1000) % 10**9}",
                namespace="rollout-recovery",
                directory=str(directory),
                shards=self.data_shards,
                cpus_per_shard=self.cpus_per_shard,
            )
            plane = RayShardedDataPlane.start(layout)
            try:
                yield plane
            finally:
                plane.close(stop_shards=True)

    def generation_backend(
        self,
        *,
        data_plane: DataPlane,
        seed: int,
        episodes: EpisodeTask,
        generation: GenerationConfig,
        faults: FaultsConfig,
        http: HttpConfig,
        vocab_size: int,
        api_key: str | None,
        initial_weights: PolicySnapshot,
    ) -> GenerationBackend[PolicySnapshot]:
        """Generation actors of ``worker``'s kind, each built from the job's sections and
        running its ``episodes`` (the same builders as the job's in-process backends),
        staging into ``data_plane``, the job's :meth:`data_plane`."""
        from ._pool import RayGenerationBackend
        from ._sharded_plane import RayShardedDataPlane
        from ._worker import WorkerSpec

        if not isinstance(data_plane, RayShardedDataPlane):
            raise ConfigError(
                "the Ray backend stages into the Ray data plane; run it through run_job",
                path="$.generation.backend",
            )
        spec = WorkerSpec(
            kind=self.worker,
            shards=data_plane.layout,
            seed=seed,
            episodes=episodes,
            generation=generation,
            # A worker is its own process: a simulated worker crash would only be a subset
            # of a real actor death, which the pool handles (and the chaos tests cause).
            faults=msgspec.structs.replace(faults, worker_crash_rate=0.0),
            http=http,
            vocab_size=vocab_size,
            api_key=api_key,
        )
        return RayGenerationBackend(
            self, spec=spec, plane=data_plane, initial_weights=initial_weights
        )
