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

from ..capture import STAGING_PARTITION, CaptureWriter, StagedPrefix
from ..errors import InvalidArgumentTypeError
from ..policy import PolicySnapshot, TaskSet
from ..rollout import (
    DIALECTS,
    WEIGHT_SYNCS,
    AttemptRequest,
    AttemptResult,
    DialectName,
    FaultSettings,
    HttpBackendSettings,
    HttpGenerationBackend,
    PoolSettings,
    SimulatedAgentBackend,
    WeightSyncName,
)
from ..serve import DEFAULT_MODEL_NAME
from ._sharded_plane import RayShardedDataPlane, ShardDirectory

__all__ = ["GenerationWorker", "Params", "WorkerSpec", "snapshot_params"]

Params = dict[str, npt.NDArray[np.float64]]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    """Everything a worker needs to build itself on another node (picklable)."""

    kind: Literal["simulated", "http"]
    shards: ShardDirectory
    task_size: int
    task_seed: int
    prompt_group_every: int
    seed: int
    #: The digit task's episode: thinking calls before the answer, tokens per thought.
    thinking_calls: int = 1
    reasoning_tokens: int = 4
    call_latency_s: float = 0.0
    latency_jitter: float = 0.0
    faults: FaultSettings = field(default_factory=FaultSettings)
    http_servers: tuple[str, ...] = ()
    http_dialect: DialectName = "vllm-completions"
    http_weight_sync: WeightSyncName = "policy"
    #: The job's [http] settings, for a worker that proxies to servers.
    http_settings: HttpBackendSettings | None = None


class GenerationWorker:
    """The actor class body (wrapped with ``ray.remote`` by the pool)."""

    def __init__(self, spec: WorkerSpec, writer: str, target: tuple[int, Params]) -> None:
        version, params = target
        self._plane = RayShardedDataPlane(spec.shards, writer=writer)
        self._capture = CaptureWriter(self._plane, partition=STAGING_PARTITION)
        tasks = TaskSet(
            spec.task_size, seed=spec.task_seed, prompt_group_every=spec.prompt_group_every
        )
        snapshot = PolicySnapshot(version, params)
        self._backend: SimulatedAgentBackend | HttpGenerationBackend
        if spec.kind == "simulated":
            self._backend = SimulatedAgentBackend(
                task_set=tasks,
                seed=spec.seed,
                workers=1,
                call_latency_s=spec.call_latency_s,
                latency_jitter=spec.latency_jitter,
                faults=spec.faults,
                initial_weights=snapshot,
                data_plane=self._plane,
                thinking_calls=spec.thinking_calls,
                reasoning_tokens=spec.reasoning_tokens,
                # Staging blocks on a shard round trip: off the actor's event loop.
                stage_in_thread=True,
            )
        else:
            self._backend = HttpGenerationBackend(
                servers=list(spec.http_servers),
                task_set=tasks,
                dialect=DIALECTS[spec.http_dialect],
                weight_sync=WEIGHT_SYNCS[spec.http_weight_sync],
                settings=spec.http_settings
                or HttpBackendSettings(
                    model=DEFAULT_MODEL_NAME,
                    pool=PoolSettings(),
                    # The worker's weights are the numpy policy's: its vocabulary.
                    vocab_size=PolicySnapshot.vocab_size,
                    stage_in_thread=True,
                ),
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
    ) -> AttemptResult:
        """One attempt; with ``prefix``, continuing an earlier attempt's staged calls."""
        if prefix is None:
            return await self._backend.run_attempt(request, self._capture)
        return await self._backend.resume_attempt(request, self._capture, prefix)


def snapshot_params(weights: object) -> tuple[int, Params]:
    """A :class:`PolicySnapshot` as what travels to workers (its tables are read-only
    views; Ray ships copies)."""
    if not isinstance(weights, PolicySnapshot):
        raise InvalidArgumentTypeError(
            f"the Ray workers take PolicySnapshot weights, got {type(weights).__name__}"
        )
    return weights.version, {name: np.asarray(table) for name, table in weights.params.items()}
