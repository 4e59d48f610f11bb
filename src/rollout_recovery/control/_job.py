"""``rollout-recovery run``: one run directory, started fresh or resumed by the same command.

The run directory holds::

    job.toml               the job's configuration: a directory belongs to one job
    dataplane.sqlite       the durable row store (staging and canonical rows)
    checkpoints/           step_NNNNNN/ (sidecar, replay index, controller state, policy)
    trained_rows.jsonl     audit trail, cut back to the restored checkpoint on resume
    events.jsonl
    metrics.jsonl          one line per trained step (also cut back)
    run_log.jsonl          one line per start or resume; never cut back
    reward.png             mean reward per step, restarts and checkpoints marked
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from .._durable import atomic_write_bytes
from ..capture import STAGING_PARTITION
from ..dataplane import CANONICAL_PARTITION, DataPlane, SqliteDataPlane
from ..errors import ConfigError, JobMismatchError
from ..policy import NumpyGRPOTrainer, TaskSet, Trainer
from ..rollout import (
    DIALECTS,
    WEIGHT_SYNCS,
    FaultSettings,
    GenerationBackend,
    HttpBackendSettings,
    HttpGenerationBackend,
    PoolSettings,
    SimulatedAgentBackend,
)
from ._audit import AUDIT_FILES, EVENTS, METRICS, AuditTrail
from ._checkpoint_dir import CheckpointStore, SkippedCheckpoint
from ._checkpointing import (
    CheckpointTiming,
    RestoreReport,
    VerifiedCheckpoint,
    restore_controller,
    take_checkpoint,
    verify_checkpoint,
)
from ._config import HttpConfig, RunConfig, config_differences, config_to_toml, load_config
from ._controller import Controller, PromptDataset, RunProgress
from ._layout import DATA_PLANE_FILE, JOB_FILE, PLOT_FILE, RUN_LOG, SERVERS_FILE, SHARDS_DIR
from ._plot import write_reward_plot
from ._report import RunSummary
from ._server_fleet import LocalServerFleet
from ._trail_check import _lines

__all__ = [
    "JobComponents",
    "JobResult",
    "default_components",
    "run_job",
]


@dataclass(slots=True)
class JobComponents:
    """What a run plugs in: the dataset, a generation backend and a trainer."""

    dataset: PromptDataset
    backend: GenerationBackend
    trainer: Trainer


def default_components(config: RunConfig, data_plane: DataPlane) -> JobComponents:
    """The embedded default: synthetic tasks, the numpy GRPO policy, and simulated agents
    (``generation.backend = "simulated"``) or HTTP generation servers (``"http"``, the
    servers of ``config.http.servers``, which :func:`run_job` fills in when it starts
    local ones)."""
    job = config.job
    dataset = TaskSet(
        config.task.dataset_size, seed=job.seed, prompt_group_every=config.task.prompt_group_every
    )
    trainer = NumpyGRPOTrainer(
        seed=job.seed,
        learning_rate=config.policy.learning_rate,
        clip_epsilon=config.policy.clip_epsilon,
    )
    backend: GenerationBackend
    if config.generation.backend == "http":
        backend = _http_backend(config, dataset, trainer)
    elif config.generation.backend == "ray":
        backend = _ray_backend(config, data_plane, trainer)
    else:
        backend = SimulatedAgentBackend(
            task_set=dataset,
            seed=job.seed,
            workers=config.generation.workers,
            call_latency_s=config.generation.call_latency_s,
            latency_jitter=config.generation.latency_jitter,
            # [faults] has exactly the backend's fault fields, so a new fault cannot be
            # configured without reaching the backend.
            faults=FaultSettings(**msgspec.structs.asdict(config.faults)),
            initial_weights=trainer.weights(),
            data_plane=data_plane,
            # SQLite fsyncs every put: staging from worker threads keeps the event loop free.
            stage_in_thread=True,
        )
    return JobComponents(dataset=dataset, backend=backend, trainer=trainer)


# The key the HTTP backend presents, for the components built while run_job runs: the
# launched servers' key, or the value of [http] api_key_env. A context variable, not a
# config field: the config is written to job.toml and into every checkpoint, and the
# components see only the config.
_SERVER_API_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "server_api_key", default=None
)


def _configured_api_key(http: HttpConfig) -> str | None:
    """The value of the variable ``[http] api_key_env`` names (None when it names none);
    a ``ConfigError`` naming the variable, never its value, when it is unset or empty."""
    if not http.api_key_env:
        return None
    key = os.environ.get(http.api_key_env, "")
    if not key:
        raise ConfigError(
            f"the environment variable {http.api_key_env} is unset or empty: export the "
            "servers' API key in it, or leave api_key_env empty",
            path="$.http.api_key_env",
        )
    return key


def _http_settings(http: HttpConfig) -> HttpBackendSettings:
    """The HTTP backend's settings from ``[http]`` (in the job, or in a Ray worker)."""
    key = _SERVER_API_KEY.get()
    return HttpBackendSettings(
        api_key=key if key is not None else _configured_api_key(http),
        model=http.model,
        pool=PoolSettings(
            concurrency=http.per_server_concurrency,
            probe_interval_s=http.probe_interval_s,
            probe_timeout_s=http.probe_timeout_s,
            dead_after_failures=http.dead_after_failures,
            no_server_wait_s=http.no_server_wait_s,
        ),
        request_timeout_s=http.request_timeout_s,
        call_redispatch_budget=http.call_redispatch_budget,
        redispatch_backoff_s=http.redispatch_backoff_s,
        logprob_mode=http.logprob_mode,
        stage_in_thread=True,
    )


def _http_backend(
    config: RunConfig, dataset: TaskSet, trainer: NumpyGRPOTrainer
) -> HttpGenerationBackend:
    http = config.http
    return HttpGenerationBackend(
        servers=list(http.servers),
        task_set=dataset,
        dialect=DIALECTS[http.dialect],
        weight_sync=WEIGHT_SYNCS[http.weight_sync],
        settings=_http_settings(http),
        initial_version=trainer.weight_version,
        initial_weights=trainer.weights(),
    )


def _ray_backend(
    config: RunConfig, data_plane: DataPlane, trainer: NumpyGRPOTrainer
) -> GenerationBackend:
    from ..cluster import ActorPoolSettings, RayGenerationBackend, RayShardedDataPlane, WorkerSpec

    if not isinstance(data_plane, RayShardedDataPlane):
        raise ConfigError(
            "the Ray backend stages into the Ray data plane; run it through run_job",
            path="$.generation.backend",
        )
    ray_config, http = config.ray, config.http
    faults = msgspec.structs.asdict(config.faults)
    # A worker is its own process: a simulated worker crash would only be a subset of a
    # real actor death, which the pool handles (and the chaos tests cause).
    faults["worker_crash_rate"] = 0.0
    spec = WorkerSpec(
        kind=ray_config.worker,
        shards=data_plane.layout,
        task_size=config.task.dataset_size,
        task_seed=config.job.seed,
        prompt_group_every=config.task.prompt_group_every,
        seed=config.job.seed,
        call_latency_s=config.generation.call_latency_s,
        latency_jitter=config.generation.latency_jitter,
        faults=FaultSettings(**faults),
        http_servers=http.servers,
        http_dialect=http.dialect,
        http_weight_sync=http.weight_sync,
        http_settings=_http_settings(http),
    )
    settings = ActorPoolSettings(
        actors_per_node=ray_config.actors_per_node,
        cpus_per_actor=ray_config.cpus_per_actor,
        per_actor_concurrency=ray_config.per_actor_concurrency,
        ping_interval_s=ray_config.ping_interval_s,
        ping_timeout_s=ray_config.ping_timeout_s,
        actor_start_timeout_s=ray_config.actor_start_timeout_s,
        max_replacements=ray_config.max_replacements,
    )
    return RayGenerationBackend(
        spec=spec, settings=settings, plane=data_plane, initial_weights=trainer.weights()
    )


@contextlib.contextmanager
def _data_plane(out: Path, config: RunConfig) -> Iterator[DataPlane]:
    """The job's durable store: one SQLite file, or SQLite shards served by Ray actors
    (on a cluster this job attaches to or starts, and leaves as it found it)."""
    if config.generation.backend != "ray":
        with SqliteDataPlane(out / DATA_PLANE_FILE) as store:
            yield store
        return
    from ..cluster import RayShardedDataPlane, ShardDirectory, ray_session

    ray_config = config.ray
    with ray_session(ray_config.address, ray_config.num_cpus):
        layout = ShardDirectory(
            prefix=f"rr-{os.getpid()}-{int(time.time() * 1000) % 10**9}",
            namespace="rollout-recovery",
            directory=str(out / SHARDS_DIR),
            shards=ray_config.data_shards,
            cpus_per_shard=ray_config.cpus_per_shard,
        )
        plane = RayShardedDataPlane.start(layout)
        try:
            yield plane
        finally:
            plane.shutdown()


def _require_ray(config: RunConfig) -> None:
    if config.generation.backend != "ray":
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(
            "needs Ray: pip install 'rollout-recovery[ray]'", path="$.generation.backend"
        ) from None


@contextlib.contextmanager
def _generation_servers(out: Path, config: RunConfig) -> Iterator[RunConfig]:
    """The config the components see: with local servers started (and stopped on exit)
    when the HTTP backend has no server list. The job's own config keeps the empty list,
    so a resume, which starts new servers on new ports, is still the same job."""
    http = config.http
    if not _wants_servers(config):
        yield config
        return
    api_key = _configured_api_key(http)
    if http.servers:
        with _presenting(api_key):
            yield config
        return
    # Launched servers get the configured key (so an operator can restart one by hand),
    # else a random one of this job's.
    fleet = LocalServerFleet(
        out,
        http.launch_servers,
        seed=config.job.seed,
        call_latency_s=config.generation.call_latency_s,
        model=http.model,
        api_key=api_key,
        api_key_env=http.api_key_env or None,
    )
    with fleet as urls, _presenting(fleet.api_key):
        yield msgspec.structs.replace(
            config, http=msgspec.structs.replace(http, servers=tuple(urls))
        )


def _wants_servers(config: RunConfig) -> bool:
    return config.generation.backend == "http" or (
        config.generation.backend == "ray" and config.ray.worker == "http"
    )


@contextlib.contextmanager
def _presenting(api_key: str | None) -> Iterator[None]:
    token = _SERVER_API_KEY.set(api_key)
    try:
        yield
    finally:
        _SERVER_API_KEY.reset(token)


@dataclass(slots=True)
class JobResult:
    summary: RunSummary
    restored: RestoreReport | None
    skipped: list[SkippedCheckpoint]
    checkpoints: list[CheckpointTiming] = field(default_factory=list)


def claim_run_directory(out: Path, config: RunConfig) -> bool:
    """Make ``out`` this job's directory; True when it already was (a resume candidate).

    Refuses, changing nothing, a directory that holds another job (naming every differing
    field) or that is not empty and not a run directory at all.
    """
    job_file = out / JOB_FILE
    if out.exists() and not out.is_dir():
        raise JobMismatchError(f"{out} exists and is not a directory")
    if job_file.exists():
        saved = load_config(job_file)
        differences = config_differences(saved, config)
        if differences:
            raise JobMismatchError(
                f"{out} holds another job's run ({JOB_FILE} differs: "
                + "; ".join(differences)
                + "); rerun with the same config and seed, or choose another --out",
                differences=differences,
            )
        return True
    if out.exists() and any(out.iterdir()):
        raise JobMismatchError(
            f"{out} is not empty and is not a rollout-recovery run directory (no {JOB_FILE}); "
            "choose a new or empty --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(job_file, config_to_toml(config).encode())
    return False


def run_job(
    out: Path,
    config: RunConfig,
    *,
    progress: RunProgress | None = None,
    components: Callable[[RunConfig, DataPlane], JobComponents] = default_components,
    log: Callable[[str], None] = lambda message: None,
) -> JobResult:
    """Start or resume the job in ``out`` and run it to the end."""
    started = time.monotonic()
    _require_ray(config)
    if _wants_servers(config):
        _configured_api_key(config.http)  # an unset variable is refused before any write
    claim_run_directory(out, config)
    if config.generation.backend == "http":
        log("backend http: [faults] is not injected; the servers' own failures are the faults")
    with _generation_servers(out, config) as resolved:
        if resolved is not config:
            count = len(resolved.http.servers)
            log(f"started {count} local generation servers (listed in {SERVERS_FILE})")
        with _data_plane(out, config) as inner:
            return _run_with(out, config, resolved, started, progress, components, log, inner)


def _run_with(
    out: Path,
    config: RunConfig,
    resolved: RunConfig,
    started: float,
    progress: RunProgress | None,
    components: Callable[[RunConfig, DataPlane], JobComponents],
    log: Callable[[str], None],
    inner: DataPlane,
) -> JobResult:
    audit = AuditTrail(out)
    try:
        parts = components(resolved, inner)
        controller = Controller(
            config=config,
            dataset=parts.dataset,
            backend=parts.backend,
            trainer=parts.trainer,
            data_plane=inner,
            audit=audit,
            progress=progress,
        )
        store = CheckpointStore(out, keep=config.checkpoint.keep)
        store.remove_stale()  # what a save killed mid-way left behind
        result = asyncio.run(_run(controller, store, out, log))
    finally:
        audit.close()
    summary = _summary(out, controller, time.monotonic() - started)
    result.summary = summary
    _plot(out, config)
    return result


async def _run(
    controller: Controller, store: CheckpointStore, out: Path, log: Callable[[str], None]
) -> JobResult:
    config = controller.config
    found = store.newest_loadable(
        lambda loaded: verify_checkpoint(loaded, config=config, controller=controller)
    )
    timings: list[CheckpointTiming] = []
    restored: RestoreReport | None = None
    skipped: list[SkippedCheckpoint] = []
    try:
        if found is None:
            if controller.progress is not None:
                controller.progress.start(config.job.steps, None)
            await _start_fresh(controller)
            _log_run(out, "start", step=0)
            log(f"starting a new run of {config.job.steps} steps in {out}")
        else:
            _, verified, skipped = found
            for skip in skipped:
                log(f"skipping checkpoint {skip}")
            assert isinstance(verified, VerifiedCheckpoint)
            restored = await restore_controller(controller, verified)
            if controller.progress is not None:
                controller.progress.start(config.job.steps, restored.step)
            _log_run(out, "resume", step=restored.step, checkpoint=restored.checkpoint)
            log(
                f"resumed from {restored.checkpoint}: step {restored.step}, "
                f"{restored.groups_in_ledger} groups in the ledger, "
                f"{restored.sealed_siblings_kept} sealed siblings kept "
                f"({restored.tokens_reused} tokens reused), "
                f"{restored.canonical_groups} canonical groups, "
                f"shortfall {restored.shortfall or '{}'}"
            )

        async def checkpoint() -> None:
            timing = await take_checkpoint(controller, store)
            timings.append(timing)

        if found is None:
            await checkpoint()  # the bootstrap anchor: every later start can resume
        controller.set_checkpointer(checkpoint)
        await controller.run()
    finally:
        await controller.backend.aclose()
    return JobResult(
        summary=_empty_summary(), restored=restored, skipped=skipped, checkpoints=timings
    )


async def _start_fresh(controller: Controller) -> None:
    """No checkpoint at all: whatever a run killed before its first one left is void."""
    store = controller.data_plane.inner
    async with controller.barrier.mutation("recovery_restore") as cut:
        for partition in (STAGING_PARTITION, CANONICAL_PARTITION):
            store.clear(partition, store.keys(partition), cut=cut)
        controller.audit.truncate_to(dict.fromkeys(AUDIT_FILES, 0))


def _log_run(out: Path, event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "time": time.time(), "pid": os.getpid(), **fields})
    with open(out / RUN_LOG, "a") as handle:
        handle.write(line + "\n")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [record for _, record in _lines(path)] if path.exists() else []


def _tenth_means(rewards: list[float]) -> tuple[float | None, float | None]:
    if not rewards:
        return None, None
    tenth = max(1, math.ceil(len(rewards) / 10))
    return sum(rewards[:tenth]) / tenth, sum(rewards[-tenth:]) / tenth


def _empty_summary() -> RunSummary:
    return RunSummary(0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, None, None)


def _summary(out: Path, controller: Controller, wall_time: float) -> RunSummary:
    counters = controller.counters
    metrics = _read_jsonl(out / METRICS)
    rewards = [m["mean_reward"] for m in metrics if m.get("mean_reward") is not None]
    first, last = _tenth_means(rewards)
    restores = sum(1 for line in _read_jsonl(out / RUN_LOG) if line["event"] == "resume")
    return RunSummary(
        steps=controller.step,
        prompts_taken=counters["prompts_taken"],
        prompts_trained=counters["prompts_trained"],
        prompts_dropped=counters["prompts_dropped"],
        attempts=counters["attempts"],
        retries=counters["retries"],
        siblings_reused=counters["siblings_reused"],
        checkpoints=counters["checkpoints"],
        restores=restores,
        longest_checkpoint_stall_s=counters["longest_checkpoint_stall_us"] / 1e6,
        wall_time_s=wall_time,
        first_tenth_reward=first,
        last_tenth_reward=last,
        parts=_parts(metrics),
    )


def _parts(metrics: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per server or actor counts from the newest step's backend telemetry."""
    backend = metrics[-1].get("backend") if metrics else None
    if not isinstance(backend, dict):
        return {}
    for kind in ("servers", "actors"):
        parts = backend.get(kind)
        if isinstance(parts, dict):
            return parts
    return {}


def _plot(out: Path, config: RunConfig) -> None:
    metrics = _read_jsonl(out / METRICS)
    events = _read_jsonl(out / EVENTS)
    restarts = [line["step"] for line in _read_jsonl(out / RUN_LOG) if line["event"] == "resume"]
    write_reward_plot(
        out / PLOT_FILE,
        steps=[m["step"] for m in metrics],
        mean_rewards=[
            math.nan if m.get("mean_reward") is None else float(m["mean_reward"]) for m in metrics
        ],
        restarts=restarts,
        checkpoints=[e["step"] for e in events if e["event"] == "checkpoint_committed"],
        title=f"rollout-recovery: mean reward per step (seed {config.job.seed})",
    )
