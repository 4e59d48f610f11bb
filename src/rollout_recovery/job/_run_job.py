"""``rollout-recovery run``: one run directory, started fresh or resumed by the same command.

The order is what makes a rerun safe:

1. refuse, changing nothing, a path that is not a directory or a non-empty directory that
   is not a run;
2. take the directory's lock (one live job per directory; a second exits naming the pid);
3. claim it: a new directory gets ``job.toml``; an existing one must hold the same job
   (the identity fields; operational ones may change and are recorded);
4. resume from the newest checkpoint that verifies, or start fresh only when the directory
   holds no trace of an earlier run (a run that lost its checkpoints is refused, nothing
   deleted);
5. run to the end; write the summary and the reward plot.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .._durable import atomic_write_bytes
from .._settings import config_to_toml
from ..capture import STAGING_PARTITION
from ..control import (
    CheckpointTiming,
    Controller,
    RestoreReport,
    RunConfig,
    RunProgress,
    VerifiedCheckpoint,
    config_differences,
    follow_journal,
    load_config,
    restore_controller,
    take_checkpoint,
    verify_checkpoint,
)
from ..dataplane import CANONICAL_PARTITION, DataPlane
from ..errors import (
    CheckpointDirectoryError,
    JobMismatchError,
    RunNotResumableError,
)
from ..history import (
    AuditTrail,
    CheckpointCommitted,
    RunStarted,
    TrailLineError,
    read_json_lines,
    read_records,
)
from ..metrics import MetricsConfig, check_sinks_installed, open_metrics
from ..rundir import (
    CheckpointStore,
    RunDirectory,
    SkippedCheckpoint,
    append_run_log,
    read_run_log,
    run_directory_lock,
)
from ..vllm import check_launch_paths
from ._components import (
    JobComponents,
    configured_api_key,
    default_components,
    generation_servers,
    job_data_plane,
    require_ray,
    wants_servers,
)
from ._plot import write_reward_plot
from ._report import RunSummary

__all__ = ["JobResult", "claim_run_directory", "run_job"]


@dataclass(slots=True)
class JobResult:
    summary: RunSummary
    restored: RestoreReport | None
    skipped: list[SkippedCheckpoint]
    checkpoints: list[CheckpointTiming] = field(default_factory=list)
    #: Operational settings this start changed against the directory's ``job.toml``.
    config_changes: list[str] = field(default_factory=list)


def _refuse_foreign_path(run: RunDirectory) -> None:
    """Refuse, before writing anything, a path that cannot become this run's directory."""
    if run.root.exists() and not run.root.is_dir():
        raise JobMismatchError(f"{run.root} exists and is not a directory")
    if run.root.is_dir() and not run.job_file.exists() and any(run.root.iterdir()):
        raise JobMismatchError(
            f"{run.root} is not empty and is not a rollout-recovery run directory (no "
            f"{run.job_file.name}); choose a new or empty --out"
        )


def claim_run_directory(run: RunDirectory, config: RunConfig) -> list[str]:
    """Make ``run`` this job's directory; returns the operational settings that changed.

    A directory holding another job (an identity field differs) is refused, naming every
    differing field, and nothing changes. Call with the directory's lock held.
    """
    if not run.job_file.exists():
        atomic_write_bytes(run.job_file, config_to_toml(config).encode())
        # A new run's files hold prompts, rewards and server names: owner only.
        os.chmod(run.root, 0o700)
        return []
    return _identity_changes(run, config)


def _identity_changes(run: RunDirectory, config: RunConfig) -> list[str]:
    """The operational settings ``config`` changes against ``run``'s job; refuses another
    job (an identity field differs), changing nothing."""
    saved = load_config(run.job_file)
    identity = config_differences(saved, config, which="identity")
    if identity:
        raise JobMismatchError(
            f"{run.root} holds another job's run ({run.job_file.name} differs in what the "
            "job trains: "
            + "; ".join(identity)
            + "); rerun with the same config and seed, or choose another --out",
            differences=identity,
        )
    return config_differences(saved, config, which="operational")


def run_job(
    out: os.PathLike[str] | str,
    config: RunConfig,
    *,
    progress: RunProgress | None = None,
    components: Callable[[RunConfig, DataPlane], JobComponents] = default_components,
    log: Callable[[str], None] = lambda message: None,
) -> JobResult:
    """Start or resume the job in ``out`` and run it to the end."""
    started = time.monotonic()
    run = RunDirectory(out)  # type: ignore[arg-type]
    require_ray(config)
    if wants_servers(config):
        configured_api_key(config.http)  # an unset variable is refused before any write
    if config.vllm.launch:
        check_launch_paths(config.vllm)  # a missing vLLM venv or model, likewise
    check_sinks_installed(config.metrics)
    _refuse_foreign_path(run)
    if run.job_file.exists():
        # Another job's directory is refused before even the lock file is touched.
        _identity_changes(run, config)
    with run_directory_lock(run):
        changes = claim_run_directory(run, config)
        if config.generation.backend == "http":
            log("backend http: [faults] is not injected; the servers' own failures are the faults")
        with generation_servers(run, config) as resolved:
            if resolved.http.servers != config.http.servers:
                count = len(resolved.http.servers)
                log(f"started {count} local generation servers (listed in {run.servers_file.name})")
            with job_data_plane(run, config) as inner:
                result, controller = _run_with(
                    run, config, resolved, progress, components, log, inner, changes
                )
    result.summary = _summary(run, controller, time.monotonic() - started)
    _plot(run, config)
    return result


def _run_with(
    run: RunDirectory,
    config: RunConfig,
    resolved: RunConfig,
    progress: RunProgress | None,
    components: Callable[[RunConfig, DataPlane], JobComponents],
    log: Callable[[str], None],
    inner: DataPlane,
    changes: list[str],
) -> tuple[JobResult, Controller]:
    history = AuditTrail(run)
    try:
        parts = components(resolved, inner)
        controller = Controller(
            config=config,
            dataset=parts.dataset,
            backend=parts.backend,
            trainer=parts.trainer,
            data_plane=inner,
            history=history,
            progress=progress,
        )
        store = CheckpointStore(run.root, keep=config.checkpoint.keep)
        store.remove_stale()  # what a save killed mid-way left behind
        result = asyncio.run(_run(run, controller, store, log, changes))
        result.config_changes = changes
    finally:
        history.close()
    return result, controller


async def _run(
    run: RunDirectory,
    controller: Controller,
    store: CheckpointStore,
    log: Callable[[str], None],
    changes: list[str],
) -> JobResult:
    config = controller.config
    try:
        found = store.newest_loadable(
            lambda loaded: verify_checkpoint(loaded, config=config, controller=controller)
        )
    except CheckpointDirectoryError as error:
        raise RunNotResumableError(
            f"no checkpoint in {store.directory} can be restored ({error})",
            remedy="Start a new run in another directory, or restore the checkpoints "
            "directory from a backup.",
        ) from error
    timings: list[CheckpointTiming] = []
    restored: RestoreReport | None = None
    skipped: list[SkippedCheckpoint] = []
    try:
        if found is None:
            _refuse_lost_checkpoints(run, controller)
            if controller.progress is not None:
                controller.progress.start(config.job.steps, None)
            await _start_fresh(controller)
            append_run_log(run, "start", step=0)
        else:
            _, verified, skipped = found
            for skip in skipped:
                log(f"skipping checkpoint {skip}")
            assert isinstance(verified, VerifiedCheckpoint)
            restored = await _restore(controller, verified)
            if controller.progress is not None:
                controller.progress.start(config.job.steps, restored.step)
            append_run_log(
                run,
                "resume",
                step=restored.step,
                checkpoint=restored.checkpoint,
                config_changes=changes,
            )
            log(
                f"resumed from {restored.checkpoint}: step {restored.step}, "
                f"{restored.groups_in_ledger} groups in the ledger, "
                f"{restored.sealed_siblings_kept} sealed siblings kept "
                f"({restored.tokens_reused} tokens reused), "
                f"{restored.canonical_groups} canonical groups, "
                f"shortfall {restored.shortfall or '{}'}"
            )
        for change in changes:
            log(f"config changed on resume: {change}")
        if changes:
            # The operational change is accepted: job.toml says what the run runs with now.
            atomic_write_bytes(run.job_file, config_to_toml(config).encode())
        controller.record(
            RunStarted(
                pid=os.getpid(),
                resumed_from=restored.checkpoint if restored is not None else None,
                step=controller.step,
                steps=config.job.steps,
                prompts_per_step=config.job.prompts_per_step,
                group_size=config.job.generations_per_prompt,
                config_changes=changes,
            )
        )
        # From here the snapshot builder follows the journal on its own.
        follow_journal(controller)
        controller.metrics = open_metrics(
            _tool_sinks(config), run.root, resume_step=controller.step
        )
        if restored is not None:
            controller.metrics.log_marker(
                restored.step,
                "restored",
                {
                    "checkpoint": restored.checkpoint,
                    "replayed_records": restored.replayed_records,
                    "seals_lost": restored.seals_discarded,
                    "tokens_lost": restored.tokens_discarded + restored.tokens_in_flight_lost,
                    "tokens_reused": restored.tokens_reused,
                    "rolled_back_steps": len(restored.rolled_back_steps),
                },
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
        if controller.metrics is not None:
            await asyncio.to_thread(controller.metrics.close)
    return JobResult(
        summary=_empty_summary(), restored=restored, skipped=skipped, checkpoints=timings
    )


async def _restore(controller: Controller, verified: VerifiedCheckpoint) -> RestoreReport:
    try:
        return await restore_controller(controller, verified)
    except CheckpointDirectoryError as error:
        # The history is shorter than the checkpoint recorded: a disk lost synced data.
        raise RunNotResumableError(
            str(error),
            remedy="Restore the run directory from a backup, or start a new run in another "
            "directory.",
        ) from error


def _tool_sinks(config: RunConfig) -> MetricsConfig:
    """The ``[metrics]`` sinks beyond ``metrics.jsonl``, which the trail always writes."""
    return msgspec.structs.replace(
        config.metrics, sinks=tuple(s for s in config.metrics.sinks if s != "jsonl")
    )


def _refuse_lost_checkpoints(run: RunDirectory, controller: Controller) -> None:
    """No checkpoint at all: start fresh only if nothing here shows an earlier run.

    An earlier run always commits a checkpoint before its first piece of work, so work
    without a checkpoint means the checkpoints were lost, and starting over would throw
    the run's history away.
    """
    found: list[str] = []
    if run.events.is_file():
        try:
            committed = sum(
                1
                for _, record in read_records(run.events)
                if isinstance(record, CheckpointCommitted)
            )
        except TrailLineError:
            found.append(f"{run.events.name} (unreadable)")
        else:
            if committed:
                found.append(f"{run.events.name} ({committed} checkpoint records)")
    if run.metrics.is_file() and run.metrics.stat().st_size:
        found.append(f"{run.metrics.name} (trained steps)")
    if any(entry.event == "resume" for entry in _run_log_entries(run)):
        found.append(f"{run.run_log.name} (resumes)")
    store = controller.data_plane.inner
    rows = len(store.keys(STAGING_PARTITION)) + len(store.keys(CANONICAL_PARTITION))
    if rows:
        found.append(f"the data plane ({rows} rows)")
    if found:
        raise RunNotResumableError(
            f"{run.root} holds an earlier run but no usable checkpoint "
            f"({run.checkpoints_dir.name}/ is missing or empty); found: " + ", ".join(found),
            remedy="Nothing was deleted. Restore the checkpoints directory, or start a new "
            "run in another directory.",
        )


def _run_log_entries(run: RunDirectory) -> list[Any]:
    try:
        return list(read_run_log(run))
    except ValueError:
        return []


async def _start_fresh(controller: Controller) -> None:
    """No checkpoint and no earlier work: whatever a run killed before its first
    checkpoint left (a header, an empty store) is void."""
    store = controller.data_plane.inner
    async with controller.barrier.mutation("recovery_restore") as cut:
        for partition in (STAGING_PARTITION, CANONICAL_PARTITION):
            store.clear(partition, store.keys(partition), cut=cut)
        controller.history.start_over()


def _read_metrics(run: RunDirectory) -> list[dict[str, Any]]:
    if not run.metrics.is_file():
        return []
    return [record for _, record in read_json_lines(run.metrics)]


def _tenth_means(rewards: list[float]) -> tuple[float | None, float | None]:
    if not rewards:
        return None, None
    tenth = max(1, math.ceil(len(rewards) / 10))
    return sum(rewards[:tenth]) / tenth, sum(rewards[-tenth:]) / tenth


def _empty_summary() -> RunSummary:
    return RunSummary(0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, None, None)


def _summary(run: RunDirectory, controller: Controller, wall_time: float) -> RunSummary:
    counters = controller.state.counters
    metrics = _read_metrics(run)
    rewards = [m["mean_reward"] for m in metrics if m.get("mean_reward") is not None]
    first, last = _tenth_means(rewards)
    restores = sum(1 for entry in _run_log_entries(run) if entry.event == "resume")
    return RunSummary(
        steps=controller.step,
        prompts_taken=counters.prompts_taken,
        prompts_trained=counters.prompts_trained,
        prompts_dropped=counters.prompts_dropped,
        attempts=counters.attempts,
        retries=counters.retries,
        siblings_reused=counters.siblings_reused,
        checkpoints=counters.checkpoints,
        restores=restores,
        longest_checkpoint_stall_s=counters.longest_checkpoint_stall_us / 1e6,
        wall_time_s=wall_time,
        first_tenth_reward=first,
        last_tenth_reward=last,
        valid_row_fraction=(
            counters.valid_rows_trained / counters.rows_trained if counters.rows_trained else None
        ),
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


def _plot(run: RunDirectory, config: RunConfig) -> None:
    metrics = _read_metrics(run)
    checkpoints: list[int] = []
    if run.events.is_file():
        checkpoints = [
            record.step
            for _, record in read_records(run.events)
            if isinstance(record, CheckpointCommitted)
        ]
    restarts = [entry.step for entry in _run_log_entries(run) if entry.event == "resume"]
    write_reward_plot(
        run.plot,
        steps=[m["step"] for m in metrics],
        mean_rewards=[
            math.nan if m.get("mean_reward") is None else float(m["mean_reward"]) for m in metrics
        ],
        restarts=restarts,
        checkpoints=checkpoints,
        title=f"rollout-recovery: mean reward per step (seed {config.job.seed})",
    )
