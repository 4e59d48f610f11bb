"""A stateful property test of the whole controller (issue 9, item 4).

A hypothesis ``RuleBasedStateMachine`` drives the real controller components (the
``Controller`` methods the pumps call, the ledger, the replay index, the deferred-deletion
data plane, ``Controller.checkpoint`` / ``ControllerCheckpoints.verify`` /
``Controller.restore``, the checkpoint store and the audit trail on disk) one step at a
time, on a private event loop whose clock moves only when a rule says so. The durable
store is a ``MemoryDataPlane`` that outlives every simulated crash; the checkpoint
directory and the audit files live in a temporary directory per example. Generation is a
scripted backend: each rule chooses every sibling's outcome.

Rules:

- ``admission``: admit the reserved batch once inside the staleness window, and reserve
  the next one (as the rollout pump does);
- ``generation_round``: one round of one group (``Controller._run_round``), each sibling
  succeeding, returning a poisoned capture, failing, crashing its worker, or hanging; a
  group out of retry rounds is dropped instead (a round a crash interrupted is given
  back);
- ``deadline``: the hung attempts reach their deadline (the virtual clock moves);
- ``worker_crash``: the worker under some hung attempts dies, failing them at once;
- ``publish``: a sealed group is published;
- ``train_step``: a step trains, usually followed by its checkpoint, taken at once or
  in the background (``[checkpoint] background``: captured now, committed later);
- ``checkpoint``: the step's checkpoint, taken later;
- ``commit_background``: a checkpoint captured in the background is written and
  committed, after whatever rules ran since its capture (rounds, publishes, train steps:
  its ``checkpoint_committed`` lands after their records); a crash first loses it, and
  the previous checkpoint is restored;
- ``step_shortfall``: a step its drops left too short stops the run (then a restart);
- ``crash``: every in-memory object is dropped and writes from the dead incarnation are
  fenced off; a fresh controller restores from the newest committed checkpoint exactly
  as ``rollout-recovery run`` does.

After every rule the machine checks DESIGN §5 invariants 1 to 5 and 9 against a small
model of where every prompt is owned and which siblings are sealed with which rollout id.
The journal keeps every acknowledged record across a crash, so a crash loses only the
attempts in flight and the training after the newest checkpoint (the policy lives only in
checkpoints: those steps are rolled back and trained again from the same rows):

1. ownership: every prompt taken is in exactly one of ledger, replay index, trained (the
   journal's surviving ``step_trained`` records) or dropped with a reason;
2. every replay group holds exactly N canonical rows, one per sibling, each from the
   sibling's sealed current attempt (its rollout id), placeholders exactly for poisoned
   captures;
3. no sibling trained twice, no group published twice, every group trained in its target
   step with N rows, nothing the model trained missing from the trail;
4. sealed work is never redispatched (after a live failure at sibling granularity, or
   after a restore from a checkpoint holding the seal), a sibling's retried attempt is
   handed the calls its lost attempt staged (call-level resume; never a cohort's), the
   ledger's seals are the model's,
   no attempt is DISPATCHED that no round runs, and every dispatched attempt is sealed,
   still running, or stamped abandoned in the trail (a crash's interrupted ones with
   reason ``restart``);
5. after a restore the staging partition holds exactly the keys the ledger expects and
   the calls of lost attempts kept to be continued (and the canonical partition exactly
   the replay index's rows); at all times the store holds
   every row the ledger, the replay index and the checkpoints a crash may restore own, and
   the staged rows of groups that left the ledger are deleted or pending deletion.

9. every seal journaled before a crash is still sealed after it (or trained); weight
   versions are unique across the whole journal, rolled-back steps included; at every
   checkpoint the snapshot built from the journal on disk equals the live state; and after
   every rule the whole journal, replayed from its first line through the one transition
   of each record (every restore it records included), equals the live ledger, replay
   index and controller state (issue 25, item 1).

Plus a liveness check: once every group of the current step is published or dropped, the
step is trainable (its drops were credited).

Planted bugs (``test_planted_bug_is_caught``, each applied with ``monkeypatch``), all
CAUGHT:

- ``skip_staging_inventory``: restore does not run ``reconcile_staging`` (invariant 5
  after a restore: rows of failed attempts stay staged);
- ``skip_prepare_for_restart``: restore does not call ``prepare_for_restart`` (the
  product's own guard: ``reconcile_staging`` refuses to clear with attempts dispatched);
- ``restore_without_restart_stamp``: restore writes no ``attempt_abandoned`` for the
  attempts the crash interrupted (invariant 4 at the restore);
- ``abandon_without_stamp``: ``Controller._abandon`` writes its events but never calls
  ``abandon_unsealed`` (invariant 4: a failed attempt stays DISPATCHED);
- ``abandon_without_event``: ``_abandon`` abandons in the ledger but writes no event
  (invariant 4: a dispatched attempt unaccounted for);
- ``train_keeps_replay``: the train step does not clear the replay index (invariant 1: a
  trained group still in the replay index);
- ``immediate_deletion``: ``DeferredDeletionDataPlane.clear`` deletes at once (invariant
  5: the newest checkpoint's rows are gone before a later checkpoint commits);
- ``drop_without_shortfall``: ``_drop`` does not credit its step's shortfall (the model's
  shortfall, and the liveness check);
- ``restore_keeps_unowned_canonical``: restore keeps canonical rows published after the
  checkpoint (the product's own check: ``ReplayIndex.from_state`` refuses them);
- ``publish_keeps_staging``: publication never deletes the group's staged rows
  (invariant 5: a leak until the next restore);
- ``replay_drops_seals``: a restore's journal replay skips sibling seals (invariant 9: a
  seal acknowledged before the crash is gone after it);
- ``versions_reused_after_restore``: the next weight version counts from the restored one,
  not from the highest ever journaled (invariant 9: one number, two sets of weights);
- ``replay_keeps_training``: the replay re-applies training after the snapshot instead of
  rolling it back (the product's own check: the policy's version disagrees);
- ``restore_forgets_resumable_calls``: the restore keeps no lost attempt's calls for
  resumption (invariant 5 after a restore, and the resume check at the next dispatch);
- ``dispatch_ignores_lost_calls``: the controller hands no lost attempt's calls to the next
  attempt of a sibling (the resume check: a retried sibling starts over);
- ``capture_reads_the_live_trainer``: a checkpoint's capture copies nothing of the
  trainer, its commit encodes the trainer as it is by then (the commit's own check:
  the snapshot's weight version is not the trainer's once a step trained in between);
- ``live_forgets_a_record``: the live run journals ``checkpoint_committed`` without applying
  it (invariant 9: the journal replayed from its start counts a checkpoint the live state
  does not).

Not caught, by design rather than by a gap of the machine: restore skipping
``discard_canonical_groups``. A publish discards the group from the ledger in the same cut
that commits it to the replay index, so no checkpoint holds a group in both; the call is
defence in depth for a state the controller cannot produce.

Found while writing it (not a failure of this test, which checks only what the product
promises): after a restore, the *older* retained checkpoints may no longer be restorable.
The restore deletes every row the restored checkpoint does not own, including rows an
older retained checkpoint owns (for example the canonical rows of the step the restored
checkpoint already trained). ``docs/ARCHITECTURE.md`` says "the store always holds every
row each retained checkpoint owns"; that holds only until the first restore. It matters
only if the newest checkpoint becomes unloadable after a restore verified it. The machine
therefore guards the newest checkpoint and those committed since the last restore.
"""

from __future__ import annotations

import asyncio
import copy
import io
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import rollout_recovery.control._checkpointing as checkpointing
from rollout_recovery._sampler import dataset_position_to_idx
from rollout_recovery.capture import CaptureWriter, StagedPrefix
from rollout_recovery.capture._receipt import CaptureFailure, assemble_receipt
from rollout_recovery.control._config import RunConfig, config_from_builtins
from rollout_recovery.control._controller import Controller, _Signals
from rollout_recovery.control._deferred import DeferredDeletionDataPlane
from rollout_recovery.control._replay import JournalReplay, metadata_only_plane
from rollout_recovery.control._snapshot import _ReplayCut
from rollout_recovery.control._state import ControllerState
from rollout_recovery.control._transitions import Transitions
from rollout_recovery.dataplane import MemoryDataPlane, ReplayIndex, Row
from rollout_recovery.dataplane._replay import CANONICAL_PARTITION
from rollout_recovery.errors import GenerationError, RolloutRecoveryError, StepShortfallError
from rollout_recovery.history import AuditTrail, JournalEntry
from rollout_recovery.history._trail_check import check_trail
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.history.records import (
    AbandonedAttempt,
    AttemptsAbandoned,
    CheckpointCommitted,
    GroupPublished,
    GroupSealed,
    PromptDropped,
    PromptTaken,
    Restored,
    RunStarted,
    SiblingSealed,
    StepTrained,
    TrainedRow,
)
from rollout_recovery.job._run_job import _start_fresh
from rollout_recovery.ledger import (
    PromptGroupPhase,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
)
from rollout_recovery.policy import TaskSet, TrainSample
from rollout_recovery.policy._tasks import ANSWER, EOS, THOUGHT_BASE, digit_token
from rollout_recovery.rollout import AttemptFailure, AttemptRequest, AttemptResult, FailureReason
from rollout_recovery.rundir import CheckpointStore, RunDirectory

N = 2  # generations per prompt
BATCH = 2  # prompts per step
STEPS = 6
MAX_ROUNDS = 2
DEADLINE_S = 5.0  # virtual seconds: the clock only moves in the deadline rule

CONFIG: RunConfig = config_from_builtins(
    {
        "job": {
            "steps": STEPS,
            "prompts_per_step": BATCH,
            "generations_per_prompt": N,
            "staleness_window": 1,
            "seed": 0,
            "min_step_fraction": 0.5,
        },
        # Even dataset indices are prompt-group (atomic) cohorts, odd ones sibling groups.
        "task": {"dataset_size": 16, "prompt_group_every": 2},
        "generation": {"attempt_deadline_s": DEADLINE_S, "max_inflight_attempts": 64},
        "retry": {"max_rounds": MAX_ROUNDS, "backoff_s": 0.0},
        "checkpoint": {"every_steps": 1, "keep": 2},
        "liveness": {"step_timeout_s": 60.0},
    }
)
MINIMUM_GROUPS = 1  # ceil(min_step_fraction * prompts_per_step)
#: A crash needs this many rules since the last start: crashes stay rare enough for runs
#: to get past a few steps, and a crash right after a restore tests little.
CRASH_SPACING = 10
#: A hung attempt reaches its deadline only after this many rules: other work (train
#: steps, checkpoints, crashes) happens while it hangs.
HANG_TICKS = 12
#: A worker under a hung attempt may die once it has hung this many rules.
CRASH_TICKS = 3

SUCCESS = ("ok", "poisoned")
#: One sibling's outcome in a round; "ok" weighs most so groups also finish.
OUTCOMES = ("ok", "ok", "ok", "ok", "ok", "ok", "poisoned", "fail", "crash", "hang", "hang")


# ------------------------------------------------------------------ test doubles


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when told: deadlines fire on demand."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def run_until_idle(self) -> None:
        """Run every callback that can run; stop when only timers and futures remain."""

        async def idle() -> None:
            for _ in range(100_000):
                await asyncio.sleep(0)
                if not self._ready:  # type: ignore[attr-defined]
                    return
            raise AssertionError("the event loop never went idle")

        self.run_until_complete(idle())


class FencedDataPlane:
    """The durable store as one incarnation sees it; a crash fences the dead one off."""

    def __init__(self, inner: MemoryDataPlane) -> None:
        self.inner = inner
        self.dead = False
        self.writes_after_death: list[str] = []

    def _alive(self, what: str) -> None:
        if self.dead:
            self.writes_after_death.append(what)
            raise RuntimeError(f"a crashed incarnation tried to {what}")

    def put(self, partition: str, rows: Any, *, cut: Any = None) -> None:
        self._alive(f"put {partition}")
        self.inner.put(partition, rows, cut=cut)

    def clear(self, partition: str, keys: Any, *, cut: Any = None) -> None:
        self._alive(f"clear {partition}")
        self.inner.clear(partition, keys, cut=cut)

    def get(self, partition: str, keys: Any) -> list[Row]:
        return self.inner.get(partition, keys)

    def keys(self, partition: str) -> list[str]:
        return self.inner.keys(partition)

    def snapshot(self, directory: Path, *, cut: Any = None) -> None:
        raise AssertionError("the controller never snapshots the store")

    def restore(self, directory: Path, *, cut: Any = None) -> None:
        raise AssertionError("the controller never restores the store wholesale")

    def close(self) -> None:
        return None


class CountingTrainer:
    """A trainer whose state is its weight version."""

    def __init__(self) -> None:
        self._version = 0
        self.samples: list[int] = []

    @property
    def weight_version(self) -> int:
        return self._version

    def weights(self) -> object:
        return self._version

    def train_step(self, samples: Sequence[TrainSample], *, version: int) -> dict[str, float]:
        assert version > self._version, (version, self._version)
        self.samples.append(len(samples))
        self._version = version
        return {"samples": float(len(samples))}

    def state(self) -> dict[str, np.ndarray[Any, Any]]:
        return {"version": np.array([self._version], dtype=np.int64)}

    def load_state(self, state: Any) -> None:
        self._version = int(state["version"][0])


class ScriptedBackend:
    """Runs each attempt as the rule planned it: every attempt stages its first call
    first, then succeeds (second call staged, real receipt), returns a poisoned receipt,
    fails, crashes its worker, or hangs until its deadline or a worker crash.

    It resumes (``run_attempt``'s ``prefix``): handed the calls a lost attempt of the sibling
    staged, it stages them again under its own rollout id instead of its first call."""

    def __init__(self) -> None:
        self.plans: dict[str, dict[int, str]] = {}
        self.requests: list[AttemptRequest] = []
        #: rollout id -> the rollout id whose staged calls it was handed
        self.handed: dict[str, str] = {}
        self.active: dict[str, str] = {}  # rollout id -> group id
        self.parked: dict[str, asyncio.Future[None]] = {}
        self.parked_since: dict[str, int] = {}  # rollout id -> the machine's tick
        self.version = 0

    def update_weights(self, version: int, weights: object) -> None:
        self.version = version

    async def aclose(self) -> None:
        return None

    def quiet(self, group_id: str) -> bool:
        """Every attempt of ``group_id`` still running is hung (and at least one is)."""
        mine = [rid for rid, gid in self.active.items() if gid == group_id]
        return bool(mine) and all(rid in self.parked for rid in mine)

    async def run_attempt(
        self, request: AttemptRequest, capture: CaptureWriter, prefix: StagedPrefix | None = None
    ) -> AttemptResult | AttemptFailure:
        if prefix is not None:
            self.handed[request.rollout_id] = prefix.rollout_id
        return await self._outcome(request, capture, prefix)

    async def _outcome(
        self, request: AttemptRequest, capture: CaptureWriter, prefix: StagedPrefix | None
    ) -> AttemptResult | AttemptFailure:
        # The backend's boundary: a failure raised inside the attempt becomes its value.
        try:
            return await self._run(request, capture, prefix)
        except GenerationError as error:
            return AttemptFailure.from_error(request, error)

    async def _run(
        self, request: AttemptRequest, capture: CaptureWriter, prefix: StagedPrefix | None
    ) -> AttemptResult:
        outcome = self.plans[request.group_id][request.generation_index]
        self.requests.append(request)
        rid = request.rollout_id
        self.active[rid] = request.group_id
        try:
            prompt = [int(t) for t in request.prompt["prompt_token_ids"]]
            thoughts = [THOUGHT_BASE, THOUGHT_BASE + 1 + request.generation_index]
            inherited = None if prefix is None else prefix.calls[0]
            first = capture.stage_call(
                rollout_id=rid,
                model_call_id="c0",
                parent=None,
                prompt_token_ids=prompt if inherited is None else inherited.prompt_token_ids,
                generated_token_ids=thoughts if inherited is None else inherited.token_ids,
                generated_logprobs=[-0.5, -0.25] if inherited is None else inherited.logprobs,
                weight_version=(
                    request.weight_version if inherited is None else inherited.weight_version
                ),
            )
            if outcome == "fail":
                raise GenerationError(FailureReason.ATTEMPT_FAILED, "scripted failure")
            if outcome == "crash":
                raise GenerationError(FailureReason.WORKER_CRASHED, "scripted worker crash")
            if outcome == "hang":
                future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self.parked[rid] = future
                try:
                    await future  # forever, unless a worker crash fails it
                finally:
                    self.parked.pop(rid, None)
                    self.parked_since.pop(rid, None)
                raise AssertionError("a hung attempt was resumed")
            reward = float(request.generation_index % 2)
            records = [first]
            failures: list[CaptureFailure] = []
            if outcome == "poisoned":
                failures.append(CaptureFailure(model_call_id="c1", reason="staging_write_failed"))
            else:
                records.append(
                    capture.stage_call(
                        rollout_id=rid,
                        model_call_id="c1",
                        parent=first,
                        prompt_token_ids=[*prompt, *thoughts, ANSWER],
                        generated_token_ids=[digit_token(request.generation_index), EOS],
                        generated_logprobs=[-0.1, -0.2],
                        weight_version=request.weight_version,
                    )
                )
            receipt = assemble_receipt(
                rid, records, terminal_model_call_id="c1", failures=failures, reward=reward
            )
            return AttemptResult(
                rollout_id=rid,
                receipt=receipt,
                reward=reward,
                mask_sample=False,
                reward_checks=None,
                generated_tokens=4,
                inherited_calls=0 if inherited is None else 1,
                inherited_tokens=0 if inherited is None else 2,
            )
        finally:
            self.active.pop(rid, None)


# ------------------------------------------------------------------------ the model


@dataclass
class GroupModel:
    idx: int
    batch: int
    atomic: bool
    where: str  # reserved | admitted | replay | trained | dropped
    rounds: int = 0
    sealed: dict[int, str] = field(default_factory=dict)  # index -> rollout id
    poisoned: set[int] = field(default_factory=set)
    #: Out of rounds, but its drop would leave its step too short: the run refuses it.
    undroppable: bool = False


@dataclass
class RoundModel:
    outcomes: dict[int, str]  # pending index -> planned outcome
    rollout_ids: dict[int, str]


@dataclass
class Model:
    step: int = 0
    groups: dict[str, GroupModel] = field(default_factory=dict)
    #: Drops per target step, over the whole run (never pruned).
    drops: dict[int, int] = field(default_factory=dict)
    inflight: dict[str, RoundModel] = field(default_factory=dict)
    dispatched: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: (group, index) -> the sibling's last dispatched attempt (each stages its first call
    #: before anything else, so a lost one always leaves a call to continue).
    last_attempt: dict[tuple[str, int], str] = field(default_factory=dict)
    #: The step each trained group trained in.
    trained_in: dict[str, int] = field(default_factory=dict)

    def where(self, *places: str) -> set[str]:
        return {gid for gid, g in self.groups.items() if g.where in places}

    def expected_groups(self, step: int) -> int:
        return BATCH - self.drops.get(step, 0)

    @property
    def shortfall(self) -> dict[int, int]:
        """What the controller still credits: drops of the steps not yet trained."""
        return {s: n for s, n in self.drops.items() if s >= self.step}

    def ready_count(self, step: int) -> int:
        return sum(1 for g in self.groups.values() if g.where == "replay" and g.batch == step)


@dataclass
class Pending:
    """A checkpoint captured in the background, not committed yet, with the live state
    at its capture (what the snapshot the journal rebuilds must equal)."""

    captured: checkpointing.CapturedCheckpoint
    step: int
    ledger: dict[str, Any]
    replay: dict[str, Any]
    state: dict[str, Any]
    #: The machine's tick at the capture (a commit in a later rule raced other rules).
    tick: int = 0


@dataclass
class Life:
    """One incarnation of the process: everything a SIGKILL takes away."""

    loop: VirtualClockLoop
    controller: Controller
    backend: ScriptedBackend
    audit: AuditTrail
    store: CheckpointStore
    fence: FencedDataPlane
    rounds: dict[str, asyncio.Task[bool]] = field(default_factory=dict)
    restored: bool = False

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)


def _surviving_rows(entries: Sequence[JournalEntry]) -> list[tuple[int, TrainedRow]]:
    """(step, row) of every trained row no restore rolled back."""
    windows = [
        (e.record.snapshot_position, e.offset) for e in entries if isinstance(e.record, Restored)
    ]
    return [
        (e.record.step, row)
        for e in entries
        if isinstance(e.record, StepTrained)
        and not any(start <= e.offset < end for start, end in windows)
        for row in e.record.rows
    ]


def _seal_ids(entries: Sequence[JournalEntry]) -> set[str]:
    found: set[str] = set()
    for entry in entries:
        if isinstance(entry.record, SiblingSealed):
            found.add(entry.record.seal.rollout_id)
        elif isinstance(entry.record, GroupSealed):
            found.update(seal.rollout_id for seal in entry.record.seals)
    return found


# ---------------------------------------------------------------------- the machine


class ControllerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.run_dir = Path(tempfile.mkdtemp(prefix="rr-stateful-"))
        self.durable = MemoryDataPlane()
        self.dataset = TaskSet(CONFIG.task.dataset_size, seed=CONFIG.job.seed, prompt_group_every=2)
        self.model = Model()
        #: The step of the newest committed checkpoint (training after it rolls back).
        self.committed_step = 0
        self.committed_name: str | None = None
        #: The rules that changed something since the last commit or boot.
        self.changed_since_commit = False
        #: A checkpoint captured in the background, waiting for ``commit_background``.
        self.pending: Pending | None = None
        self.rules_since_boot = 0
        self.ticks = 0
        try:
            self.life = self._boot()
        except BaseException:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise

    # -- lives ---------------------------------------------------------------------

    def _boot(self) -> Life:
        loop = VirtualClockLoop()
        fence = FencedDataPlane(self.durable)
        backend = ScriptedBackend()
        audit = AuditTrail(RunDirectory(self.run_dir))
        audit.journal.sync_in_thread = False  # the rules drive the loop until it is idle
        store = CheckpointStore(self.run_dir, keep=CONFIG.checkpoint.keep)
        store.remove_stale()
        controller = Controller(
            config=CONFIG,
            dataset=self.dataset,
            backend=backend,
            trainer=CountingTrainer(),
            data_plane=fence,
            history=audit,
            checkpoint_store=store,
        )
        # The rules run every group themselves, one round at a time.
        controller._launch = lambda group_id: None  # type: ignore[method-assign]
        life = Life(loop, controller, backend, audit, store, fence)
        self.life = life

        async def runtime() -> None:
            controller._signals = _Signals()
            controller._inflight_slots = asyncio.Semaphore(CONFIG.generation.max_inflight_attempts)

        life.run(runtime())
        # The search alone, not newest_restorable: the restore then keeps no rows for the
        # older checkpoints (the machine guards only the newest, see the module's notes).
        found = store.newest_loadable(controller.checkpoints.verify)
        started = RunStarted(
            pid=os.getpid(),
            resumed_from=None if found is None else found[0].name,
            step=0 if found is None else found[1].step,
            steps=STEPS,
            prompts_per_step=BATCH,
            group_size=N,
        )
        if found is None:
            life.run(_start_fresh(controller))
            controller.record(started)
            controller.follow_journal()
            self._checkpoint()  # the bootstrap anchor
        else:
            _, verified, skipped = found
            assert not skipped, f"a checkpoint was skipped: {[str(s) for s in skipped]}"
            assert verified.name == self.committed_name, (
                f"restored {verified.name}, the last committed checkpoint is {self.committed_name}"
            )
            life.run(controller.restore(verified))
            controller.record(started)
            controller.follow_journal()
            life.restored = True
        self.rules_since_boot = 0
        self._reserve_next()
        return life

    def _kill(self) -> None:
        """SIGKILL: nothing of this incarnation may touch the durable state any more.

        Its hung attempts are cancelled only to free the loop; the fence turns any write
        their unwinding tries into a failure."""
        life = self.life
        life.fence.dead = True
        tasks = [task for task in life.rounds.values() if not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            life.run(asyncio.gather(*tasks, return_exceptions=True))
        life.loop.run_until_complete(life.loop.shutdown_default_executor())
        life.loop.close()
        life.audit.close()
        assert not life.fence.writes_after_death, life.fence.writes_after_death

    def teardown(self) -> None:
        try:
            if not self.life.loop.is_closed():
                self._kill()
        finally:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    # -- helpers -------------------------------------------------------------------

    @property
    def controller(self) -> Controller:
        return self.life.controller

    def _settle(self) -> None:
        """Run until every round is finished or waits only on hung attempts."""
        self.life.loop.run_until_idle()
        for gid, task in self.life.rounds.items():
            if not task.done():
                assert self.life.backend.quiet(gid), f"round of {gid} is stuck on something"
        for gid in [gid for gid, task in self.life.rounds.items() if task.done()]:
            task = self.life.rounds.pop(gid)
            assert task.result() is True, f"round of {gid} returned {task.result()!r}"
            self._round_finished(gid)

    def _round_finished(self, gid: str) -> None:
        # Seals were modelled when the round started (a hang keeps a cohort from sealing,
        # and sibling seals land as their attempts finish); a finished round only stops
        # running.
        del self.model.inflight[gid]

    @staticmethod
    def _seal(group: GroupModel, plan: RoundModel, outcomes: dict[int, str]) -> None:
        for index, outcome in outcomes.items():
            group.sealed[index] = plan.rollout_ids[index]
            if outcome == "poisoned":
                group.poisoned.add(index)
            else:
                group.poisoned.discard(index)

    def _checkpoint(self) -> None:
        """A checkpoint awaited whole (a background one still pending commits first)."""
        self._commit_pending()
        self._capture()
        self._commit_pending()

    def _capture(self) -> None:
        life = self.life
        controller = life.controller
        # The live state at the hold (nothing else runs: the loop is ours).
        live_ledger = controller.ledger.state_dict()
        live_replay = controller.replay.state_dict()
        live_state = {
            name: getattr(controller.state, name)
            for name in ("step", "weight_version", "prompts_taken", "rounds_used", "shortfall")
        }
        captured = life.run(controller.checkpoints.capture())
        self.pending = Pending(
            captured,
            self.model.step,
            live_ledger,
            live_replay,
            copy.deepcopy(live_state),
            tick=self.ticks,
        )

    def _commit_pending(self) -> None:
        pending, self.pending = self.pending, None
        if pending is None:
            return
        life = self.life
        controller = life.controller
        timing = life.run(controller._commit(pending.captured, delete_deferred=True))
        name = f"step_{timing.step:06d}"
        assert name == life.store.committed()[0].name
        # Invariant 9: the snapshot the journal on disk rebuilt is the live state at the
        # capture, whatever ran since.
        builder = controller.checkpoints.snapshots
        assert builder is not None and builder.position == timing.position
        assert builder.ledger.state_dict() == pending.ledger, "the journal replay diverged"
        assert builder.replay.state_dict() == pending.replay, "the replayed index diverged"
        for field_name, value in pending.state.items():
            assert getattr(builder.state, field_name) == value, field_name
        self.committed_step = pending.step
        self.committed_name = name
        if pending.tick == self.ticks:  # captured and committed in one rule
            self.changed_since_commit = False

    # -- rules ---------------------------------------------------------------------

    def _reserve_next(self) -> None:
        """The rollout pump reserves the next batch as soon as the previous one is admitted
        (then waits, outside any cut, for the staleness window to admit it)."""
        taken = len(self.model.groups)
        if self.model.where("reserved") or taken >= STEPS * BATCH:
            return
        batch = taken // BATCH
        group_ids = self.life.run(self.controller._reserve_batch(batch))
        expected = [f"g{position:07d}" for position in range(taken, taken + BATCH)]
        assert group_ids == expected
        for position, gid in zip(range(taken, taken + BATCH), group_ids, strict=True):
            idx = dataset_position_to_idx(position, size=len(self.dataset), seed=CONFIG.job.seed)
            self.model.groups[gid] = GroupModel(
                idx=idx, batch=batch, atomic=idx % 2 == 0, where="reserved"
            )

    def _reserved_batch(self) -> int | None:
        batches = {self.model.groups[gid].batch for gid in self.model.where("reserved")}
        return min(batches) if batches else None

    def _admissible(self) -> bool:
        batch = self._reserved_batch()
        return batch is not None and batch <= self.model.step + CONFIG.job.staleness_window

    @precondition(lambda self: self._admissible())
    @rule()
    def admission(self) -> None:
        """Admit the reserved batch once inside the staleness window; reserve the next."""
        batch = self._reserved_batch()
        assert batch is not None
        group_ids = sorted(
            gid for gid in self.model.where("reserved") if self.model.groups[gid].batch == batch
        )
        self.life.run(self.controller._admit(batch, group_ids))
        for gid in group_ids:
            self.model.groups[gid].where = "admitted"
        self._reserve_next()

    def _runnable(self) -> list[str]:
        return sorted(
            gid
            for gid in self.model.where("admitted")
            if gid not in self.model.inflight
            and len(self.model.groups[gid].sealed) < N
            and not self.model.groups[gid].undroppable
        )

    @precondition(lambda self: bool(self._runnable()))
    @rule(data=st.data())
    def generation_round(self, data: st.DataObject) -> None:
        gid = data.draw(st.sampled_from(self._runnable()), label="group")
        outcomes = data.draw(
            st.lists(st.sampled_from(OUTCOMES), min_size=N, max_size=N), label="outcomes"
        )
        group = self.model.groups[gid]
        backend = self.life.backend
        backend.plans[gid] = dict(enumerate(outcomes))
        seen = len(backend.requests)
        self.life.rounds[gid] = self.life.loop.create_task(self.controller._run_round(gid))
        if group.rounds >= MAX_ROUNDS:
            self.life.loop.run_until_idle()
            task = self.life.rounds.pop(gid)
            if self.model.expected_groups(group.batch) - 1 < MINIMUM_GROUPS:
                # The drop would leave its step untrainable: refused before it is recorded
                # (a checkpoint holding it could never continue); the run stops.
                assert task.done() and isinstance(task.exception(), StepShortfallError)
                assert len(backend.requests) == seen, "a refused drop dispatched attempts"
                group.undroppable = True
                self._crash_and_restore()
                return
            assert task.done() and task.result() is False, "an exhausted group was not dropped"
            assert len(backend.requests) == seen, "a dropped group dispatched attempts"
            group.where = "dropped"
            self.model.drops[group.batch] = self.model.drops.get(group.batch, 0) + 1
            self.changed_since_commit = True
            return
        group.rounds += 1
        pending = sorted(set(range(N)) - set(group.sealed))
        self.life.loop.run_until_idle()
        requested = {r.generation_index: r.rollout_id for r in backend.requests[seen:]}
        # Invariant 4: sealed work is never regenerated.
        assert sorted(requested) == pending, (
            f"{gid}: dispatched siblings {sorted(requested)}, expected the unsealed {pending} "
            f"(sealed: {group.sealed})"
        )
        for index, rid in requested.items():
            assert rid not in self.model.dispatched, f"rollout id {rid} dispatched twice"
            self.model.dispatched[rid] = (gid, index)
            # Call-level resume: a sibling's lost attempt (failed, crashed, hung past its
            # deadline, or interrupted by a restart) left its first call staged; the next
            # attempt continues it. A cohort starts over whole.
            lost = self.model.last_attempt.get((gid, index))
            handed = backend.handed.get(rid)
            expected = None if group.atomic else lost
            assert handed == expected, (
                f"{gid}[{index}]: attempt {rid} was handed the calls of {handed}, expected "
                f"those of its lost attempt {expected}"
            )
            self.model.last_attempt[(gid, index)] = rid
        plan = RoundModel({i: outcomes[i] for i in pending}, requested)
        self.model.inflight[gid] = plan
        if not group.atomic:
            self._seal(group, plan, {i: o for i, o in plan.outcomes.items() if o in SUCCESS})
        elif all(o in SUCCESS for o in plan.outcomes.values()):
            self._seal(group, plan, plan.outcomes)
        self._settle()

    def _hung_for(self, ticks: int) -> list[str]:
        since = self.life.backend.parked_since
        return sorted(rid for rid, tick in since.items() if self.ticks - tick >= ticks)

    def _overdue(self) -> bool:
        return bool(self._hung_for(HANG_TICKS))

    def _progress_possible(self) -> bool:
        """Whether admission, generation, publication or training can go on right now."""
        return (
            self._admissible()
            or bool(self._runnable())
            or bool(self._publishable())
            or self._trainable()
        )

    @precondition(
        lambda self: self.life.backend.parked and (self._overdue() or not self._progress_possible())
    )
    @rule()
    def deadline(self) -> None:
        # Every hung attempt started at or before now: one deadline reaches them all.
        self.life.loop.advance(DEADLINE_S + 0.001)
        self._settle()
        assert not self.life.rounds, f"rounds still running past the deadline: {self.life.rounds}"

    @precondition(lambda self: bool(self._hung_for(CRASH_TICKS)))
    @rule(data=st.data())
    def worker_crash(self, data: st.DataObject) -> None:
        """The worker(s) running some hung attempts die: those attempts fail at once."""
        victims = data.draw(
            st.lists(st.sampled_from(self._hung_for(CRASH_TICKS)), min_size=1, unique=True),
            label="victims",
        )
        for rid in victims:
            self.life.backend.parked[rid].set_exception(
                GenerationError(FailureReason.WORKER_CRASHED, "the worker running it died")
            )
        self._settle()

    def _publishable(self) -> list[str]:
        return sorted(
            gid
            for gid in self.model.where("admitted")
            if gid not in self.model.inflight and len(self.model.groups[gid].sealed) == N
        )

    @precondition(lambda self: bool(self._publishable()))
    @rule(data=st.data())
    def publish(self, data: st.DataObject) -> None:
        gid = data.draw(st.sampled_from(self._publishable()), label="group")
        self.life.run(self.controller._publish(gid))
        self.model.groups[gid].where = "replay"

    def _trainable(self) -> bool:
        step = self.model.step
        expected = self.model.expected_groups(step)
        return (
            step < STEPS and expected >= MINIMUM_GROUPS and self.model.ready_count(step) >= expected
        )

    @precondition(lambda self: self._trainable())
    @rule(checkpoint=st.sampled_from(["now", "now", "background", "background", "later"]))
    def train_step(self, checkpoint: str) -> None:
        """A train step, and the checkpoint the pump takes right after it (every_steps is
        1): whole, or captured now and committed by a later rule (``background``, the
        previous one committed first, as the pump awaits it), or, now and then, not yet:
        the ``checkpoint`` rule takes it later, or a crash comes first."""
        step = self.model.step
        self.life.run(self.controller._train_step(step))
        for gid, group in self.model.groups.items():
            if group.where == "replay" and group.batch == step:
                group.where = "trained"
                self.model.trained_in[gid] = step
        self.model.step = step + 1
        self.changed_since_commit = True
        if checkpoint == "now":
            self._checkpoint()
        elif checkpoint == "background":
            self._commit_pending()
            self._capture()

    def _changed(self) -> bool:
        """Anything happened since the last commit (else a crash tests nothing new)."""
        return self.changed_since_commit or bool(self.life.rounds)

    def _checkpointable(self) -> bool:
        # The train pump checkpoints after a train step, so never the same step twice in
        # one incarnation: the deferred deletions count commits, and a re-save of a step
        # replaces a directory instead of adding one.
        captured = self.committed_step if self.pending is None else self.pending.step
        return self.model.step > max(self.committed_step, captured)

    @precondition(lambda self: self._checkpointable())
    @rule()
    def checkpoint(self) -> None:
        """A checkpoint some time after a train step (the pump's, delayed by other work)."""
        self._checkpoint()

    @precondition(lambda self: self.pending is not None)
    @rule()
    def commit_background(self) -> None:
        """The background write of the captured checkpoint finishes and commits."""
        self._commit_pending()

    def _short_step(self) -> bool:
        """Every group of the step is resolved and too few are left to train it."""
        step = self.model.step
        return step < STEPS and self.model.expected_groups(step) < MINIMUM_GROUPS

    @precondition(lambda self: self._short_step())
    @rule()
    def step_shortfall(self) -> None:
        """The train pump refuses a step its drops left too short; the run stops and the
        next start resumes from the last checkpoint."""
        with pytest.raises(StepShortfallError):
            self.life.run(self.controller._train_pump())
        self._crash_and_restore()

    def _idle(self) -> bool:
        return not self._progress_possible() and not self.life.backend.parked

    @precondition(
        lambda self: (self._changed() and self.rules_since_boot >= CRASH_SPACING) or self._idle()
    )
    @rule()
    def crash(self) -> None:
        self._crash_and_restore()

    def _crash_and_restore(self) -> None:
        sealed_before = _seal_ids(read_entries(self.run_dir / "events.jsonl"))
        self.pending = None  # a write in the background dies with the process
        self._kill()
        model = self.model
        interrupted = {
            rid
            for gid, plan in model.inflight.items()
            for index, rid in plan.rollout_ids.items()
            if index not in model.groups[gid].sealed
        }
        for gid, plan in model.inflight.items():
            if any(index not in model.groups[gid].sealed for index in plan.rollout_ids):
                # The restart abandons the round's attempts and gives the round back.
                model.groups[gid].rounds -= 1
        model.inflight.clear()
        # The journal kept everything else; training after the checkpoint rolls back.
        for gid, step in list(model.trained_in.items()):
            if step >= self.committed_step:
                model.groups[gid].where = "replay"
                del model.trained_in[gid]
        model.step = self.committed_step
        self.life = self._boot()
        # Invariant 9: every seal journaled before the crash is still sealed or trained.
        controller = self.controller
        kept = {
            record.gate_rollout_id(index)
            for record in controller.ledger.groups()
            for index in record.sealed_generation_indices
        }
        published = {
            rid
            for gid in model.where("replay", "trained")
            for rid in model.groups[gid].sealed.values()
        }
        dropped = {
            rid for gid in model.where("dropped") for rid in model.groups[gid].sealed.values()
        }
        lost = sealed_before - kept - published - dropped
        assert not lost, f"seals journaled before the crash are gone: {sorted(lost)[:5]}"
        # Invariant 5: after a restore the partitions hold exactly what the state owns, and
        # the first call of each unsealed sibling's lost attempt, kept to be continued.
        controller = self.controller
        staging = set(self.durable.keys(CaptureWriter.staging_partition))
        resumable = {
            f"{model.last_attempt[(record.group_id, index)]}/c0"
            for record in controller.ledger.groups()
            if not model.groups[record.group_id].atomic
            for index in range(N)
            if index not in model.groups[record.group_id].sealed
            and (record.group_id, index) in model.last_attempt
        }
        expected = controller.ledger.expected_staging_keys() | resumable
        assert staging == expected, (
            f"after restore, staging holds {sorted(staging - expected)[:5]} unowned and "
            f"lacks {sorted(expected - staging)[:5]}"
        )
        canonical = set(self.durable.keys(CANONICAL_PARTITION))
        owned = set(controller.replay.row_keys())
        assert canonical == owned, (
            f"after restore, canonical holds {sorted(canonical - owned)[:5]} unowned and "
            f"lacks {sorted(owned - canonical)[:5]}"
        )
        # Every attempt the crash interrupted is stamped abandoned because of the restart.
        restarted = {
            attempt.rollout_id
            for entry in read_entries(self.run_dir / "events.jsonl")
            if isinstance(entry.record, AttemptsAbandoned)
            for attempt in entry.record.attempts
            if attempt.reason is FailureReason.RESTART
        }
        assert interrupted <= restarted, (
            f"interrupted attempts not stamped abandoned: {sorted(interrupted - restarted)}"
        )

    def _journal_replays_to_the_live_state(self, entries: list[JournalEntry]) -> None:
        ledger = RolloutRecoveryLedger()
        replay = ReplayIndex(data_plane=metadata_only_plane(), group_size=N)
        state = ControllerState.initial(0)
        JournalReplay(
            ledger=ledger, replay=replay, state=state, journal=self.run_dir / "events.jsonl"
        ).follow(_ReplayCut(), entries)
        controller = self.controller
        assert ledger.state_dict() == controller.ledger.state_dict(), "the ledger diverged"
        assert replay.state_dict() == controller.replay.state_dict(), "the index diverged"
        live = msgspec.structs.replace(controller.state, config={}, identity="")
        assert msgspec.structs.asdict(state) == msgspec.structs.asdict(live), "the state diverged"

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def invariants_hold(self) -> None:
        self.rules_since_boot += 1
        self.ticks += 1
        for rid in self.life.backend.parked:
            self.life.backend.parked_since.setdefault(rid, self.ticks)
        controller = self.controller
        model = self.model
        ledger = controller.ledger
        entries = read_entries(self.run_dir / "events.jsonl")
        records = [entry.record for entry in entries]
        surviving = _surviving_rows(entries)

        # The controller's own bookkeeping follows the model.
        state = controller.state
        assert state.prompts_taken == len(model.groups)
        assert state.step == model.step
        assert state.weight_version == controller.trainer.weight_version
        assert state.shortfall == model.shortfall, (state.shortfall, model.shortfall)
        taken_events = [r.group_id for r in records if isinstance(r, PromptTaken)]
        assert taken_events == list(model.groups), "the journal's prompt_taken records differ"
        # Weight versions are unique over the whole journal, rolled-back steps included.
        versions = [r.weight_version for r in records if isinstance(r, StepTrained)]
        assert len(versions) == len(set(versions)), f"a version named twice: {versions}"
        assert state.highest_weight_version == max(versions, default=0)
        # The trail checker of the auditor agrees (a run still going).
        report = check_trail(self.run_dir / "events.jsonl", complete=False)
        assert report.ok, report.violations
        # Invariant 9: the whole journal, replayed from its first line through the one
        # transition of each record (restores included), arrives at the live state.
        self._journal_replays_to_the_live_state(entries)

        # 1. Ownership: exactly one of ledger, replay index, trained, dropped-with-reason.
        in_ledger = {group.group_id for group in ledger.groups()}
        in_replay = set(controller.replay.group_ids())
        trained = {row.group_id for _, row in surviving}
        dropped = {r.group_id for r in records if isinstance(r, PromptDropped)}
        assert all(r.reason for r in records if isinstance(r, PromptDropped))
        places = {"ledger": in_ledger, "replay": in_replay, "trained": trained, "dropped": dropped}
        for gid in model.groups:
            owners = [name for name, ids in places.items() if gid in ids]
            assert len(owners) == 1, f"{gid} is owned by {owners or 'nobody'}"
        stray = set().union(*places.values()) - set(model.groups)
        assert not stray, f"owned but never taken: {sorted(stray)}"
        assert in_ledger == model.where("reserved", "admitted"), (in_ledger, model.groups)
        assert in_replay == model.where("replay"), (in_replay, model.groups)
        assert trained == model.where("trained"), (trained, model.groups)
        assert dropped == model.where("dropped"), (dropped, model.groups)
        for record in ledger.groups():
            reserved = model.groups[record.group_id].where == "reserved"
            assert (record.phase is PromptGroupPhase.RESERVED) == reserved, record.group_id

        # 2. Published groups: N canonical rows, each from its sibling's sealed attempt.
        for gid in in_replay:
            group = model.groups[gid]
            replay_group = controller.replay.group(gid)
            assert len(replay_group.row_keys) == N
            assert replay_group.target_step == group.batch
            rows = self.durable.get(CANONICAL_PARTITION, list(replay_group.row_keys))
            by_index = {row.metadata["generation_index"]: row.metadata for row in rows}
            assert sorted(by_index) == list(range(N)), f"{gid}: rows {sorted(by_index)}"
            for index, meta in by_index.items():
                assert meta["group_id"] == gid
                assert meta["rollout_id"] == group.sealed[index], (
                    f"{gid}[{index}]: canonical row from {meta['rollout_id']}, "
                    f"sealed {group.sealed[index]}"
                )
                assert meta["valid"] is (index not in group.poisoned), (gid, index, meta)
        published = [r.group_id for r in records if isinstance(r, GroupPublished)]
        assert len(published) == len(set(published)), f"published twice: {published}"
        assert set(published) == model.where("replay", "trained")

        # 3. Training: no sibling twice, each group in its target step with N rows.
        siblings = [(row.group_id, row.generation_index) for _, row in surviving]
        assert len(siblings) == len(set(siblings)), "a sibling was trained twice"
        for gid in trained:
            group = model.groups[gid]
            lines = [(step, row) for step, row in surviving if row.group_id == gid]
            assert len(lines) == N, f"{gid} trained with {len(lines)} rows"
            assert {step for step, _ in lines} == {group.batch}, f"{gid} trained off-step"
            for _, row in lines:
                assert row.rollout_id == group.sealed[row.generation_index]
                assert row.valid is (row.generation_index not in group.poisoned)

        # 4. Seals: the ledger's are the model's; nothing is DISPATCHED that no round runs;
        #    every dispatched attempt is sealed, running or stamped abandoned.
        for record in ledger.groups():
            group = model.groups[record.group_id]
            sealed = {
                index: record.gate_rollout_id(index) for index in record.sealed_generation_indices
            }
            assert sealed == group.sealed, f"{record.group_id}: ledger {sealed}, model"
            dispatched = {
                s.generation_index
                for s in record.siblings
                if s.current_attempt.status is RolloutAttemptStatus.DISPATCHED
            }
            plan = model.inflight.get(record.group_id)
            running = set() if plan is None else set(plan.rollout_ids) - set(group.sealed)
            assert dispatched == running, (
                f"{record.group_id}: DISPATCHED {sorted(dispatched)}, running {sorted(running)}"
            )
            granularity = (
                RecoveryGranularity.PROMPT_GROUP if group.atomic else RecoveryGranularity.SIBLING
            )
            assert record.recovery_granularity is granularity
        sealed_ids = {rid for group in model.groups.values() for rid in group.sealed.values()}
        running_ids = {
            rid
            for gid, plan in model.inflight.items()
            for index, rid in plan.rollout_ids.items()
            if index not in model.groups[gid].sealed
        }
        abandoned = {
            attempt.rollout_id
            for r in records
            if isinstance(r, AttemptsAbandoned)
            for attempt in r.attempts
        }
        assert not abandoned & sealed_ids, f"sealed attempts abandoned: {abandoned & sealed_ids}"
        unaccounted = set(model.dispatched) - sealed_ids - running_ids - abandoned
        assert not unaccounted, f"dispatched attempts neither sealed nor abandoned: {unaccounted}"
        assert sealed_ids <= _seal_ids(entries), f"seals missing from the journal: {sealed_ids}"

        # 5. The store holds every row the ledger, the index and a restorable checkpoint own.
        staging = set(self.durable.keys(CaptureWriter.staging_partition))
        canonical = set(self.durable.keys(CANONICAL_PARTITION))
        missing = ledger.expected_staging_keys() - staging
        assert not missing, f"staged rows the ledger owns are gone: {sorted(missing)[:5]}"
        assert set(controller.replay.row_keys()) <= canonical
        # ... and lets go of what nobody owns any more: the staged rows of a group that
        # left the ledger (published or dropped) are deleted or waiting for deletion.
        # (Rows of failed or interrupted attempts wait for the next restore, by design.)
        pending = {key for partition, key in controller.data_plane._pending}
        gone = {
            rid
            for group in model.groups.values()
            if group.where in ("replay", "trained", "dropped")
            for rid in group.sealed.values()
        }
        # A staging key is "{rollout_id}/{model_call_id}".
        leaked = {key for key in staging - pending if key.split("/", 1)[0] in gone}
        assert not leaked, f"staged rows nobody owns are never deleted: {sorted(leaked)[:5]}"
        # A crash now restores the newest checkpoint and replays the journal: it needs the
        # rows of the state at the journal's end, and the canonical rows of every group
        # trained since that checkpoint (their training rolls back and runs again).
        rolled_back = {
            key
            for gid, step in model.trained_in.items()
            if step >= self.committed_step
            for key in (f"{gid}_g{i}" for i in range(N))
        }
        missing_rolled_back = rolled_back - canonical
        assert not missing_rolled_back, (
            f"a crash could not retrain: canonical rows {sorted(missing_rolled_back)[:5]} gone"
        )

        # Liveness: once the step's groups are all published or dropped, it can train.
        step = model.step
        batch_groups = [g for g in model.groups.values() if g.batch == step]
        if (
            step < STEPS
            and len(batch_groups) == BATCH
            and all(g.where in ("replay", "dropped") for g in batch_groups)
        ):
            ready = len(controller.replay.ready_groups(step))
            assert ready >= controller._expected_groups(step), (
                f"step {step} can never train: {ready} groups ready, "
                f"{controller._expected_groups(step)} expected"
            )


# ------------------------------------------------------------------------- the tests

MACHINE_SETTINGS = settings(
    # Every check runs after every rule over the whole journal so far, so an example's
    # cost grows with the square of its steps; every planted bug below is found within
    # 30 steps, and 40 leave room beyond that.
    max_examples=50,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.slow
def test_controller_state_machine() -> None:
    run_state_machine_as_test(ControllerMachine, settings=MACHINE_SETTINGS)


# -- planted bugs -------------------------------------------------------------------------


def _skip_staging_inventory(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(checkpointing, "reconcile_staging", lambda *args, **kwargs: [])


def _skip_prepare_for_restart(patch: pytest.MonkeyPatch) -> None:
    # Only the restore's call: verification's dry run keeps the real method.
    real = RolloutRecoveryLedger.prepare_for_restart

    def prepare(self: RolloutRecoveryLedger, cut: Any) -> None:
        if isinstance(cut, checkpointing._AnyCut):
            real(self, cut)

    patch.setattr(RolloutRecoveryLedger, "prepare_for_restart", prepare)


def _abandon_without_stamp(patch: pytest.MonkeyPatch) -> None:
    # The record is journaled and counted, but its transition never reaches the ledger.
    async def abandon(self: Controller, group_id: str, failures: list[AttemptFailure]) -> None:
        async with self.barrier.mutation("recovery_retries"):
            record = AttemptsAbandoned(
                group_id=group_id,
                attempts=[
                    AbandonedAttempt(f.generation_index, f.rollout_id, f.reason) for f in failures
                ],
            )
            self.state.apply(record)
            self.history.append(record)

    patch.setattr(Controller, "_abandon", abandon)


def _abandon_without_event(patch: pytest.MonkeyPatch) -> None:
    async def abandon(self: Controller, group_id: str, failures: list[AttemptFailure]) -> None:
        async with self.barrier.mutation("recovery_retries") as cut:
            self.ledger.abandon_unsealed(cut, group_id)

    patch.setattr(Controller, "_abandon", abandon)


def _train_keeps_replay(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(ReplayIndex, "clear", lambda self, cut, group_ids: None)


def _immediate_deletion(patch: pytest.MonkeyPatch) -> None:
    def clear(
        self: DeferredDeletionDataPlane, partition: str, keys: Any, *, cut: Any = None
    ) -> None:
        self.inner.clear(partition, list(keys), cut=cut)

    patch.setattr(DeferredDeletionDataPlane, "clear", clear)


def _drop_without_shortfall(patch: pytest.MonkeyPatch) -> None:
    real = Controller._drop

    async def drop(self: Controller, group_id: str, **kwargs: Any) -> None:
        saved = dict(self.state.shortfall)
        await real(self, group_id, **kwargs)
        self.state.shortfall = saved

    patch.setattr(Controller, "_drop", drop)


def _restore_keeps_unowned_canonical(patch: pytest.MonkeyPatch) -> None:
    real = FencedDataPlane.clear

    def clear(self: FencedDataPlane, partition: str, keys: Any, *, cut: Any = None) -> None:
        # Only the restore clears canonical rows under a cut (the deferred plane deletes
        # later, without one).
        if partition == CANONICAL_PARTITION and cut is not None:
            return
        real(self, partition, keys, cut=cut)

    patch.setattr(FencedDataPlane, "clear", clear)


def _publish_keeps_staging(patch: pytest.MonkeyPatch) -> None:
    real = Transitions._apply_group_published

    class KeepStaging:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def clear(self, partition: str, keys: Any, *, cut: Any = None) -> None:
            if partition != CaptureWriter.staging_partition:
                self.inner.clear(partition, keys, cut=cut)

    def publish(self: Transitions, *args: Any) -> None:
        rows = self.rows
        self.rows = KeepStaging(rows)  # type: ignore[assignment]
        try:
            real(self, *args)
        finally:
            self.rows = rows

    patch.setattr(Transitions, "_apply_group_published", publish)


def _restore_without_restart_stamp(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(checkpointing, "_dispatched_attempts", lambda ledger: {})


def _replay_drops_seals(patch: pytest.MonkeyPatch) -> None:
    real = JournalReplay._apply

    def apply(self: JournalReplay, cut: Any, entry: JournalEntry, **kwargs: Any) -> None:
        if not isinstance(entry.record, SiblingSealed):
            real(self, cut, entry, **kwargs)

    patch.setattr(JournalReplay, "_apply", apply)


def _versions_reused_after_restore(patch: pytest.MonkeyPatch) -> None:
    real = Controller._train_step

    async def train_step(self: Controller, step: int) -> None:
        self.state.highest_weight_version = self.state.weight_version
        await real(self, step)

    patch.setattr(Controller, "_train_step", train_step)


def _live_forgets_a_record(patch: pytest.MonkeyPatch) -> None:
    # The live run journals a checkpoint's commit without applying it (its counters).
    real = Controller.record

    def record(self: Controller, record: Any, **kwargs: Any) -> None:
        if isinstance(record, CheckpointCommitted):
            self.history.append(record)
        else:
            real(self, record, **kwargs)

    patch.setattr(Controller, "record", record)


def _restore_forgets_resumable_calls(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(checkpointing, "_resumable_calls", lambda *args: ([], []))


def _dispatch_ignores_lost_calls(patch: pytest.MonkeyPatch) -> None:
    async def resumable(self: Controller, record: Any, pending: Any) -> dict[int, Any]:
        return {}

    patch.setattr(Controller, "_resumable", resumable)


def _replay_keeps_training(patch: pytest.MonkeyPatch) -> None:
    # Only a replay ever passes rolled_back=True: the live run never rolls back.
    real = Transitions.apply

    def apply(self: Transitions, cut: Any, record: Any, **kwargs: Any) -> None:
        real(self, cut, record, **{**kwargs, "rolled_back": False})

    patch.setattr(Transitions, "apply", apply)


def _capture_reads_the_live_trainer(patch: pytest.MonkeyPatch) -> None:
    # The capture copies nothing: the commit encodes the trainer as it is by then.
    class Live:
        def __init__(self, trainer: Any) -> None:
            self.trainer = trainer

        @property
        def weight_version(self) -> int:
            return int(self.trainer.weight_version)

        def encode(self) -> dict[str, bytes]:
            files = CheckpointStore.FILES
            return {files.trainer_state: _npz(self.trainer.state())}

    async def stage(trainer: Any) -> Any:
        return Live(trainer)

    patch.setattr(checkpointing, "stage_trainer_state", stage)


def _npz(arrays: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


PLANTED: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "capture_reads_the_live_trainer": _capture_reads_the_live_trainer,
    "skip_staging_inventory": _skip_staging_inventory,
    "skip_prepare_for_restart": _skip_prepare_for_restart,
    "abandon_without_stamp": _abandon_without_stamp,
    "abandon_without_event": _abandon_without_event,
    "train_keeps_replay": _train_keeps_replay,
    "immediate_deletion": _immediate_deletion,
    "drop_without_shortfall": _drop_without_shortfall,
    "restore_keeps_unowned_canonical": _restore_keeps_unowned_canonical,
    "publish_keeps_staging": _publish_keeps_staging,
    "restore_without_restart_stamp": _restore_without_restart_stamp,
    "replay_drops_seals": _replay_drops_seals,
    "versions_reused_after_restore": _versions_reused_after_restore,
    "replay_keeps_training": _replay_keeps_training,
    "restore_forgets_resumable_calls": _restore_forgets_resumable_calls,
    "dispatch_ignores_lost_calls": _dispatch_ignores_lost_calls,
    "live_forgets_a_record": _live_forgets_a_record,
}

PLANTED_SETTINGS = settings(
    # Derandomized, so each run replays the same examples; the cap leaves room for the
    # rarer scenarios (a checkpoint holding hung attempts, then a crash), which random
    # seeds find after 4 to ~250 examples.
    max_examples=300,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],  # finding it is the point; shrinking only costs time
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)


@pytest.fixture
def quiet_hypothesis(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    yield
    capsys.readouterr()  # the falsifying example hypothesis prints is expected here


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_is_caught(
    bug: str, monkeypatch: pytest.MonkeyPatch, quiet_hypothesis: None
) -> None:
    PLANTED[bug](monkeypatch)
    with pytest.raises((AssertionError, RolloutRecoveryError)):
        run_state_machine_as_test(ControllerMachine, settings=PLANTED_SETTINGS)
