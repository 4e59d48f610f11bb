"""The generation actor's body: one worker that runs attempts on any node.

It stages every call into the sharded data plane under its own writer id (so the driver
can fence it), runs the task's episodes (``rollout.run_episode``, the one episode every
backend runs) actor-side, either with the numpy policy in process
(``kind = "simulated"``, the simulated environment and its injected faults) or as a proxy
to OpenAI-compatible HTTP servers (``kind = "http"``), and holds the weight version the
driver last pushed. Ray serializes its arguments and results: weights travel as plain
numpy tables, a prefix to continue as a :class:`~rollout_recovery.capture.StagedPrefix`,
results as :class:`~rollout_recovery.rollout.AttemptResult`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..capture import CaptureWriter, StagedPrefix
from ..policy import PolicySnapshot
from ..rollout import (
    AttemptFailure,
    AttemptRequest,
    AttemptResult,
    EpisodeTask,
    FaultsConfig,
    GenerationConfig,
    HttpConfig,
    HttpGenerationBackend,
    SimulatedAgentBackend,
)
from ._sharded_plane import RayShardedDataPlane, ShardDirectory

__all__ = ["GenerationWorker", "Params", "WorkerSpec", "snapshot_params"]

Params = dict[str, npt.NDArray[np.float64]]

@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    """Everything a worker needs to build itself on another node (picklable): the job's
    own config sections and episodes, built by the same builders as the job's in-process
    backends, never restated field by field."""

    kind: Literal["simulated", "http"]
    shards: ShardDirectory
    seed: int
    #: The episodes the job's task builds (its prompts and its turns): built once by the
    #: job, shipped to every worker, so a worker runs whatever task the job runs.
    episodes: EpisodeTask
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    #: The simulated environment's faults (the job turns a worker crash into a real actor
    #: death: its rate is 0 here); none by default.
    faults: FaultsConfig = field(default_factory=FaultsConfig.only)
    http: HttpConfig = field(default_factory=HttpConfig)
    #: The trainer's vocabulary, which a proxying worker checks replies against.
    vocab_size: int = PolicySnapshot.vocab_size
    #: The key a proxying worker presents to the servers (the job's, resolved).
    api_key: str | None = field(default=None, repr=False)


class GenerationWorker:
    """The actor class body (wrapped with ``ray.remote`` by the pool)."""

    def __init__(self, spec: WorkerSpec, writer: str, target: tuple[int, Params]) -> None:
        version, params = target
        self._plane = RayShardedDataPlane(spec.shards, writer=writer)
        self._capture = CaptureWriter(self._plane, partition=CaptureWriter.staging_partition)
        snapshot = PolicySnapshot(version, params)
        self._backend: SimulatedAgentBackend | HttpGenerationBackend[PolicySnapshot]
        if spec.kind == "simulated":
            self._backend = SimulatedAgentBackend(
                spec.generation,
                faults=spec.faults,
                episodes=spec.episodes,
                seed=spec.seed,
                initial_weights=snapshot,
                data_plane=self._plane,
                workers=1,
            )
        else:
            self._backend = HttpGenerationBackend(
                spec.http,
                generation=spec.generation,
                episodes=spec.episodes,
                vocab_size=spec.vocab_size,
                api_key=spec.api_key,
                initial_version=version,
                initial_weights=snapshot,
            )

    async def ping(self) -> int:
        return os.getpid()

    async def load_weights(self, target: tuple[int, Params]) -> int:
        version, params = target
        self._backend.update_weights(version, PolicySnapshot(version, params))
        return version

    async def run_attempt(
        self, request: AttemptRequest, prefix: StagedPrefix | None = None
    ) -> AttemptResult | AttemptFailure:
        """One attempt; with ``prefix``, continuing an earlier attempt's staged calls."""
        return await self._backend.run_attempt(request, self._capture, prefix)


def snapshot_params(weights: PolicySnapshot) -> tuple[int, Params]:
    """A :class:`PolicySnapshot` as what travels to workers (its tables are read-only
    views; Ray ships copies, and a worker rebuilds a checked snapshot from them)."""
    return weights.version, {name: np.asarray(table) for name, table in weights.params.items()}
