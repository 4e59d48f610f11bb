"""``[ray]``: placement and liveness on Ray (used when ``generation.backend = "ray"``).

Importable without Ray: the config tree holds this section whatever the backend.
"""

from __future__ import annotations

from typing import Annotated, Literal

from .._settings import OPERATIONAL, NonNegativeInt, PositiveFloat, PositiveInt, Section

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
