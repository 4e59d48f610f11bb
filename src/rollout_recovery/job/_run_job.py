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
5. run to the end, or until a drain (SIGTERM, Ctrl-C, the drain file: ``_drain.py``)
   stops it with a checkpoint; write the summary and the reward plot.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from .._durable import atomic_write_bytes
from .._settings import config_to_builtins, config_to_toml
from ..capture import CaptureWriter
from ..control import Controller, RunConfig, load_config
from ..dataplane import DataPlane, ReplayIndex, SqliteDataPlane
from ..errors import (
    CheckpointDirectoryError,
    ConfigError,
    InvalidStateError,
    JobMismatchError,
    RunNotResumableError,
)
from ..history import AuditTrail
from ..history.records import Restored, RunStarted
from ..metrics import MetricsConfig
from ..rundir import CheckpointStore, RunDirectory
from ._components import (
    JobComponents,
    configured_api_key,
    default_components,
    generation_servers,
    job_data_plane,
    require_ray,
    wants_servers,
)
from ._drain import DrainTriggers, drain_file_of, remove_stale_drain_request
from ._llm_parts import resolve_model
from ._plot import write_reward_plot
from ._readback import RunReadback
from ._report import ConsoleSamples, RunProgress, RunSummary, ShowsSamples

__all__ = ["JobResult", "claim_run_directory", "run_job"]


class JobResult:
    """What one :func:`run_job` call did, read from the controller and its checkpoints
    once the job has stopped."""

    def __init__(
        self,
        controller: Controller[Any],
        *,
        restored: Restored | None,
        config_changes: list[str],
        drain_checkpoint: str | None,
    ) -> None:
        checkpoints = controller.checkpoints
        #: The end-of-run numbers (set by ``run_job`` once every resource is closed).
        self.summary = _empty_summary()
        #: What the restore did (its ``restored`` record); None for a fresh start.
        self.restored = restored
        #: The newer checkpoints the restore passed over, with why.
        self.skipped = checkpoints.skipped
        #: The timing of every checkpoint this call committed (the drain's included).
        self.checkpoints = checkpoints.timings
        #: Operational settings this start changed against the directory's ``job.toml``.
        self.config_changes = config_changes
        #: Set when a drain stopped the run before its last step (rerun to resume).
        self.drained = controller.drain_report
        #: The checkpoint the drain committed.
        self.drain_checkpoint = drain_checkpoint


def _refuse_foreign_path(run: RunDirectory) -> None:
    """Refuse, before writing anything, a path that cannot become this run's directory."""
    if run.root.exists() and not run.root.is_dir():
        raise JobMismatchError(f"{run.root} exists and is not a directory")
    # A lock file alone is what a start that never claimed the directory leaves.
    if run.root.is_dir() and not run.job_file.exists() and _entries_but_the_lock(run):
        raise JobMismatchError(
            f"{run.root} is not empty and is not a rollout-recovery run directory (no "
            f"{run.job_file.name}); choose a new or empty --out"
        )


def _entries_but_the_lock(run: RunDirectory) -> list[str]:
    return [name for name in os.listdir(run.root) if name != run.lock_file.name]


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
    identity = saved.differences(config, which="identity")
    if identity:
        raise JobMismatchError(
            f"{run.root} holds another job's run ({run.job_file.name} differs in what the "
            "job trains: "
            + "; ".join(identity)
            + "); rerun with the same config and seed, or choose another --out",
            differences=identity,
        )
    return saved.differences(config, which="operational")


def run_job(
    out: os.PathLike[str] | str,
    config: RunConfig,
    *,
    progress: RunProgress | None = None,
    components: Callable[[RunConfig, DataPlane], JobComponents[Any]] = default_components,
    log: Callable[[str], None] = lambda message: None,
    drain_on_signals: bool = True,
) -> JobResult:
    """Start or resume the job in ``out`` and run it to the end, or until it drains.

    While it runs (from before the restore to the last checkpoint), SIGTERM, SIGINT and
    the drain file ``[job] drain_file`` drain it: ``JobResult.drained`` then says what
    the drain did, and the same call resumes. A second SIGINT during a drain raises
    ``KeyboardInterrupt`` at once (the run stays resumable). ``drain_on_signals=False``
    leaves the process's signal handlers alone (the drain file still works); signals are
    only handled when called from the main thread.
    """
    started = time.monotonic()
    run = RunDirectory(out)  # type: ignore[arg-type]
    require_ray(config)
    if wants_servers(config):
        configured_api_key(config.http)  # an unset variable is refused before any write
    if config.vllm.launch:
        # A missing vLLM venv or model, likewise (an empty [vllm] model is the torch
        # trainer's, which resolve_model checks).
        config.vllm.check_launch_paths(model=bool(config.vllm.model))
    config.metrics.check_installed()
    _refuse_foreign_path(run)
    # The model's digest is part of the job: known before the directory is compared.
    config = resolve_model(config, log)
    if run.job_file.exists():
        # Another job's directory is refused before even the lock file is touched.
        _identity_changes(run, config)
    wiring = _DrainWiring(drain_file_of(run, config), log, drain_on_signals)
    if threading.current_thread() is threading.main_thread():
        wiring.outer_sigint = signal.getsignal(signal.SIGINT)
    try:
        result, controller = asyncio.run(_job(run, config, progress, components, wiring))
    except asyncio.CancelledError:
        if wiring.interrupted:  # a second SIGINT cancelled the job's main task
            raise KeyboardInterrupt from None
        raise
    # Streamed: a process end reads the run's files in memory that follows its steps,
    # not its history's bytes (_readback.py).
    readback = RunReadback.read(run, group_size=config.job.generations_per_prompt)
    result.summary = _summary(readback, controller, time.monotonic() - started)
    _plot(run, readback, config)
    return result


async def _job(
    run: RunDirectory,
    config: RunConfig,
    progress: RunProgress | None,
    components: Callable[[RunConfig, DataPlane], JobComponents[Any]],
    wiring: _DrainWiring,
) -> tuple[JobResult, Controller[Any]]:
    """The job between its checks and its summary, every resource on one exit stack.

    Each resource is entered as soon as it is built, so whatever ends the job (its end, a
    drain, an error, a cancellation) closes what was opened, in reverse order: the metrics
    sinks, the backend, the drain triggers' signal handlers, the trail, the data plane, the
    launched servers, the directory's lock.
    """
    log = wiring.log
    async with contextlib.AsyncExitStack() as stack:
        with _outer_sigint(wiring):
            controller, changes = _open_job(stack, run, config, progress, components, wiring)
        wiring.wire(controller).install()
        result = await _run_installed(run, controller, progress, log, changes, stack)
    return result, controller


@contextlib.contextmanager
def _outer_sigint(wiring: _DrainWiring) -> Iterator[None]:
    """While the job opens its resources, Ctrl-C does what it did before ``run_job``
    (``KeyboardInterrupt`` at once, by default). ``asyncio.run``'s own handler would only
    cancel the job at its first ``await``, after blocking starts (servers, a Ray session)
    had run to their end."""
    outer = wiring.outer_sigint
    if outer is None:  # not the main thread, or a handler not set from Python
        yield
        return
    inner = signal.signal(signal.SIGINT, outer)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, inner)


def _open_job(
    stack: contextlib.AsyncExitStack,
    run: RunDirectory,
    config: RunConfig,
    progress: RunProgress | None,
    components: Callable[[RunConfig, DataPlane], JobComponents[Any]],
    wiring: _DrainWiring,
) -> tuple[Controller[Any], list[str]]:
    """Take the lock, claim the directory and open the job's resources on ``stack``, each
    as soon as it is built; returns the controller (its checkpoint store in
    ``controller.checkpoints``) and the operational changes. Synchronous: nothing else
    runs on the loop yet."""
    log = wiring.log
    stack.enter_context(run.lock())
    claimed = run.job_file.exists()
    # An existing run: its identity is checked (nothing written). A new one is claimed
    # only once its components are built: a job that cannot be built (a model that does
    # not load) leaves the directory as it found it, so the corrected job can start.
    changes = claim_run_directory(run, config) if claimed else []
    unclaimed = None if claimed else stack.enter_context(_Unclaimed.watch(run))
    # Before any store, trail or server is opened: a refused run changes nothing.
    checkpoints = CheckpointStore(run.root, keep=config.checkpoint.keep)
    # A committed checkpoint a killed re-save swapped out is put back before the newest is
    # chosen; the other leftovers go once the run is accepted (``remove_stale``), and a run
    # stopped before that puts it aside again, as it found it (after the read-ahead ends).
    checkpoints.put_back_replaced()
    stack.callback(checkpoints.undo_put_back)
    if not checkpoints.committed():
        _refuse_lost_checkpoints(run)
    else:
        AuditTrail.require_synced_history(run, checkpoints)
        # The newest checkpoint is read and its hashes checked while the servers are
        # adopted and the trainer's libraries import and its model builds (the restore
        # takes the result; a job that stops before it waits for the read to end).
        checkpoints.read_ahead()
        stack.callback(checkpoints.drop_read_ahead)
    if remove_stale_drain_request(wiring.drain_file):
        # Written after the previous job had stopped reading it (or with none running).
        log(f"removed a stale drain request ({wiring.drain_file}) from before this job started")
    if config.generation.backend == "http":
        log("backend http: [faults] is not injected; the servers' own failures are the faults")
    resolved = stack.enter_context(generation_servers(run, config, log))
    if resolved.http.servers != config.http.servers:
        count = len(resolved.http.servers)
        log(f"started {count} local generation servers (listed in {run.servers_file.name})")
    inner = _open_data_plane(stack, run, config)
    history = stack.enter_context(AuditTrail(run))
    # Worker threads (a checkpoint's save, a journal fsync, a staged put) may outlive a
    # cancelled pump. They finish before the trail, the store and the lock close;
    # asyncio.run joins them too, but only after this stack, with the lock released.
    stack.push_async_callback(_join_worker_threads)
    # The drain triggers, once wired, stay until the backend has closed: a Ctrl-C in
    # its close still finds the job's handler.
    stack.callback(wiring.unwire)
    parts = components(resolved, inner)
    stack.push_async_callback(parts.backend.aclose)
    if unclaimed is not None:
        claim_run_directory(run, config)
        unclaimed.claimed = True
    store = checkpoints
    controller = Controller(
        config=config,
        dataset=parts.dataset,
        backend=parts.backend,
        trainer=parts.trainer,
        data_plane=inner,
        history=history,
        checkpoint_store=store,
        progress=progress,
        samples=parts.samples,
    )
    return controller, changes


@dataclass(slots=True)
class _Unclaimed:
    """A directory this start found without ``job.toml`` (empty but for the lock): until
    the start claims it, whatever it creates there is removed if it stops, and the
    directory's mode is put back."""

    run: RunDirectory
    before: frozenset[str]
    mode: int
    claimed: bool = False

    @classmethod
    @contextlib.contextmanager
    def watch(cls, run: RunDirectory) -> Iterator[_Unclaimed]:
        found = cls(run, frozenset(os.listdir(run.root)), run.root.stat().st_mode & 0o7777)
        # What the start writes holds prompts, rewards and server names: owner only.
        os.chmod(run.root, 0o700)
        try:
            yield found
        finally:
            if not found.claimed:
                found.forget()

    def forget(self) -> None:
        for entry in self.run.root.iterdir():
            if entry.name in self.before:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        os.chmod(self.run.root, self.mode)


async def _join_worker_threads() -> None:
    await asyncio.get_running_loop().shutdown_default_executor()


def _open_data_plane(
    stack: contextlib.AsyncExitStack, run: RunDirectory, config: RunConfig
) -> DataPlane:
    """The job's store, entered on ``stack``; a store that cannot be opened (a corrupt or
    torn file) stops the run as one a rerun cannot continue."""
    try:
        return stack.enter_context(job_data_plane(run, config))
    except InvalidStateError as error:
        raise RunNotResumableError(
            f"the data plane cannot be opened: {error}",
            remedy="Restore the data plane's files from a backup, or start a new run in "
            "another directory.",
        ) from error


async def _run_installed(
    run: RunDirectory,
    controller: Controller[Any],
    progress: RunProgress | None,
    log: Callable[[str], None],
    changes: list[str],
    stack: contextlib.AsyncExitStack,
) -> JobResult:
    config = controller.config
    checkpoints = controller.checkpoints
    store = checkpoints.store
    try:
        found = checkpoints.newest_restorable()
    except CheckpointDirectoryError as error:
        raise RunNotResumableError(
            f"no checkpoint in {store.directory} can be restored ({error})",
            remedy="Nothing was changed. Restore what the reasons name from a backup (the "
            "checkpoints, the history, or the job.toml they were written with), or start a "
            "new run in another directory.",
        ) from error
    if found is not None:
        # Before the restore changes anything (it cuts the metrics back to the checkpoint).
        AuditTrail.require_synced_metrics(run, found.name, found.marks.get(run.metrics.name, 0))
        _refuse_fewer_steps(config, found.name, prompts_taken=found.prompts_taken)
    # Accepted: what a save killed mid-way left behind goes now, not in a refused run.
    store.remove_stale()
    restored = None
    if found is None:
        if progress is not None:
            progress.start(config.job.steps, None)
        await _start_fresh(controller)
        run.append_run_log("start", step=0)
    else:
        for skip in checkpoints.skipped:
            log(f"skipping checkpoint {skip}")
        restored = await controller.restore(found)
        if progress is not None:
            progress.start(config.job.steps, restored.step)
        run.append_run_log(
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
    controller.follow_journal()
    # The job's config is the tools' run config; the console shows each step's samples.
    console: list[tuple[str, ConsoleSamples]] = []
    if isinstance(progress, ShowsSamples):
        console.append(("console", ConsoleSamples(progress)))
    metrics = _tool_sinks(config).open(
        run.root,
        resume_step=controller.step,
        job_config=config_to_builtins(config),
        also=console,
    )
    controller.set_metrics(metrics)
    # A sink may block on its tool (a flush, a network call): closed off the loop.
    stack.push_async_callback(asyncio.to_thread, metrics.close)
    if restored is not None:
        metrics.log_marker(
            restored.step,
            "restored",
            {
                "checkpoint": restored.checkpoint,
                "replayed_records": restored.replayed_records,
                "seals_lost": restored.seals_lost,
                "tokens_lost": restored.tokens_regenerated,
                "tokens_reused": restored.tokens_reused,
                "rolled_back_steps": len(restored.rolled_back_steps),
            },
        )

    if found is None:
        await controller.checkpoint()  # the bootstrap anchor: every later start can resume
    controller.set_checkpointer(
        controller.checkpoint_in_background
        if config.checkpoint.background
        else controller.checkpoint
    )
    await controller.run()
    drain_checkpoint = None
    if controller.drain_report is not None:
        drain_checkpoint = await _checkpoint_drain(run, controller, log)
    return JobResult(
        controller, restored=restored, config_changes=changes, drain_checkpoint=drain_checkpoint
    )


async def _checkpoint_drain(
    run: RunDirectory, controller: Controller[Any], log: Callable[[str], None]
) -> str:
    """The drain's checkpoint: the journal up to the drain, the trainer idle."""
    drained = controller.drain_report
    assert drained is not None
    timing = await controller.checkpoint(delete_deferred=False)
    run.append_run_log("drain", step=drained.step, checkpoint=timing.name, reason=drained.reason)
    log(
        f"drained ({drained.reason}) at step {drained.step}: waited {drained.waited_s:.2f} s "
        f"of the {drained.grace_s:g} s grace for {drained.in_flight} attempts in flight, "
        f"{drained.cut_short} still running at its end; {drained.abandoned} abandoned "
        f"(reason drain); checkpoint {timing.name} committed"
    )
    return timing.name


@dataclass(slots=True)
class _DrainWiring:
    """What the job needs to wire drain triggers once its controller exists."""

    drain_file: Path
    log: Callable[[str], None]
    signals: bool
    triggers: DrainTriggers | None = None
    #: The SIGINT handler the process had before the job's event loop.
    outer_sigint: Any = None

    @property
    def interrupted(self) -> bool:
        return self.triggers is not None and self.triggers.interrupted

    def wire(self, controller: Controller[Any]) -> DrainTriggers:
        self.triggers = DrainTriggers(
            controller, drain_file=self.drain_file, log=self.log, signals=self.signals
        )
        return self.triggers

    def unwire(self) -> None:
        """Put the process's signal handlers back (nothing if never wired)."""
        if self.triggers is not None:
            self.triggers.uninstall()


def _tool_sinks(config: RunConfig) -> MetricsConfig:
    """The ``[metrics]`` sinks beyond ``metrics.jsonl``, which the trail always writes."""
    return msgspec.structs.replace(
        config.metrics, sinks=tuple(s for s in config.metrics.sinks if s != "jsonl")
    )


def _refuse_lost_checkpoints(run: RunDirectory) -> None:
    """No committed checkpoint: start fresh only if nothing here shows an earlier run.

    An earlier run always commits a checkpoint before its first piece of work, so work
    without a checkpoint means the checkpoints were lost, and starting over would throw
    the run's history away. Reads only files that exist, so a refusal creates none.
    """
    found: list[str] = []
    if run.events.is_file():
        try:
            committed = sum(
                1 for _ in AuditTrail.stream_history(run, events={"checkpoint_committed"})
            )
        except InvalidStateError:
            found.append(f"{run.events.name} (unreadable)")
        else:
            if committed:
                found.append(f"{run.events.name} ({committed} checkpoint records)")
    if run.metrics.is_file() and run.metrics.stat().st_size:
        found.append(f"{run.metrics.name} (trained steps)")
    if any(entry.event == "resume" for entry in _run_log_entries(run)):
        found.append(f"{run.run_log.name} (resumes)")
    rows = 0
    for path in run.data_plane_files():
        try:
            with SqliteDataPlane(path) as store:
                rows += len(store.keys(CaptureWriter.staging_partition)) + len(
                    store.keys(ReplayIndex.canonical_partition)
                )
        except InvalidStateError:
            found.append(f"{path.name} (unreadable)")
    if rows:
        found.append(f"the data plane ({rows} rows)")
    if found:
        raise RunNotResumableError(
            f"{run.root} holds an earlier run but no usable checkpoint "
            f"({run.checkpoints_dir.name}/ is missing or empty); found: " + ", ".join(found),
            remedy="Nothing was deleted. Restore the checkpoints directory, or start a new "
            "run in another directory.",
        )


def _refuse_fewer_steps(config: RunConfig, checkpoint: str, *, prompts_taken: int) -> None:
    """Refuse, before the restore changes anything, fewer ``job.steps`` than the run has
    taken prompts for: every prompt taken must be trained (the audit proves it), and the
    steps past ``job.steps`` would never train, so their groups would wait for a step
    that never comes. The message names the number to use."""
    job = config.job
    taken = prompts_taken // job.prompts_per_step
    if job.steps < taken:
        raise ConfigError(
            f"this run has taken the prompts of {taken} steps ({checkpoint} and the journal "
            f"after it), more than the {job.steps} it is asked for: every prompt taken is "
            f"trained. Rerun with job.steps = {taken} or more (an operational setting); "
            "nothing was changed",
            path="$.job.steps",
        )


def _run_log_entries(run: RunDirectory) -> list[Any]:
    try:
        return list(run.read_run_log())
    except ValueError:
        return []


async def _start_fresh(controller: Controller[Any]) -> None:
    """No checkpoint and no earlier work: whatever a run killed before its first
    checkpoint left (a header, an empty store) is void."""
    store = controller.data_plane.inner
    async with controller.barrier.mutation("recovery_restore") as cut:
        for partition in (CaptureWriter.staging_partition, ReplayIndex.canonical_partition):
            store.clear(partition, store.keys(partition), cut=cut)
        controller.history.start_over()


def _tenth_means(rewards: list[float]) -> tuple[float | None, float | None]:
    if not rewards:
        return None, None
    tenth = max(1, math.ceil(len(rewards) / 10))
    return sum(rewards[:tenth]) / tenth, sum(rewards[-tenth:]) / tenth


def _empty_summary() -> RunSummary:
    return RunSummary(0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, None, None)


def _summary(run: RunReadback, controller: Controller[Any], wall_time: float) -> RunSummary:
    counters = controller.state.counters
    first, last = _tenth_means(run.rewards)
    return RunSummary(
        steps=controller.step,
        prompts_taken=counters.prompts_taken,
        prompts_trained=counters.prompts_trained,
        prompts_dropped=counters.prompts_dropped,
        attempts=counters.attempts,
        retries=counters.retries,
        calls_resumed=counters.calls_resumed,
        checkpoints=counters.checkpoints,
        restores=len(run.restarts),
        longest_checkpoint_stall_s=counters.longest_checkpoint_stall_us / 1e6,
        wall_time_s=wall_time,
        first_tenth_reward=first,
        last_tenth_reward=last,
        valid_row_fraction=(
            (counters.valid_rows_trained - run.refused_rows) / counters.rows_trained
            if counters.rows_trained
            else None
        ),
        steps_refused=run.refused_steps,
        parts=run.parts,
        time_shares=run.time_shares,
        restored=run.restored,
    )


def _plot(run: RunDirectory, readback: RunReadback, config: RunConfig) -> None:
    write_reward_plot(
        run.plot,
        steps=readback.steps,
        mean_rewards=readback.mean_rewards,
        restarts=readback.restarts,
        checkpoints=readback.checkpoints,
        title=f"rollout-recovery: mean reward per step (seed {config.job.seed})",
    )
