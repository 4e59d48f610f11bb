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
   one exclusive cut and writes them after releasing it (see ``_checkpointing.py``).

Any error that is not a retryable generation failure stops the run: the next start
resumes from the newest committed checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from ..capture import STAGING_PARTITION, CallRecord, CaptureWriter
from ..dataplane import (
    CANONICAL_PARTITION,
    DataPlane,
    DataPlaneCheckpointBarrier,
    ReplayIndex,
)
from ..errors import GenerationError, InvalidArgumentError, LivenessError, StepShortfallError
from ..finalize import grpo_advantages, publish_finalized_group
from ..ledger import (
    PromptGroupPhase,
    PromptGroupRecoveryRecord,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    SiblingSealResult,
)
from ..policy import Trainer, TrainSample
from ..rewards import CaptureRewardSettings
from ..rollout import (
    AttemptRequest,
    AttemptResult,
    BackendStartup,
    BackendTelemetry,
    GenerationBackend,
)
from ._audit import AuditTrail
from ._config import RunConfig
from ._crashpoints import crash_point
from ._deferred import DeferredDeletionDataPlane

T = TypeVar("T")

__all__ = ["COUNTERS", "Controller", "PromptDataset", "RunProgress"]

#: The run counters persisted in every checkpoint, so a resumed run reports totals.
COUNTERS = (
    "prompts_taken",
    "prompts_trained",
    "prompts_dropped",
    "attempts",
    "retries",
    "siblings_reused",
    "checkpoints",
    "tokens_generated",
    "longest_checkpoint_stall_us",
    "longest_checkpoint_hold_us",
)


class PromptDataset(Protocol):
    """A map-style dataset: ``dataset[idx]`` rebuilds the same prompt after a restart."""

    def __len__(self) -> int: ...

    def __getitem__(self, idx: int) -> dict[str, Any]: ...


class RunProgress(Protocol):
    """Where the controller reports progress (the CLI's bar, or nothing)."""

    def start(self, total_steps: int, resumed_from: int | None) -> None: ...

    def update(
        self,
        *,
        step: int,
        mean_reward: float | None,
        in_flight: int,
        retries: int,
        checkpoints: int,
    ) -> None: ...

    def log(self, message: str) -> None: ...


class _AcknowledgingWriter(CaptureWriter):
    """The capture writer handed to backends, with the stage-then-ack crash point."""

    def stage_call(self, **kwargs: Any) -> CallRecord:
        record = super().stage_call(**kwargs)
        # A kill here: the row is durable but the worker never learned it was staged.
        crash_point("capture.before_ack")
        return record


@dataclass(slots=True)
class _Failure:
    generation_index: int
    rollout_id: str
    reason: str


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


def dataset_position_to_idx(position: int, *, size: int, seed: int) -> int:
    """The dataloader's order: a fresh seeded permutation of the dataset every epoch."""
    epoch, offset = divmod(position, size)
    order = np.random.default_rng([seed, epoch]).permutation(size)
    return int(order[offset])


class Controller:
    """Owns the barrier, the ledger, the replay index and the pumps of one run."""

    def __init__(
        self,
        *,
        config: RunConfig,
        dataset: PromptDataset,
        backend: GenerationBackend,
        trainer: Trainer,
        data_plane: DataPlane,
        audit: AuditTrail,
        progress: RunProgress | None = None,
        reward_settings: CaptureRewardSettings | None = None,
    ) -> None:
        self.config = config
        self.dataset = dataset
        self.backend = backend
        self.trainer = trainer
        self.audit = audit
        self.progress = progress
        self.settings = reward_settings or CaptureRewardSettings.from_configs()
        self.barrier = DataPlaneCheckpointBarrier()
        self.ledger = RolloutRecoveryLedger()
        self.data_plane = DeferredDeletionDataPlane(data_plane, keep=config.checkpoint.keep)
        self.replay = ReplayIndex(
            data_plane=self.data_plane, group_size=config.job.generations_per_prompt
        )
        self.capture = _AcknowledgingWriter(self.data_plane)
        # Controller state, captured by every checkpoint.
        self.step = 0
        self.prompts_taken = 0
        self.rounds_used: dict[str, int] = {}
        self.shortfall: dict[int, int] = {}
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        # Runtime only.
        self.in_flight = 0
        self.last_mean_reward: float | None = None
        self._signals: _Signals | None = None
        self._inflight_slots: asyncio.Semaphore | None = None
        self._tasks: asyncio.TaskGroup | None = None
        self._checkpointer: Callable[[], Any] | None = None

    # ------------------------------------------------------------------ running

    @property
    def total_steps(self) -> int:
        return self.config.job.steps

    @property
    def _batch_size(self) -> int:
        return self.config.job.prompts_per_step

    def set_checkpointer(self, checkpoint: Callable[[], Any]) -> None:
        """``checkpoint()`` is awaited after every K-th step and after the last one."""
        self._checkpointer = checkpoint

    async def run(self) -> None:
        """Run until every step is trained; redispatches restored work first."""
        self._signals = _Signals()
        self._inflight_slots = asyncio.Semaphore(self.config.generation.max_inflight_attempts)
        if isinstance(self.backend, BackendStartup):
            # Before the first dispatch, outside every attempt deadline (see the protocol).
            await self.backend.start()
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                tasks.create_task(self._rollout_pump(), name="rollout-pump")
                tasks.create_task(self._train_pump(), name="train-pump")
        except BaseExceptionGroup as group:
            # The first failure is the cause; the rest are its consequences (cancelled
            # siblings). Callers branch on the error's class, not on a group.
            raise _first_failure(group) from None
        finally:
            self._tasks = None

    def _launch(self, group_id: str) -> None:
        assert self._tasks is not None
        self._tasks.create_task(self._run_group(group_id), name=f"group-{group_id}")

    @property
    def _wait_budget(self) -> float:
        return self.config.liveness.step_timeout_s

    # ------------------------------------------------------------- rollout pump

    async def _rollout_pump(self) -> None:
        # Restored work first: admitted groups may be the only ones that can advance the
        # trainer and open the admission gate; then reserved batches, once per admission.
        restored = self.ledger.groups()
        for group in restored:
            if group.phase is PromptGroupPhase.ADMITTED:
                self._launch(group.group_id)
        reserved: dict[str, list[str]] = {}
        for group in restored:
            if group.phase is PromptGroupPhase.RESERVED:
                reserved.setdefault(group.admission_id, []).append(group.group_id)
        for admission_id, group_ids in sorted(reserved.items()):
            await self._admit(_batch_of(admission_id), group_ids)
        while (batch := self.prompts_taken // self._batch_size) < self.total_steps:
            group_ids = await self._reserve_batch(batch)
            await self._admit(batch, group_ids)

    async def _reserve_batch(self, batch: int) -> list[str]:
        job = self.config.job
        group_ids: list[str] = []
        async with self.barrier.mutation("prompt_reservations") as cut:
            for _ in range(self._batch_size):
                position = self.prompts_taken
                idx = dataset_position_to_idx(position, size=len(self.dataset), seed=job.seed)
                prompt = self.dataset[idx]
                group_id = f"g{position:07d}"
                granularity = (
                    RecoveryGranularity.PROMPT_GROUP
                    if prompt.get("task_source") == "atomic"
                    else RecoveryGranularity.SIBLING
                )
                self.ledger.reserve_group(
                    cut,
                    prompt_id=str(idx),
                    prompt_payload=prompt,
                    expected_generations=job.generations_per_prompt,
                    target_step=None,
                    start_weight_version=self.trainer.weight_version,
                    task_source=prompt.get("task_source"),
                    recovery_granularity=granularity,
                    admitted=False,
                    group_id=group_id,
                    admission_id=f"batch{batch:06d}",
                )
                self.prompts_taken += 1
                self.counters["prompts_taken"] += 1
                self.audit.event("prompt_taken", prompt_idx=idx, group_id=group_id, batch=batch)
                group_ids.append(group_id)
        return group_ids

    async def _admit(self, batch: int, group_ids: Sequence[str]) -> None:
        """Admit one batch (target step = batch) once it is inside the staleness window."""
        assert self._signals is not None
        window = self.config.job.staleness_window
        await self._signals.wait_for(
            lambda: batch <= self.step + window,
            # Admission waits on training, which waits at most one budget per step.
            timeout=self._wait_budget * (window + 2),
            what=f"the staleness window to admit batch {batch} (trainer at step {self.step})",
        )
        async with self.barrier.mutation("prompt_reservations") as cut:
            for group_id in group_ids:
                self.ledger.mark_group_admitted(
                    cut,
                    group_id,
                    target_step=batch,
                    start_weight_version=self.trainer.weight_version,
                )
        for group_id in group_ids:
            self._launch(group_id)

    # ------------------------------------------------------------ one group

    async def _run_group(self, group_id: str) -> None:
        while self.ledger.get_group(group_id).status is not PromptGroupStatus.READY_TO_FINALIZE:
            if not await self._run_round(group_id):
                return
        await self._publish(group_id)

    async def _run_round(self, group_id: str) -> bool:
        """One generation round of an unfinished group; False once its prompt is dropped.

        A round of its own so the stateful test can drive rounds one at a time.
        """
        retry = self.config.retry
        if self.rounds_used.get(group_id, 0) >= retry.max_rounds:
            await self._drop(
                group_id, reason=f"retry budget exhausted after {retry.max_rounds} rounds"
            )
            return False
        async with self.barrier.mutation("recovery_retries") as cut:
            record = self.ledger.prepare_incomplete_retry(cut, group_id)
            pending = [
                s.generation_index
                for s in record.siblings
                if s.current_attempt.status is RolloutAttemptStatus.RESERVED
            ]
            self.ledger.mark_group_dispatched(cut, group_id, generation_indices=pending)
            self.rounds_used[group_id] = self.rounds_used.get(group_id, 0) + 1
        self.counters["attempts"] += len(pending)
        failures = await self._generate(record, pending)
        if failures:
            await self._abandon(group_id, failures)
            self.counters["retries"] += 1
            await asyncio.sleep(retry.backoff_s)
        return True

    async def _generate(
        self, record: PromptGroupRecoveryRecord, pending: Sequence[int]
    ) -> list[_Failure]:
        """Run one round of ``pending`` siblings; seal what succeeds, return what failed."""
        prompt = record.prompt_payload
        requests = [
            AttemptRequest(
                group_id=record.group_id,
                generation_index=index,
                rollout_id=record.gate_rollout_id(index),
                prompt=prompt,
                weight_version=self.trainer.weight_version,
            )
            for index in pending
        ]
        atomic = record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP
        outcomes: dict[int, AttemptResult | _Failure] = {}

        async def one(request: AttemptRequest) -> None:
            outcome = await self._attempt(request)
            outcomes[request.generation_index] = outcome
            if not atomic and isinstance(outcome, AttemptResult):
                await self._seal_sibling(record.group_id, request.generation_index, outcome)

        async with asyncio.TaskGroup() as round_tasks:
            for request in requests:
                round_tasks.create_task(one(request))
        failures = [o for o in outcomes.values() if isinstance(o, _Failure)]
        if atomic and not failures:
            results = {i: o for i, o in outcomes.items() if isinstance(o, AttemptResult)}
            await self._seal_cohort(record.group_id, results)
        return sorted(failures, key=lambda f: f.generation_index)

    async def _attempt(self, request: AttemptRequest) -> AttemptResult | _Failure:
        assert self._inflight_slots is not None
        async with self._inflight_slots:
            self.in_flight += 1
            try:
                async with asyncio.timeout(self.config.generation.attempt_deadline_s):
                    return await self.backend.run_attempt(request, self.capture)
            except TimeoutError:
                reason = "deadline_exceeded"
            except GenerationError as error:
                reason = error.reason
            finally:
                self.in_flight -= 1
        return _Failure(request.generation_index, request.rollout_id, reason)

    async def _seal_sibling(self, group_id: str, index: int, result: AttemptResult) -> None:
        async with self.barrier.mutation("sibling_seals") as cut:
            self.ledger.mark_sibling_sealed(
                cut,
                group_id,
                generation_index=index,
                gate_rollout_id=result.rollout_id,
                receipt=result.receipt,
                reward=result.reward,
                mask_sample=result.mask_sample,
                reward_checks=result.reward_checks,
            )
            self._record_seal(group_id, index, result)

    async def _seal_cohort(self, group_id: str, results: Mapping[int, AttemptResult]) -> None:
        async with self.barrier.mutation("sibling_seals") as cut:
            self.ledger.mark_group_sealed(
                cut,
                group_id,
                {
                    index: SiblingSealResult(
                        gate_rollout_id=result.rollout_id,
                        receipt=result.receipt,
                        reward=result.reward,
                        mask_sample=result.mask_sample,
                        reward_checks=result.reward_checks,
                    )
                    for index, result in results.items()
                },
            )
            for index, result in sorted(results.items()):
                self._record_seal(group_id, index, result)

    def _record_seal(self, group_id: str, index: int, result: AttemptResult) -> None:
        self.counters["tokens_generated"] += result.generated_tokens
        self.audit.event(
            "sibling_sealed",
            group_id=group_id,
            generation_index=index,
            rollout_id=result.rollout_id,
            tokens=result.generated_tokens,
        )

    async def _abandon(self, group_id: str, failures: Sequence[_Failure]) -> None:
        async with self.barrier.mutation("recovery_retries") as cut:
            record = self.ledger.get_group(group_id)
            self.ledger.abandon_unsealed(cut, group_id)
            if record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP:
                # The whole cohort goes, the attempts that succeeded with it.
                self.audit.attempts_abandoned(
                    group_id,
                    [(i, record.gate_rollout_id(i)) for i in range(record.expected_generations)],
                    reason=",".join(sorted({f.reason for f in failures})),
                    whole_group=True,
                )
            else:
                for failure in failures:
                    self.audit.attempts_abandoned(
                        group_id,
                        [(failure.generation_index, failure.rollout_id)],
                        reason=failure.reason,
                        whole_group=False,
                    )

    async def _drop(self, group_id: str, *, reason: str) -> None:
        """Give up on a prompt: its step closes short instead of waiting for it."""
        assert self._signals is not None
        async with self.barrier.mutation("group_removals") as cut:
            record = self.ledger.get_group(group_id)
            owned = self.ledger.expected_staging_keys()
            self.ledger.discard_group(cut, group_id)
            self.data_plane.clear(
                STAGING_PARTITION, sorted(owned - self.ledger.expected_staging_keys()), cut=cut
            )
            assert record.target_step is not None
            self.shortfall[record.target_step] = self.shortfall.get(record.target_step, 0) + 1
            self.rounds_used.pop(group_id, None)
            self.counters["prompts_dropped"] += 1
            self.audit.event(
                "prompt_dropped",
                group_id=group_id,
                prompt_idx=int(record.prompt_id),
                target_step=record.target_step,
                reason=reason,
            )
        await self._signals.notify()

    async def _publish(self, group_id: str) -> None:
        assert self._signals is not None
        async with self.barrier.mutation("group_commits") as cut:
            finalized = publish_finalized_group(
                self.ledger,
                cut,
                data_plane=self.data_plane,
                replay_index=self.replay,
                group_id=group_id,
                settings=self.settings,
            )
            # The put is the only durable effect of a publish (the staging clear is
            # deferred), so a kill here leaves the disk exactly as a kill between the put
            # and the ledger discard would: canonical rows no checkpoint owns.
            crash_point("finalize.after_put")
            self.rounds_used.pop(group_id, None)
            self.audit.event(
                "group_published",
                group_id=group_id,
                target_step=finalized.target_step,
                valid_rows=finalized.valid_row_count,
            )
        await self._signals.notify()

    # -------------------------------------------------------------- train pump

    async def _train_pump(self) -> None:
        assert self._signals is not None
        job = self.config.job
        minimum = math.ceil(job.min_step_fraction * job.prompts_per_step)
        while self.step < self.total_steps:
            step = self.step
            await self._signals.wait_for(
                lambda: (
                    len(self.replay.ready_groups(self.step)) >= self._expected_groups(self.step)
                ),
                timeout=self._wait_budget,
                what=f"the {self._expected_groups(step)} groups of step {step}",
            )
            if self._expected_groups(step) < minimum:
                raise StepShortfallError(
                    step=step, available=self._expected_groups(step), required=minimum
                )
            await self._train_step(step)
            await self._signals.notify()
            if self._checkpointer is not None and (
                self.step % self.config.checkpoint.every_steps == 0 or self.step == self.total_steps
            ):
                await self._checkpointer()

    def _expected_groups(self, step: int) -> int:
        """A step trains once every group it still expects is ready (drops closed it short)."""
        return self.config.job.prompts_per_step - self.shortfall.get(step, 0)

    async def _train_step(self, step: int) -> None:
        groups = self.replay.ready_groups(step)
        group_ids = [group.group_id for group in groups]
        async with self.barrier.mutation("sample_clears") as cut:
            self.replay.claim(cut, step, group_ids)
        samples: list[TrainSample] = []
        trained: list[dict[str, Any]] = []
        rewards_seen: list[float] = []
        for group in groups:
            rows = self.data_plane.get(CANONICAL_PARTITION, list(group.row_keys))
            rewards = np.array([float(row.metadata["reward"]) for row in rows])
            mask = np.array(
                [bool(row.metadata["valid"]) and not row.metadata["mask_sample"] for row in rows]
            )
            advantages = grpo_advantages(rewards, mask)
            for row, advantage, trainable in zip(rows, advantages, mask, strict=True):
                meta = row.metadata
                if trainable:
                    samples.append(
                        TrainSample(
                            token_ids=row.token_ids,
                            token_mask=row.token_mask,
                            logprobs=row.logprobs,
                            advantage=float(advantage),
                        )
                    )
                    rewards_seen.append(float(meta["reward"]))
                trained.append(
                    {
                        "step": step,
                        "group_id": meta["group_id"],
                        "generation_index": meta["generation_index"],
                        "prompt_idx": int(meta["prompt_id"]),
                        "rollout_id": meta["rollout_id"],
                        "valid": bool(meta["valid"]),
                        "reward": float(meta["reward"]),
                        "weight_version": meta["weight_version"],
                    }
                )
        started = time.monotonic()
        budget = self.config.liveness.train_step_timeout_s
        try:
            # In a thread, so a stuck step is noticed while the event loop keeps serving.
            metrics = await asyncio.wait_for(
                _in_daemon_thread(self.trainer.train_step, samples), timeout=budget
            )
        except TimeoutError:
            raise LivenessError(f"trainer step {step}", budget) from None
        train_seconds = time.monotonic() - started
        crash_point("train.before_clear")
        mean_reward = float(np.mean(rewards_seen)) if rewards_seen else None
        async with self.barrier.mutation("sample_clears") as cut:
            self.replay.clear(cut, group_ids)
            for line in trained:
                self.audit.trained_row(**line)
            self.step = step + 1
            self.shortfall = {s: n for s, n in self.shortfall.items() if s > step}
            self.counters["prompts_trained"] += len(groups)
            backend_metrics: dict[str, Any] = {}
            if isinstance(self.backend, BackendTelemetry):
                # Server deaths, rejoins and redispatches since the last step, in the same
                # cut as the step's rows: a resume cuts them back together.
                for event in self.backend.drain_events():
                    self.audit.event(**event)
                backend_metrics["backend"] = self.backend.telemetry()
            self.audit.metrics(
                {
                    "step": step,
                    "mean_reward": mean_reward,
                    "groups": len(groups),
                    "rows": len(trained),
                    "valid_rows": len(samples),
                    "weight_version": self.trainer.weight_version,
                    "train_seconds": train_seconds,
                    **{f"train/{k}": v for k, v in metrics.items()},
                    **backend_metrics,
                }
            )
        self.last_mean_reward = mean_reward
        self.backend.update_weights(self.trainer.weight_version, self.trainer.weights())
        if self.progress is not None:
            self.progress.update(
                step=self.step,
                mean_reward=mean_reward,
                in_flight=self.in_flight,
                retries=self.counters["retries"],
                checkpoints=self.counters["checkpoints"],
            )


def _batch_of(admission_id: str) -> int:
    if not admission_id.startswith("batch") or not admission_id[5:].isdigit():
        raise InvalidArgumentError(
            f"admission_id {admission_id!r} was not minted by this controller"
        )
    return int(admission_id[5:])


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

    threading.Thread(target=work, name="trainer-step", daemon=True).start()
    return future


def _first_failure(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    if isinstance(first, BaseExceptionGroup):
        return _first_failure(first)
    for other in group.exceptions[1:]:
        first.add_note(f"rollout-recovery: also failed: {type(other).__name__}: {other}")
    return first
