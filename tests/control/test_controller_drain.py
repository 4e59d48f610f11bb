"""The controller's drain (issue 18, item 2), on an event loop whose clock moves only when
the test says so.

The job's own components run (dataset, numpy trainer, simulated backend, SQLite store,
journal, checkpoint store), but every attempt waits at a gate the test opens: each
attempt is released to run, failed, or left running. ``request_drain`` is called on the
loop, like the job's signal handlers do, and the grace (``[job] drain_grace_s``) runs out
only when the test advances the loop's clock past it. After the drain and its checkpoint,
``run_job`` resumes the directory with the ungated backend and runs it to the end, and the
audit must pass.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery._clock import VirtualClockLoop
from rollout_recovery.capture import CaptureWriter, StagedPrefix
from rollout_recovery.control import Controller, RunConfig
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.dataplane import SqliteDataPlane
from rollout_recovery.history import AuditTrail, audit_run
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.history.records import (
    AttemptsAbandoned,
    BatchAdmitted,
    CheckpointCommitted,
    GroupPublished,
    PromptTaken,
    Restored,
    RoundStarted,
    RunStarted,
    SiblingSealed,
)
from rollout_recovery.job import run_job
from rollout_recovery.job._components import default_components
from rollout_recovery.job._run_job import claim_run_directory
from rollout_recovery.ledger import RecoveryGranularity
from rollout_recovery.rollout import (
    AttemptFailure,
    AttemptRequest,
    AttemptResult,
    FailureReason,
    GenerationBackend,
)
from rollout_recovery.rundir import CheckpointStore, RunDirectory

GRACE_S = 30.0  # virtual seconds: the clock moves only when a test advances it


def drain_config(*, max_inflight_attempts: int = 64) -> RunConfig:
    """Three prompts a step, two generations, no admission ahead of training (batch 0
    only until step 0 trains), no faults, model calls that take no time."""
    return config_from_builtins(
        {
            "job": {
                "steps": 3,
                "prompts_per_step": 3,
                "generations_per_prompt": 2,
                "staleness_window": 0,
                "seed": 0,
                "drain_grace_s": GRACE_S,
            },
            # Only dataset index 0 is a prompt-group cohort; the tests check their groups.
            "task": {"prompt_group_every": 4096},
            "generation": {
                "call_latency_s": 0.0,
                "latency_jitter": 0.0,
                "attempt_deadline_s": 1000.0,
                "max_inflight_attempts": max_inflight_attempts,
            },
            "faults": {
                "attempt_failure_rate": 0.0,
                "straggler_rate": 0.0,
                "hang_rate": 0.0,
                "capture_failure_rate": 0.0,
                "tamper_rate": 0.0,
                "worker_crash_rate": 0.0,
            },
            "retry": {"max_rounds": 4, "backoff_s": 0.0},
            "checkpoint": {"every_steps": 1, "keep": 3},
            "liveness": {"step_timeout_s": 1000.0},
        }
    )


class GatedBackend:
    """The job's own backend behind a gate per attempt: ``open(rid, "run")`` lets it run,
    ``open(rid, "fail")`` fails it; an attempt never opened runs until cancelled."""

    def __init__(self, inner: GenerationBackend) -> None:
        self.inner = inner
        self.started: list[AttemptRequest] = []
        self.gates: dict[str, asyncio.Future[str]] = {}
        self.returned: dict[str, asyncio.Event] = {}
        self._arrived: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._arrived is None:
            self._arrived = asyncio.Condition()
        return self._arrived

    def update_weights(self, version: int, weights: object) -> None:
        self.inner.update_weights(version, weights)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def run_attempt(
        self, request: AttemptRequest, capture: CaptureWriter, prefix: StagedPrefix | None = None
    ) -> AttemptResult | AttemptFailure:
        rid = request.rollout_id
        self.started.append(request)
        gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.gates[rid] = gate
        self.returned[rid] = asyncio.Event()
        async with self._condition():
            self._condition().notify_all()
        try:
            if await gate == "fail":
                return AttemptFailure(
                    rollout_id=rid,
                    generation_index=request.generation_index,
                    reason=FailureReason.ATTEMPT_FAILED,
                    detail="failed by the test",
                )
            return await self.inner.run_attempt(request, capture, prefix)
        finally:
            self.returned[rid].set()

    async def wait_started(self, count: int) -> None:
        async with self._condition():
            await self._condition().wait_for(lambda: len(self.started) >= count)

    def open(self, request: AttemptRequest, action: str = "run") -> None:
        self.gates[request.rollout_id].set_result(action)

    def of_group(self, group_id: str) -> list[AttemptRequest]:
        return sorted(
            (r for r in self.started if r.group_id == group_id), key=lambda r: r.generation_index
        )


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Let the loop run until ``predicate`` holds (bounded in loop turns, not in time)."""
    for _ in range(200_000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the loop went on without {what}")


@dataclass
class Drained:
    """One drained run: its directory, controller, gated backend and the journal records
    appended from the drain request on."""

    run: RunDirectory
    config: RunConfig
    controller: Controller
    backend: GatedBackend
    asked_at: int = 0
    records_after: list[Any] = field(default_factory=list)


@pytest.fixture
def drained_run(tmp_path: Path) -> Iterator[Callable[..., Drained]]:
    """``drained_run(script, config)``: run a fresh job until ``script(harness, loop)`` (a
    coroutine on the virtual loop) has asked for the drain and let it end, then take the
    drain's checkpoint as the job does. ``ask_first``: the drain is asked before ``run``."""
    closers: list[Callable[[], None]] = []

    def make(
        script: Callable[[Drained, VirtualClockLoop], Any],
        config: RunConfig,
        *,
        ask_first: bool = False,
    ) -> Drained:
        run = RunDirectory(tmp_path / "run")
        run.root.mkdir()
        claim_run_directory(run, config)
        plane = SqliteDataPlane(run.data_plane_file)
        closers.append(plane.close)
        parts = default_components(config, plane)
        backend = GatedBackend(parts.backend)
        audit = AuditTrail(run)
        closers.append(audit.close)
        audit.journal.sync_in_thread = False  # seals are durable without leaving the loop
        controller = Controller(
            config=config,
            dataset=parts.dataset,
            backend=backend,
            trainer=parts.trainer,
            data_plane=plane,
            history=audit,
            checkpoint_store=CheckpointStore(run.root, keep=config.checkpoint.keep),
        )
        harness = Drained(run, config, controller, backend)
        loop = VirtualClockLoop()

        async def main() -> None:
            job = config.job
            controller.record(
                RunStarted(
                    pid=os.getpid(),
                    resumed_from=None,
                    step=0,
                    steps=job.steps,
                    prompts_per_step=job.prompts_per_step,
                    group_size=job.generations_per_prompt,
                )
            )
            controller.follow_journal()
            await controller.checkpoint()
            controller.set_checkpointer(controller.checkpoint)
            if ask_first:
                ask(harness)
            running = asyncio.create_task(controller.run())
            await script(harness, loop)
            await running
            assert controller.drain_report is not None, "run() ended without a drain"
            await controller.checkpoint(delete_deferred=False)
            await backend.aclose()

        try:
            loop.run_until_complete(main())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()
            for close in reversed(closers):
                close()
            closers.clear()
        harness.records_after = [
            entry.record for entry in read_entries(run.events) if entry.offset >= harness.asked_at
        ]
        return harness

    yield make
    for close in reversed(closers):
        close()


def ask(harness: Drained) -> None:
    harness.asked_at = harness.controller.history.position
    assert harness.controller.request_drain("asked by the test")


def sibling_groups(harness: Drained, count: int) -> list[str]:
    ledger = harness.controller.ledger
    groups = sorted({r.group_id for r in harness.backend.started})
    assert len(groups) == count, groups
    for group_id in groups:
        granularity = ledger.get_group(group_id).recovery_granularity
        assert granularity is RecoveryGranularity.SIBLING, (group_id, granularity)
    return groups


def resume_to_the_end(harness: Drained) -> Any:
    result = run_job(harness.run.root, harness.config)
    assert result.summary.steps == harness.config.job.steps
    report = audit_run(harness.run.root)
    assert report.ok, "\n".join(report.violations[:20])
    assert report.complete
    (restored,) = [
        entry.record
        for entry in read_entries(harness.run.events)
        if isinstance(entry.record, Restored)
    ]
    return restored


def test_attempts_that_finish_within_the_grace_seal_and_nothing_new_starts(
    drained_run: Callable[..., Drained],
) -> None:
    """Everything in flight finishes before the grace: the drain ends as soon as it has
    (the clock never moved), nothing new was admitted or dispatched, and the resumed run
    regenerates nothing."""

    async def script(harness: Drained, loop: VirtualClockLoop) -> None:
        backend = harness.backend
        await backend.wait_started(6)  # batch 0: 3 groups x 2 siblings
        ask(harness)
        for request in list(backend.started):
            backend.open(request)

    harness = drained_run(script, drain_config())
    report = harness.controller.drain_report
    assert report is not None
    assert (report.in_flight, report.cut_short, report.abandoned) == (6, 0, 0)
    assert report.waited_s == 0.0  # on the loop's clock: no grace was needed
    assert report.step == 0
    assert len(harness.backend.started) == 6  # not one attempt after the request
    kinds = [type(record) for record in harness.records_after]
    assert kinds.count(SiblingSealed) == 6
    assert kinds.count(GroupPublished) == 3
    assert kinds.count(CheckpointCommitted) == 1
    for new_work in (PromptTaken, BatchAdmitted, RoundStarted, AttemptsAbandoned):
        assert new_work not in kinds, new_work

    restored = resume_to_the_end(harness)
    assert restored.step == 0 and restored.rolled_back_steps == []
    assert restored.canonical_groups == 3  # the drained batch is kept whole
    assert (restored.seals_lost, restored.tokens_lost, restored.tokens_in_flight_lost) == (0, 0, 0)
    records = [entry.record for entry in read_entries(harness.run.events)]
    assert not [r for r in records if isinstance(r, AttemptsAbandoned)], "work was regenerated"


def test_the_grace_ends_on_the_loops_clock_and_what_is_still_running_is_abandoned(
    drained_run: Callable[..., Drained],
) -> None:
    """Of three groups in flight, one finishes within the grace (sealed and published),
    one has an attempt fail (abandoned with its reason; no new round while draining), and
    one is still running when the grace runs out: it is cancelled and abandoned with
    reason ``drain``. The rerun regenerates exactly those three attempts."""
    state: dict[str, Any] = {}

    async def script(harness: Drained, loop: VirtualClockLoop) -> None:
        backend, controller = harness.backend, harness.controller
        await backend.wait_started(6)
        done, failing, running = sibling_groups(harness, 3)
        state.update(done=done, failing=failing, running=running)
        ask(harness)
        for request in backend.of_group(done):
            backend.open(request)
        first, second = backend.of_group(failing)
        backend.open(first, "fail")
        backend.open(second)
        await backend.returned[second.rollout_id].wait()
        await until(
            lambda: (
                done in controller.replay.group_ids()
                and controller.in_flight == 2
                and controller.state.counters.retries == 1
            ),
            "the finished group published and the failure abandoned",
        )
        loop.advance(GRACE_S - 1.0)
        for _ in range(1000):
            await asyncio.sleep(0)
        assert controller.drain_report is None  # inside the grace: still waiting
        assert controller.in_flight == 2
        loop.advance(1.0)

    harness = drained_run(script, drain_config())
    report = harness.controller.drain_report
    assert report is not None
    assert (report.in_flight, report.cut_short, report.abandoned) == (6, 2, 2)
    assert report.waited_s == GRACE_S
    assert len(harness.backend.started) == 6
    abandons = [r for r in harness.records_after if isinstance(r, AttemptsAbandoned)]
    reasons = {a.group_id: [x.reason.value for x in a.attempts] for a in abandons}
    assert reasons == {state["failing"]: ["attempt_failed"], state["running"]: ["drain", "drain"]}
    assert harness.controller.state.counters.retries == 1  # a drain's abandon is no retry
    assert not [r for r in harness.records_after if isinstance(r, RoundStarted)]
    published = [r.group_id for r in harness.records_after if isinstance(r, GroupPublished)]
    assert published == [state["done"]]

    restored = resume_to_the_end(harness)
    assert (restored.seals_lost, restored.tokens_lost, restored.tokens_in_flight_lost) == (0, 0, 0)
    assert restored.sealed_siblings_kept == 1  # the failing group's sibling that ran
    records = [entry.record for entry in read_entries(harness.run.events)]
    restart = [r for r in records if isinstance(r, AttemptsAbandoned) and r not in abandons]
    assert restart == [], "the drain left nothing in flight for the restart to abandon"
    # The rerun's rounds: the failed attempt's group spent its first round (round 2), the
    # drained group's round was given back (a drain is not the prompt's failure), so its
    # two siblings go out in round 1 again.
    after = records[records.index(harness.records_after[-1]) + 1 :]
    mine = {state["failing"], state["running"]}
    rounds = [r for r in after if isinstance(r, RoundStarted) and r.group_id in mine]
    assert {r.group_id: (r.round, len(r.dispatched)) for r in rounds} == {
        state["failing"]: (2, 1),
        state["running"]: (1, 2),
    }


def test_attempts_queued_behind_the_inflight_limit_never_start(
    drained_run: Callable[..., Drained],
) -> None:
    async def script(harness: Drained, loop: VirtualClockLoop) -> None:
        backend, controller = harness.backend, harness.controller
        await backend.wait_started(4)  # two of the six wait for a slot
        ask(harness)
        for request in list(backend.started):
            backend.open(request)
        await until(
            lambda: (
                controller.in_flight == 0 and all(e.is_set() for e in backend.returned.values())
            ),
            "the four attempts done and none started after them",
        )

    harness = drained_run(script, drain_config(max_inflight_attempts=4))
    assert len(harness.backend.started) == 4
    report = harness.controller.drain_report
    assert report is not None
    assert (report.in_flight, report.cut_short, report.abandoned) == (4, 0, 2)
    drained = [
        attempt
        for r in harness.records_after
        if isinstance(r, AttemptsAbandoned)
        for attempt in r.attempts
    ]
    assert [a.reason.value for a in drained] == ["drain", "drain"]
    resume_to_the_end(harness)


def test_a_drain_asked_before_the_run_starts_nothing(
    drained_run: Callable[..., Drained],
) -> None:
    """Asked during the restore (before ``run``): no backend start, no dispatch."""

    async def script(harness: Drained, loop: VirtualClockLoop) -> None:
        return None

    harness = drained_run(script, drain_config(), ask_first=True)
    report = harness.controller.drain_report
    assert report is not None and report.reason == "asked by the test"
    assert (report.in_flight, report.abandoned, report.step) == (0, 0, 0)
    assert harness.backend.started == []
    resume_to_the_end(harness)
