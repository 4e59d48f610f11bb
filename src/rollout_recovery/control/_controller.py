"""The controller: one asyncio process that owns every prompt from dataloader to trainer.

It follows the walk of one prompt (docs/ARCHITECTURE.md, "control"):

1. the rollout pump reserves a dataloader batch in one ``prompt_reservations`` cut, so the
   cursor and the ledger move together;
2. it waits, outside any cut, until the batch is inside the staleness window, then admits
   it (target step = batch number) in one cut;
3. a task per group dispatches the unsealed siblings, each attempt under a deadline;
4. seals land in ``sibling_seals`` cuts (a prompt-group cohort all at once); a failed round
   abandons unsealed work and mints fresh attempts, within the group's round budget; an
   exhausted budget drops the prompt with a reason and credits its step's shortfall;
5. a sealed group is published in one ``group_commits`` cut;
6. the train pump waits (bounded) for a step's groups, computes GRPO advantages, trains,
   and clears the consumed rows in a ``sample_clears`` cut;
7. every K steps a checkpoint captures ledger, replay index, controller state and policy in
   one exclusive cut and writes them after releasing it. The controller's collaborator
   ``ControllerCheckpoints`` (``_checkpointing.py``) takes, verifies and restores them; the
   controller applies what it returns (:meth:`Controller.checkpoint`,
   :meth:`Controller.restore`).

A backend returns an attempt's failure as a value (``AttemptFailure``); anything it or
the trainer raises stops the run, and so does a failure that is not retryable (a closed
backend): the next start resumes from the newest committed checkpoint. A drain
(:meth:`Controller.request_drain`: SIGTERM, Ctrl-C, a drain file) stops it on purpose:
no new reservations, admissions or rounds; attempts already dispatched get
``[job] drain_grace_s`` to finish and seal (those queued behind the in-flight limit do
not start), the rest are abandoned with reason ``drain``; ``run`` then returns and the
caller takes the checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from .._clock import monotonic, off_loop
from .._crashpoints import crash_point
from .._cut import MutationCut
from .._sampler import dataset_position_to_idx
from ..capture import CaptureWriter, StagedPrefix
from ..dataplane import (
    DataPlane,
    DataPlaneCheckpointBarrier,
    ReplayIndex,
    Row,
)
from ..errors import (
    GenerationError,
    InvalidArgumentError,
    LivenessError,
    NoValidRowsError,
    StepShortfallError,
)
from ..finalize import CanonicalRowMeta, finalize_group, grpo_advantages
from ..history import AuditTrail
from ..history.records import (
    AbandonedAttempt,
    AttemptsAbandoned,
    BackendEvent,
    BatchAdmitted,
    DropReason,
    FreshAttempt,
    GroupPublished,
    GroupSealed,
    HistoryRecord,
    PromptDropped,
    PromptTaken,
    Restored,
    RoundStarted,
    Seal,
    SiblingSealed,
    StepTrained,
    TrainedRow,
)
from ..ledger import (
    PromptGroupPhase,
    PromptGroupRecoveryRecord,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
)
from ..policy import Trainer, TrainSample
from ..rewards import CaptureRewardSettings
from ..rollout import (
    AttemptFailure,
    AttemptRequest,
    AttemptResult,
    BackendStartup,
    BackendTelemetry,
    FailureReason,
    GenerationBackend,
)
from ..rundir import CheckpointStore
from ._checkpointing import (
    CapturedCheckpoint,
    CheckpointTiming,
    ControllerCheckpoints,
    VerifiedCheckpoint,
)
from ._config import RunConfig
from ._deferred import DeferredDeletionDataPlane
from ._logprob_check import (
    BlamesServers,
    guilty_rows,
    logprob_refusal,
    refusal_message,
    token_versions,
    trainer_weights_generate,
)
from ._resume import choose_prefixes, resumed_record, version_filter
from ._state import ControllerState
from ._step_record import StepRecord
from ._step_timing import StepTimer
from ._transitions import OUTSIDE_ANY_CUT, Transitions, admission_id_of, fresh_rollout_id

T = TypeVar("T")
Weights = TypeVar("Weights")

__all__ = ["Controller", "DrainReport", "PromptDataset", "StepMetrics", "StepProgress"]


class PromptDataset(Protocol):
    """A map-style dataset: ``dataset[idx]`` rebuilds the same prompt after a restart."""

    def __len__(self) -> int: ...

    def __getitem__(self, idx: int) -> dict[str, Any]: ...


class StepProgress(Protocol):
    """What the controller reports every trained step to: the job's progress display
    (the CLI's bar), which the job starts and owns; any object with this method."""

    def update(
        self,
        *,
        step: int,
        mean_reward: float | None,
        in_flight: int,
        retries: int,
        checkpoints: int,
    ) -> None: ...

    def log(self, message: str) -> None:
        """One line for the operator (a refused step)."""


class StepMetrics(Protocol):
    """Where the controller writes each step's metrics and the run's markers besides
    ``metrics.jsonl``: the job's ``[metrics]`` sinks (``MetricsConfig.open``), any
    object with these methods."""

    def log_record(self, step: int, record: Mapping[str, object]) -> None: ...

    def log_marker(
        self, step: int, kind: str, fields: Mapping[str, str | int | float | None]
    ) -> None: ...

    def flush(self) -> None: ...


@dataclass(slots=True)
class _Signals:
    """One condition for every "something changed" wait (publish, drop, train step)."""

    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
        try:
            async with asyncio.timeout(timeout), self.changed:
                await self.changed.wait_for(predicate)
        except TimeoutError:
            raise LivenessError(what, timeout) from None


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What a drain did; ``Controller.drain_report`` once ``run`` returned after one."""

    #: What asked for it (``"SIGTERM"``, ``"drain file DIR/DRAIN"``, ...).
    reason: str
    #: The step a rerun resumes at.
    step: int
    grace_s: float
    #: Attempts running when the drain began.
    in_flight: int
    #: Attempts still running when the grace ran out (cancelled, then abandoned).
    cut_short: int
    #: Attempts abandoned with reason ``drain``: cut short, or still queued behind
    #: ``generation.max_inflight_attempts`` (never started).
    abandoned: int
    #: On the event loop's clock, from the request to the end of the wait for attempts.
    waited_s: float


@dataclass(frozen=True, slots=True)
class _DrainRequest:
    reason: str
    #: The event loop's time of the request (None: asked before the loop ran).
    asked_at: float | None
    #: Attempts running at the request.
    in_flight: int


class Controller(Generic[Weights]):
    """Owns the barrier, the ledger, the replay index and the pumps of one run.

    ``Weights`` is what the trainer hands the backend after every step: one type
    parameter for both, so the type checker proves the backend can load the trainer's
    weights (``PolicySnapshot`` for the numpy policy, ``TorchWeights`` for the torch one).
    """

    def __init__(
        self,
        *,
        config: RunConfig,
        dataset: PromptDataset,
        backend: GenerationBackend[Weights],
        trainer: Trainer[Weights],
        data_plane: DataPlane,
        history: AuditTrail,
        checkpoint_store: CheckpointStore,
        progress: StepProgress | None = None,
        reward_settings: CaptureRewardSettings | None = None,
        samples: Callable[[int, Sequence[Row]], Mapping[str, Any]] | None = None,
    ) -> None:
        self.config = config
        self.dataset = dataset
        self.backend = backend
        self.trainer = trainer
        self.history = history
        self.progress = progress
        self.settings = reward_settings or CaptureRewardSettings.from_configs()
        self.barrier = DataPlaneCheckpointBarrier()
        self.ledger = RolloutRecoveryLedger()
        self.data_plane = DeferredDeletionDataPlane(data_plane, keep=config.checkpoint.keep)
        self.replay = ReplayIndex(
            data_plane=self.data_plane, group_size=config.job.generations_per_prompt
        )
        self.capture = CaptureWriter(self.data_plane)
        #: Whether a sample's version stamp names weights the trainer handed out, so the
        #: trainer may check its logprobs against its own (``_logprob_check.py``).
        self._vouch_versions = trainer_weights_generate(config)
        #: Everything a checkpoint persists of the controller, in one object; it changes
        #: only by folding in the records the controller appends (``record``).
        self.state = ControllerState.initial(trainer.weight_version)
        #: The checkpoints in ``checkpoint_store``: taken, verified and restored by this
        #: collaborator, built with what it reads; the controller applies what it returns.
        self.checkpoints = ControllerCheckpoints(
            store=checkpoint_store,
            config=config,
            ledger=self.ledger,
            rows=self.data_plane,
            trainer=trainer,
            history=history,
            barrier=self.barrier,
            settings=self.settings,
            dataset=dataset,
        )
        #: Where each step's metrics and the run's markers go besides metrics.jsonl
        #: (TensorBoard, W&B, MLflow); opened by the job once it knows the resume step
        #: (:meth:`set_metrics`).
        self.metrics: StepMetrics | None = None
        #: What a step's metrics record adds about the canonical rows it trained (the LLM
        #: job's sample completions and reward components).
        self.samples = samples
        # Runtime only.
        self.in_flight = 0
        self.last_mean_reward: float | None = None
        self._signals: _Signals | None = None
        self._inflight_slots: asyncio.Semaphore | None = None
        self._tasks: asyncio.TaskGroup | None = None
        self._checkpointer: Callable[[], Any] | None = None
        #: The checkpoint being written in the background (:meth:`checkpoint_in_background`).
        self._pending_checkpoint: asyncio.Future[CheckpointTiming] | None = None
        #: Where each step's wall time goes (the ``time/*`` step metrics).
        self.step_timer = StepTimer()
        # Drain: the request, the event ``run`` waits on, the group tasks it waits for,
        # and the rollout ids it abandoned.
        self._drain: _DrainRequest | None = None
        self._drain_asked: asyncio.Event | None = None
        self._group_tasks: set[asyncio.Task[None]] = set()
        self._drain_abandoned: set[str] = set()
        #: Set when ``run`` returned because of a drain.
        self.drain_report: DrainReport | None = None

    # ------------------------------------------------------------------ history

    @property
    def transitions(self) -> Transitions:
        """The one transition of every record, over this controller's ledger, replay
        index, store and state (the same code a journal replay runs)."""
        return Transitions(
            ledger=self.ledger, replay=self.replay, state=self.state, rows=self.data_plane
        )

    def record(
        self,
        record: HistoryRecord,
        *,
        cut: MutationCut = OUTSIDE_ANY_CUT,
        canonical_rows: Mapping[str, Row] | None = None,
    ) -> None:
        """Apply ``record`` (its one transition: ledger, replay index, rows, state), then
        append it to the journal: a record whose transition refuses is never journaled,
        and a replay of the journal arrives at the same state. ``cut`` is the barrier
        section the record describes (required for a record that changes the ledger);
        ``canonical_rows`` the rows a ``group_published`` puts."""
        self.transitions.apply(cut, record, canonical_rows=canonical_rows)
        self.history.append(record)

    def record_all(
        self,
        records: Sequence[HistoryRecord],
        *,
        cut: MutationCut,
        prompts: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> None:
        """``record`` for one cut's records, appended in one write once all applied: a
        kill keeps all or none. ``prompts[i]`` is the dataset's prompt of a
        ``prompt_taken`` ``records[i]``."""
        transitions = self.transitions
        given = [None] * len(records) if prompts is None else prompts
        for record, prompt in zip(records, given, strict=True):
            transitions.apply(cut, record, prompt=prompt)
        self.history.append_all(records)

    # ------------------------------------------------------------------ checkpoints

    async def restore(self, verified: VerifiedCheckpoint) -> Restored:
        """Restore ``verified`` (found by ``checkpoints.newest_restorable()``) and replay
        the journal after it, in one ``recovery_restore`` cut: the collaborator restores
        the ledger and the rows and returns the replay index and state to run on, and the
        records this controller journals (``restored``, the restart's abandons). Returns
        the ``restored`` record, the restore's report. A refusal is a
        ``RunNotResumableError`` naming the checkpoint (``checkpoints.refusing``)."""
        with self.checkpoints.refusing(verified):
            async with self.barrier.mutation("recovery_restore") as cut:
                restored = self.checkpoints.restore(cut, verified)
                self.replay = restored.replay
                self.state = restored.state
                self.record(restored.record, cut=cut)
                for abandoned in restored.abandoned:
                    self.record(abandoned, cut=cut)
            await self.history.flush()
            self.backend.update_weights(self.trainer.weight_version, self.trainer.weights())
        return restored.record

    def follow_journal(self) -> None:
        """Start the checkpoints' snapshot builder at the journal's end. Call once the
        state is what the journal says up to there (a fresh start or a finished restore):
        from then on the builder follows the journal alone."""
        self.checkpoints.follow_journal(replay=self.replay, state=self.state)

    async def checkpoint(self, *, delete_deferred: bool = True) -> CheckpointTiming:
        """Take a checkpoint of the journal at its current position and journal its
        ``checkpoint_committed`` (``delete_deferred``: see ``ControllerCheckpoints.commit``),
        all awaited; a checkpoint still being written in the background commits first."""
        await self.settle_checkpoint()
        captured = await self.checkpoints.capture()
        return await self._commit(captured, delete_deferred=delete_deferred)

    async def checkpoint_in_background(self) -> None:
        """Capture a checkpoint now (the hold's position and the trainer's state copied to
        memory: what the step pays) and write, publish and journal it in the background
        while the next steps train (``[checkpoint] background``).

        At most one is in flight: this first awaits the previous one. Within :meth:`run`,
        a failed write fails the run at once; a drain and the run's end wait for it; an
        error elsewhere lets it finish first. :meth:`settle_checkpoint` awaits it.
        """
        await self.settle_checkpoint()
        captured = await self.checkpoints.capture()
        write = asyncio.ensure_future(self._commit(captured, delete_deferred=True))
        self._pending_checkpoint = write
        if self._tasks is not None:
            self._tasks.create_task(_surfaced(write), name="checkpoint-write")

    async def settle_checkpoint(self) -> CheckpointTiming | None:
        """Wait for the checkpoint being written in the background, if any; its timing, or
        its error (raised again by every later call)."""
        write = self._pending_checkpoint
        if write is None:
            return None
        # Shielded: a waiter cancelled (the run failing elsewhere) leaves the write going.
        timing = await asyncio.shield(write)
        self._pending_checkpoint = None
        return timing

    async def _commit(
        self, captured: CapturedCheckpoint, *, delete_deferred: bool
    ) -> CheckpointTiming:
        timing = await self.checkpoints.commit(captured, delete_deferred=delete_deferred)
        committed = timing.committed()
        # After the records of whatever ran during the write: its position says what it
        # snapshots, wherever the record lands (replay and audit read the position).
        self.record(committed)
        if self.metrics is not None:
            self.metrics.log_marker(
                committed.step,
                "checkpoint_committed",
                {"name": committed.name, "hold_us": committed.hold_us},
            )
            await asyncio.to_thread(self.metrics.flush)
        return timing

    async def _finish_checkpoint_after(self, error: BaseException) -> None:
        """The run failed (``error``): let a checkpoint being written commit first, as it
        would have before the next step in the foreground; its own failure is noted on
        ``error``."""
        write = self._pending_checkpoint
        if write is None:
            return
        try:
            await self.settle_checkpoint()
        except Exception as late:  # the run's error is the one raised
            if late is not error:
                error.add_note(
                    f"the checkpoint being written failed too: {type(late).__name__}: {late}"
                )

    def set_metrics(self, metrics: StepMetrics) -> None:
        """Where each step's metrics and the run's markers go from now on."""
        self.metrics = metrics

    # ------------------------------------------------------------------ running

    @property
    def step(self) -> int:
        """The next step to train."""
        return self.state.step

    @property
    def total_steps(self) -> int:
        return self.config.job.steps

    @property
    def _batch_size(self) -> int:
        return self.config.job.prompts_per_step

    @property
    def _min_groups_per_step(self) -> int:
        job = self.config.job
        return math.ceil(job.min_step_fraction * job.prompts_per_step)

    def set_checkpointer(self, checkpoint: Callable[[], Any]) -> None:
        """``checkpoint()`` is awaited after every K-th step and after the last one."""
        self._checkpointer = checkpoint

    async def run(self) -> None:
        """Run until every step is trained, or until a drain ends the run early
        (``drain_report`` then says what it did; the caller takes the checkpoint).
        Redispatches restored work first."""
        self._signals = _Signals()
        self._inflight_slots = asyncio.Semaphore(self.config.generation.max_inflight_attempts)
        self._drain_asked = asyncio.Event()
        if self._drain is not None:
            # Asked before the run began (during a restore): nothing is in flight.
            self._report_drain(cut_short=0, waited_s=0.0)
            return
        if isinstance(self.backend, BackendStartup):
            # Before the first dispatch, outside every attempt deadline (see the protocol).
            await self.backend.start()
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                rollout = tasks.create_task(self._rollout_pump(), name="rollout-pump")
                train = tasks.create_task(self._train_pump(), name="train-pump")
                asked = asyncio.ensure_future(self._drain_asked.wait())
                try:
                    await asyncio.wait({train, asked}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    asked.cancel()
                # The train pump may have seen the drain first and returned already.
                if self._drain is not None and self.state.step < self.total_steps:
                    await self._drain_run(rollout, train)
        except BaseExceptionGroup as group:
            # The first failure is the cause; the rest are its consequences (cancelled
            # siblings). Callers branch on the error's class, not on a group.
            error = _first_failure(group)
            await self._finish_checkpoint_after(error)
            raise error from None
        except asyncio.CancelledError:
            # Cancelled from outside (a second Ctrl-C): no waiting. A write stopped here
            # is a crash's (the previous checkpoint stays the newest, or this one is
            # published without its record); its worker thread is joined by the job.
            if self._pending_checkpoint is not None:
                self._pending_checkpoint.cancel()
            raise
        finally:
            self._tasks = None
        await self.settle_checkpoint()  # the last step's or the drain's step's

    def _launch(self, group_id: str) -> None:
        assert self._tasks is not None
        task = self._tasks.create_task(self._run_group(group_id), name=f"group-{group_id}")
        # A drain waits for these (their rounds in flight), then cancels what is left.
        self._group_tasks.add(task)
        task.add_done_callback(self._group_tasks.discard)

    @property
    def _wait_budget(self) -> float:
        return self.config.liveness.step_timeout_s

    # ------------------------------------------------------------- rollout pump

    async def _rollout_pump(self) -> None:
        # Restored work first: admitted groups may be the only ones that can advance the
        # trainer and open the admission gate; then reserved batches, once per admission.
        # A restore that rolled training back can leave groups admitted for a step beyond
        # the window again (admitted when the trainer was further along): they wait for
        # the window like a fresh admission, or they would sample from weights older than
        # the window allows (and a staleness-0 run would stop being deterministic).
        restored = self.ledger.groups()
        waiting: dict[int, list[str]] = {}
        window = self.config.job.staleness_window
        for group in restored:
            if group.phase is PromptGroupPhase.ADMITTED:
                target = group.target_step
                if target is None or target <= self.state.step + window:
                    self._launch(group.group_id)
                else:
                    waiting.setdefault(target, []).append(group.group_id)
        for target, group_ids in sorted(waiting.items()):
            await self._wait_for_window(target)
            for group_id in group_ids:
                self._launch(group_id)
        reserved: dict[str, list[str]] = {}
        for group in restored:
            if group.phase is PromptGroupPhase.RESERVED:
                reserved.setdefault(group.admission_id, []).append(group.group_id)
        for admission_id, group_ids in sorted(reserved.items()):
            await self._admit(_batch_of(admission_id), group_ids)
        while (batch := self.state.prompts_taken // self._batch_size) < self.total_steps:
            group_ids = await self._reserve_batch(batch)
            await self._admit(batch, group_ids)

    async def _reserve_batch(self, batch: int) -> list[str]:
        job = self.config.job
        state = self.state
        taken: list[PromptTaken] = []
        prompts: list[Mapping[str, Any] | None] = []
        async with self.barrier.mutation("prompt_reservations") as cut:
            for position in range(state.prompts_taken, state.prompts_taken + self._batch_size):
                idx = dataset_position_to_idx(position, size=len(self.dataset), seed=job.seed)
                prompt = self.dataset[idx]
                group_id = f"g{position:07d}"
                taken.append(
                    PromptTaken(
                        group_id=group_id,
                        prompt_idx=idx,
                        position=position,
                        batch=batch,
                        task_name=prompt.get("task_name"),
                        task_source=prompt.get("task_source"),
                        granularity=(
                            RecoveryGranularity.PROMPT_GROUP
                            if prompt.get("task_source") == "atomic"
                            else RecoveryGranularity.SIBLING
                        ),
                        weight_version=state.weight_version,
                        # Minted here, so the record names the attempts it reserves.
                        attempts=[
                            fresh_rollout_id(group_id, i) for i in range(job.generations_per_prompt)
                        ],
                    )
                )
                prompts.append(prompt)
            # The batch is one cut: the journal gets all of it or none of it.
            self.record_all(taken, cut=cut, prompts=prompts)
        return [record.group_id for record in taken]

    async def _wait_for_window(self, batch: int) -> None:
        """Until generation for ``batch`` (its target step) is inside the staleness window."""
        assert self._signals is not None
        window = self.config.job.staleness_window
        await self._signals.wait_for(
            lambda: batch <= self.state.step + window,
            # Admission waits on training, which waits at most one budget per step.
            timeout=self._wait_budget * (window + 2),
            what=f"the staleness window to admit batch {batch} (trainer at step {self.step})",
        )

    async def _admit(self, batch: int, group_ids: Sequence[str]) -> None:
        """Admit one batch (target step = batch) once it is inside the staleness window."""
        await self._wait_for_window(batch)
        async with self.barrier.mutation("prompt_reservations") as cut:
            self.record(
                BatchAdmitted(
                    batch=batch,
                    group_ids=list(group_ids),
                    target_step=batch,
                    weight_version=self.state.weight_version,
                ),
                cut=cut,
            )
        for group_id in group_ids:
            self._launch(group_id)

    # ------------------------------------------------------------ one group

    async def _run_group(self, group_id: str) -> None:
        while self.ledger.get_group(group_id).status is not PromptGroupStatus.READY_TO_FINALIZE:
            if self._drain is not None:
                return  # no new round while draining: the resumed run starts it
            if not await self._run_round(group_id):
                return
        await self._publish(group_id)

    async def _run_round(self, group_id: str) -> bool:
        """One generation round of an unfinished group; False once its prompt is dropped.

        A round of its own so the stateful test can drive rounds one at a time.
        """
        retry = self.config.retry
        state = self.state
        if state.rounds_used.get(group_id, 0) >= retry.max_rounds:
            await self._drop(
                group_id,
                reason=DropReason.RETRY_BUDGET_EXHAUSTED,
                detail=f"retry budget exhausted after {retry.max_rounds} rounds",
            )
            return False
        async with self.barrier.mutation("recovery_retries") as cut:
            dispatched = _next_round(self.ledger.get_group(group_id))
            self.record(
                RoundStarted(
                    group_id=group_id,
                    round=state.rounds_used.get(group_id, 0) + 1,
                    dispatched=dispatched,
                    weight_version=state.weight_version,
                ),
                cut=cut,
            )
            record = self.ledger.get_group(group_id)
        pending = [attempt.generation_index for attempt in dispatched]
        failures = await self._generate(record, pending)
        if failures:
            await self._abandon(group_id, failures)
            final = next((f for f in failures if not f.reason.is_retryable()), None)
            if final is not None and self._drain is None:
                # A closed backend generates nothing more: spending the group's rounds on
                # it would drop prompts a rerun can still generate, so the run stops (and
                # the state gives the round back: ``_state._NOT_RETRIES``).
                raise GenerationError(
                    final.reason,
                    f"group {group_id}: attempt {final.rollout_id}: {final.detail}; "
                    "the generation backend was closed under a running job",
                    worker=final.worker,
                )
            await asyncio.sleep(retry.backoff_s)
        return True

    async def _generate(
        self, record: PromptGroupRecoveryRecord, pending: Sequence[int]
    ) -> list[AttemptFailure]:
        """Run one round of ``pending`` siblings; seal what succeeds, return what failed."""
        prompt = record.prompt_payload
        requests = [
            AttemptRequest(
                group_id=record.group_id,
                generation_index=index,
                rollout_id=record.gate_rollout_id(index),
                prompt=prompt,
                weight_version=self.state.weight_version,
            )
            for index in pending
        ]
        atomic = record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP
        outcomes: dict[int, AttemptResult | AttemptFailure] = {}
        prefixes = await self._resumable(record, pending)

        async def one(request: AttemptRequest) -> None:
            outcome = await self._attempt(request, prefixes.get(request.generation_index))
            outcomes[request.generation_index] = outcome
            if not atomic and isinstance(outcome, AttemptResult):
                await self._seal_sibling(record.group_id, request.generation_index, outcome)

        async with asyncio.TaskGroup() as round_tasks:
            for request in requests:
                round_tasks.create_task(one(request))
        failures = [o for o in outcomes.values() if isinstance(o, AttemptFailure)]
        if atomic and not failures:
            results = {i: o for i, o in outcomes.items() if isinstance(o, AttemptResult)}
            await self._seal_cohort(record.group_id, results)
        return sorted(failures, key=lambda f: f.generation_index)

    async def _resumable(
        self, record: PromptGroupRecoveryRecord, pending: Sequence[int]
    ) -> dict[int, StagedPrefix]:
        """The staged calls of lost attempts that ``pending`` siblings continue (call-level
        resume), journaled before they are handed over; {} when nothing was lost."""
        retried = [i for i in pending if len(record.siblings[i].attempts) > 1]
        if not retried or self.config.recovery.resume != "call":
            return {}
        keeps = version_filter(self.config.recovery.reuse, lineage=(), restore=False)
        # On the loop, like the controller's other store reads: a few rows, and only for
        # siblings whose attempt was lost.
        choices = choose_prefixes(
            record, retried, self.data_plane, keeps=keeps, include_current=False
        )
        if not choices:
            return {}
        async with self.barrier.mutation("recovery_retries") as cut:
            self.record_all(
                [
                    resumed_record(record.group_id, i, record.gate_rollout_id(i), choice)
                    for i, choice in sorted(choices.items())
                ],
                cut=cut,
            )
        return {i: c.prefix for i, c in choices.items() if c.prefix is not None}

    async def _attempt(
        self, request: AttemptRequest, prefix: StagedPrefix | None = None
    ) -> AttemptResult | AttemptFailure:
        assert self._inflight_slots is not None
        queued = self._inflight_slots.locked()
        async with self._inflight_slots:
            if queued and self._drain is not None:
                # It waited behind the in-flight limit into a drain: it never starts.
                self._drain_abandoned.add(request.rollout_id)
                return AttemptFailure(
                    rollout_id=request.rollout_id,
                    generation_index=request.generation_index,
                    reason=FailureReason.DRAIN,
                    detail="queued behind the in-flight limit when the run drained",
                )
            self.in_flight += 1
            deadline = asyncio.timeout(self.config.generation.attempt_deadline_s)
            try:
                # A backend returns its failures; anything it raises is a bug or bad state
                # and stops the run (a raised GenerationError included: it is a backend
                # that broke the protocol, not a failed attempt).
                async with deadline:
                    return await self.backend.run_attempt(request, self.capture, prefix)
            except TimeoutError:
                if not deadline.expired():
                    raise  # the backend's own TimeoutError: a bug, not a missed deadline
                # The one failure only the controller sees.
                return AttemptFailure(
                    rollout_id=request.rollout_id,
                    generation_index=request.generation_index,
                    reason=FailureReason.DEADLINE_EXCEEDED,
                    detail=f"no outcome within {self.config.generation.attempt_deadline_s} s",
                )
            finally:
                self.in_flight -= 1

    async def _seal_sibling(self, group_id: str, index: int, result: AttemptResult) -> None:
        async with self.barrier.mutation("sibling_seals") as cut:
            self.record(SiblingSealed(group_id=group_id, seal=_seal_record(index, result)), cut=cut)
        # Acknowledged only once durable: from here the seal survives any crash.
        await self.history.flush()

    async def _seal_cohort(self, group_id: str, results: Mapping[int, AttemptResult]) -> None:
        async with self.barrier.mutation("sibling_seals") as cut:
            self.record(
                GroupSealed(
                    group_id=group_id,
                    seals=[_seal_record(i, result) for i, result in sorted(results.items())],
                ),
                cut=cut,
            )
        await self.history.flush()

    async def _abandon(self, group_id: str, failures: Sequence[AttemptFailure]) -> None:
        async with self.barrier.mutation("recovery_retries") as cut:
            record = self.ledger.get_group(group_id)
            whole_group = record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP
            if whole_group:
                # The whole cohort goes, the attempts that succeeded with it included.
                reasons = {f.generation_index: f.reason for f in failures}
                attempts = [
                    AbandonedAttempt(
                        i, record.gate_rollout_id(i), reasons.get(i, FailureReason.COHORT)
                    )
                    for i in range(record.expected_generations)
                ]
            else:
                attempts = [
                    AbandonedAttempt(f.generation_index, f.rollout_id, f.reason) for f in failures
                ]
            self.record(
                AttemptsAbandoned(group_id=group_id, attempts=attempts, whole_group=whole_group),
                cut=cut,
            )

    async def _drop(self, group_id: str, *, reason: DropReason, detail: str) -> None:
        """Give up on a prompt: its step closes short instead of waiting for it.

        Refused (the run stops, nothing changes) when the step could then never train:
        a checkpoint holding such a drop could never be resumed.
        """
        assert self._signals is not None
        state = self.state
        async with self.barrier.mutation("group_removals") as cut:
            record = self.ledger.get_group(group_id)
            target = record.target_step
            assert target is not None
            available = self._batch_size - state.shortfall.get(target, 0) - 1
            if available < self._min_groups_per_step:
                raise StepShortfallError(
                    step=target,
                    available=available,
                    required=self._min_groups_per_step,
                    per_step=self._batch_size,
                )
            self.record(
                PromptDropped(
                    group_id=group_id,
                    prompt_idx=int(record.prompt_id),
                    target_step=target,
                    reason=reason,
                    detail=detail,
                ),
                cut=cut,
            )
        if self.metrics is not None:
            self.metrics.log_marker(
                self.step,
                "prompt_dropped",
                {"target_step": target, "prompt_idx": int(record.prompt_id), "reason": reason},
            )
        await self._signals.notify()

    async def _publish(self, group_id: str) -> None:
        assert self._signals is not None
        async with self.barrier.mutation("group_commits") as cut:
            # Reads only: verify, linearize and reward the sealed siblings.
            finalized = finalize_group(
                group=self.ledger.get_group(group_id),
                data_plane=self.data_plane,
                settings=self.settings,
            )
            if finalized.target_step is None:  # admitted for a step before it generated
                raise InvalidArgumentError(f"group {group_id!r} was published unadmitted")
            self.record(
                GroupPublished(
                    group_id=group_id,
                    target_step=finalized.target_step,
                    row_keys=list(finalized.row_keys),
                    valid_rows=finalized.valid_row_count,
                    min_weight_version=finalized.min_weight_version,
                    max_weight_version=finalized.max_weight_version,
                    metrics=dict(finalized.metrics),
                ),
                cut=cut,
                canonical_rows=finalized.rows_by_key,
            )
        await self._signals.notify()

    # -------------------------------------------------------------- train pump

    async def _train_pump(self) -> None:
        assert self._signals is not None
        timer = self.step_timer
        timer.start()
        while self.state.step < self.total_steps and self._drain is None:
            step = self.state.step
            waited_from = monotonic()
            await self._signals.wait_for(
                lambda: (
                    self._drain is not None
                    or len(self.replay.ready_groups(self.state.step))
                    >= self._expected_groups(self.state.step)
                ),
                timeout=self._wait_budget,
                what=f"the {self._expected_groups(step)} groups of step {step}",
            )
            timer.add("time/generation_s", monotonic() - waited_from)
            if self._drain is not None:
                return  # a step in progress finishes; none starts while draining
            if self._expected_groups(step) < self._min_groups_per_step:
                raise StepShortfallError(
                    step=step,
                    available=self._expected_groups(step),
                    required=self._min_groups_per_step,
                    per_step=self._batch_size,
                )
            await self._train_step(step)
            await self._signals.notify()
            if self._checkpointer is not None and (
                self.state.step % self.config.checkpoint.every_steps == 0
                or self.state.step == self.total_steps
            ):
                checkpoint_started = monotonic()
                await self._checkpointer()
                timer.add("time/checkpoint_s", monotonic() - checkpoint_started)

    def _expected_groups(self, step: int) -> int:
        """A step trains once every group it still expects is ready (drops closed it short)."""
        return self._batch_size - self.state.shortfall.get(step, 0)

    def _samples(
        self, step: int, groups: Sequence[Sequence[str]], fetched: list[Row] | None = None
    ) -> tuple[list[TrainSample], list[str], list[TrainedRow], list[float], dict[str, int]]:
        """The step's trainable samples (GRPO advantages, placeholders out), their rollout
        ids, and its rows, from each group's canonical row keys; the rows read are appended
        to ``fetched``."""
        samples: list[TrainSample] = []
        sample_rollouts: list[str] = []
        trained: list[TrainedRow] = []
        rewards_seen: list[float] = []
        placeholder_reasons: dict[str, int] = {}
        for row_keys in groups:
            rows = self.data_plane.get(ReplayIndex.canonical_partition, list(row_keys))
            if fetched is not None:
                fetched.extend(rows)
            metas = [CanonicalRowMeta.of(row) for row in rows]
            rewards = np.array([meta.reward for meta in metas])
            mask = np.array([meta.trainable for meta in metas])
            advantages = grpo_advantages(rewards, mask)
            for row, meta, advantage, trainable in zip(rows, metas, advantages, mask, strict=True):
                if trainable:
                    samples.append(
                        TrainSample(
                            token_ids=row.token_ids,
                            token_mask=row.token_mask,
                            logprobs=row.logprobs,
                            advantage=float(advantage),
                            token_versions=token_versions(meta, row.token_mask)
                            if self._vouch_versions
                            else None,
                        )
                    )
                    sample_rollouts.append(meta.rollout_id)
                    rewards_seen.append(meta.reward)
                elif meta.reason is not None:
                    placeholder_reasons[meta.reason] = placeholder_reasons.get(meta.reason, 0) + 1
                # The journal's row: the facts the stored row shares with it, and the
                # dataset index the controller's prompt ids are (``str(prompt_idx)``).
                trained.append(TrainedRow(**meta.facts(), prompt_idx=int(meta.prompt_id)))
        return samples, sample_rollouts, trained, rewards_seen, placeholder_reasons

    async def _train_step(self, step: int) -> None:
        # Train only on publishes that are durable: a crash cannot take back what trained.
        flush_started = monotonic()
        await self.history.flush()
        self.step_timer.add("time/journal_s", monotonic() - flush_started)
        groups = self.replay.ready_groups(step)
        group_ids = [group.group_id for group in groups]
        async with self.barrier.mutation("sample_clears") as cut:
            self.replay.claim(cut, step, group_ids)
        fetched: list[Row] = []
        samples, sample_rollouts, trained, rewards_seen, placeholder_reasons = self._samples(
            step, [group.row_keys for group in groups], fetched
        )
        described = dict(self.samples(step, fetched)) if self.samples is not None else {}
        # Above every version the run ever produced, rolled-back ones included.
        version = self.state.highest_weight_version + 1
        started = monotonic()
        budget = self.config.liveness.train_step_timeout_s
        try:
            # In a thread, so a stuck step is noticed while the event loop keeps serving.
            metrics = await asyncio.wait_for(
                _in_daemon_thread(_train, self.trainer, samples, version), timeout=budget
            )
        except TimeoutError:
            raise LivenessError(f"trainer step {step}", budget) from None
        train_seconds = monotonic() - started
        self.step_timer.add("time/train_s", train_seconds)
        crash_point("train.before_clear")
        mean_reward = float(np.mean(rewards_seen)) if rewards_seen else None
        state = self.state
        refusal = None
        if metrics.get("logprob_refused"):
            # Another model's logprobs: the trainer applied nothing. The step's record
            # stays what its rows are; this one says none of them trained, and the
            # servers of the rows that lied leave rotation (the others keep generating).
            tolerance = self.config.trainer.logprob_tolerance
            guilty, cleared = guilty_rows(self.trainer, sample_rollouts, tolerance)
            servers, untraced = (
                self.backend.blame_servers(guilty, cleared=cleared, step=step)
                if isinstance(self.backend, BlamesServers)
                else ([], len(guilty))
            )
            refusal = logprob_refusal(
                step=step,
                metrics=metrics,
                tolerance=tolerance,
                rows=len(samples),
                steps_without_valid_rows=state.steps_without_valid_rows + 1,
                servers=servers,
                guilty_rows=len(guilty),
                untraced_rows=untraced,
            )
        async with self.barrier.mutation("sample_clears") as cut:
            self.record(
                StepTrained(
                    step=step,
                    weight_version=version,
                    group_ids=group_ids,
                    rows=trained,
                    valid_rows=len(samples),
                    mean_reward=mean_reward,
                ),
                cut=cut,
            )
            if refusal is not None:
                self.record(refusal, cut=cut)
            backend_telemetry: dict[str, Any] | None = None
            if isinstance(self.backend, BackendTelemetry):
                # Server deaths, rejoins and redispatches since the last step.
                for event in self.backend.drain_events():
                    kind = str(event.pop("event", "unknown"))
                    self.step_timer.add_backend_event(kind, event)
                    self.record(BackendEvent(kind=kind, detail=event), cut=cut)
                backend_telemetry = self.backend.telemetry()
            # Typed until here; the one flat line goes to metrics.jsonl and every sink.
            line = StepRecord(
                step=step,
                mean_reward=mean_reward,
                groups=len(groups),
                rows=len(trained),
                valid_rows=len(samples),
                refused_rows=len(samples) if refusal is not None else 0,
                placeholder_reasons=placeholder_reasons,
                weight_version=state.weight_version,
                train_seconds=train_seconds,
                train=dict(metrics),
                backend=backend_telemetry,
                described=described,
                times=self.step_timer.lap(),
            ).flat()
            self.history.metrics(line)
        if self.metrics is not None:
            self.metrics.log_record(step, line)
        self.last_mean_reward = mean_reward
        sync_started = monotonic()  # counted in the next step's period, as its checkpoint
        self.backend.update_weights(self.trainer.weight_version, self.trainer.weights())
        self.step_timer.add("time/weight_sync_s", monotonic() - sync_started)
        if refusal is not None and self.progress is not None:
            self.progress.log(refusal_message(refusal))
        self._check_valid_rows(
            step, placeholder_reasons, None if refusal is None else refusal_message(refusal)
        )
        if self.progress is not None:
            self.progress.update(
                step=state.step,
                mean_reward=mean_reward,
                in_flight=self.in_flight,
                retries=state.counters.retries,
                checkpoints=state.counters.checkpoints,
            )

    def _check_valid_rows(
        self, step: int, placeholder_reasons: Mapping[str, int], refused: str | None
    ) -> None:
        """Stop a run that trains nothing: K steps in a row of placeholders only, or
        refused (``refused`` says why this step was).

        A server that answers every call with garbage gives masked placeholders, which
        train nothing; one that answers another model's logprobs gets its steps refused;
        without this the run would "finish" having learned nothing.
        """
        state = self.state
        limit = self.config.job.max_steps_without_valid_rows
        if state.steps_without_valid_rows >= limit:
            raise NoValidRowsError(
                steps=state.steps_without_valid_rows,
                last_step=step,
                reasons=dict(placeholder_reasons),
                refused=refused,
            )

    # ------------------------------------------------------------------ drain

    @property
    def draining(self) -> bool:
        """Whether a drain was asked for (the run is draining or drained)."""
        return self._drain is not None

    def request_drain(self, reason: str) -> bool:
        """Ask the run to drain; False (and nothing changes) if one was already asked.

        Call it on the event loop's thread (a handler added with
        ``loop.add_signal_handler``, a task) or before ``run``. Admission stops at once;
        attempts in flight get ``[job] drain_grace_s`` from now, measured on the loop's
        clock.
        """
        if self._drain is not None:
            return False
        try:
            asked_at: float | None = asyncio.get_running_loop().time()
        except RuntimeError:
            asked_at = None
        self._drain = _DrainRequest(reason=reason, asked_at=asked_at, in_flight=self.in_flight)
        if self._drain_asked is not None:
            self._drain_asked.set()
        return True

    async def _drain_run(self, rollout: asyncio.Task[None], train: asyncio.Task[None]) -> None:
        """Stop admitting, let the attempts in flight finish within the grace, abandon the
        rest (reason ``drain``), and make every record durable."""
        assert self._drain is not None and self._signals is not None
        loop = asyncio.get_running_loop()
        asked_at = self._drain.asked_at if self._drain.asked_at is not None else loop.time()
        # The rollout pump only ever waits outside a cut (the barrier's entry, the
        # staleness window), so cancelling it leaves every reservation and admission
        # whole; the groups it did not launch wait in the ledger for the resumed run.
        rollout.cancel()
        await self._signals.notify()  # the train pump stops at its next wait
        running = {task for task in self._group_tasks if not task.done()}
        if running:
            remaining = asked_at + self.config.job.drain_grace_s - loop.time()
            await asyncio.wait(running, timeout=max(0.0, remaining))
        waited = loop.time() - asked_at
        cut_short = self.in_flight
        late = {task for task in self._group_tasks if not task.done()}
        for task in late:
            # A group task waits only at barrier entries, flushes, attempts and backoff;
            # every cut it holds is synchronous, so cancelling it leaves the ledger whole.
            task.cancel()
        if late:
            await asyncio.wait(late)
        await self._abandon_cut_short()
        await asyncio.wait({train})  # a step in progress (and its checkpoint) finishes
        await self.history.flush()  # every seal of the grace is acknowledged
        self._report_drain(cut_short=cut_short, waited_s=waited)

    async def _abandon_cut_short(self) -> None:
        """Abandon (reason ``drain``) every attempt a drain left dispatched."""
        for group in self.ledger.groups():
            dispatched = [
                sibling.generation_index
                for sibling in group.siblings
                if sibling.current_attempt.status is RolloutAttemptStatus.DISPATCHED
            ]
            if not dispatched:
                continue
            failures = [
                AttemptFailure(
                    rollout_id=group.gate_rollout_id(index),
                    generation_index=index,
                    reason=FailureReason.DRAIN,
                    detail="still running when the drain's grace ran out",
                )
                for index in dispatched
            ]
            self._drain_abandoned.update(failure.rollout_id for failure in failures)
            await self._abandon(group.group_id, failures)

    def _report_drain(self, *, cut_short: int, waited_s: float) -> None:
        assert self._drain is not None
        self.drain_report = DrainReport(
            reason=self._drain.reason,
            step=self.state.step,
            grace_s=self.config.job.drain_grace_s,
            in_flight=self._drain.in_flight,
            cut_short=cut_short,
            abandoned=len(self._drain_abandoned),
            waited_s=waited_s,
        )


def _train(trainer: Trainer[Any], samples: Sequence[TrainSample], version: int) -> dict[str, float]:
    return trainer.train_step(samples, version=version)


def _next_round(group: PromptGroupRecoveryRecord) -> list[FreshAttempt]:
    """The attempts a new round of ``group`` dispatches: every unsealed sibling's, a
    reserved one as it is, a lost one (abandoned or failed) renewed under a fresh id minted
    here (the ledger refuses the round if these are not exactly its lost siblings)."""
    attempts: list[FreshAttempt] = []
    for sibling in group.siblings:
        index = sibling.generation_index
        status = sibling.current_attempt.status
        if status is RolloutAttemptStatus.RESERVED:
            attempts.append(FreshAttempt(index, group.gate_rollout_id(index)))
        elif status.is_retryable():
            attempts.append(FreshAttempt(index, fresh_rollout_id(group.group_id, index)))
    return attempts


def _seal_record(index: int, result: AttemptResult) -> Seal:
    return Seal(
        generation_index=index,
        rollout_id=result.rollout_id,
        # The journal's seal and the ledger's seal take the receipt's dict (the seed's
        # schema): the one place it leaves its type.
        receipt=result.receipt.to_dict(),
        reward=result.reward,
        mask_sample=result.mask_sample,
        reward_checks=result.reward_checks,
        tokens=result.generated_tokens,
        weight_versions=[call.weight_version for call in result.receipt.manifest],
        inherited_calls=result.inherited_calls,
        inherited_tokens=result.inherited_tokens,
        resume_refused=result.resume_refused,
    )


def _batch_of(admission_id: str) -> int:
    digits = admission_id.removeprefix("batch")
    if not digits.isdigit() or admission_id_of(int(digits)) != admission_id:
        raise InvalidArgumentError(
            f"admission_id {admission_id!r} was not minted by this controller"
        )
    return int(digits)


def _in_daemon_thread(function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """Run ``function(*args)`` in a daemon thread; the future resolves on the loop.

    Not the loop's default executor: asyncio.run joins its threads at shutdown and the
    interpreter joins executor threads at exit, so a step stuck for good would keep a
    failed run from ever exiting. A daemon thread is left behind instead.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def deliver(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return  # the waiter gave up (timeout): nobody wants the outcome any more
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result = function(*args)
        except BaseException as error:
            with contextlib.suppress(RuntimeError):  # the loop may be closed by then
                loop.call_soon_threadsafe(deliver, None, error)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, result, None)

    off_loop(future)  # a virtual clock must not jump past the step's deadline meanwhile
    threading.Thread(target=work, name="trainer-step", daemon=True).start()
    return future


async def _surfaced(write: asyncio.Future[CheckpointTiming]) -> None:
    """A background checkpoint's write in the run's task group: its failure fails the run
    at once. Shielded: the group cancelling this (the run failing elsewhere) does not stop
    the write, which ``run`` then waits for."""
    await asyncio.shield(write)


def _first_failure(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    if isinstance(first, BaseExceptionGroup):
        return _first_failure(first)
    for other in group.exceptions[1:]:
        first.add_note(f"rollout-recovery: also failed: {type(other).__name__}: {other}")
    return first
