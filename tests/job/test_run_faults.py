"""Each injected fault of the simulated environment, end to end through ``run_job``.

Every test turns on one fault (the others off), runs the small fast job in process and
asserts on what the audit trail records: the abandon reason, the placeholder rows, the
dropped prompts, or the error that stops the run. Each fails if the behaviour it is about
is removed (the fault not injected, not detected, not retried, not bounded).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery._clock import monotonic, virtual_time
from rollout_recovery.capture import CaptureWriter, StagedPrefix
from rollout_recovery.control import RunConfig
from rollout_recovery.dataplane import DataPlane
from rollout_recovery.errors import LivenessError, StepShortfallError
from rollout_recovery.history._trail_check import check_trail
from rollout_recovery.job import JobComponents, run_job
from rollout_recovery.job._components import default_components
from rollout_recovery.job._run_job import JobResult
from rollout_recovery.rollout import (
    AttemptFailure,
    AttemptRequest,
    AttemptResult,
    SimulatedAgentBackend,
)

FaultConfig = Callable[..., RunConfig]
ReadJsonl = Callable[[Path], list[dict[str, Any]]]
Cli = Callable[..., subprocess.CompletedProcess[str]]


class TimedBackend:
    """The default simulated backend, timing every attempt (however it ends)."""

    def __init__(self, inner: SimulatedAgentBackend) -> None:
        self.inner = inner
        self.durations: list[float] = []
        self.succeeded: list[float] = []

    def update_weights(self, version: int, weights: object) -> None:
        self.inner.update_weights(version, weights)

    async def run_attempt(
        self, request: AttemptRequest, capture: CaptureWriter, prefix: StagedPrefix | None = None
    ) -> AttemptResult | AttemptFailure:
        # The loop's clock: the wall's, or virtual under ``virtual_time()``.
        started = monotonic()
        try:
            result = await self.inner.run_attempt(request, capture, prefix)
        finally:
            self.durations.append(monotonic() - started)
        self.succeeded.append(monotonic() - started)
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Trail:
    out: Path
    config: RunConfig
    result: JobResult
    backend: TimedBackend
    events: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def abandons(self, reason: str) -> list[dict[str, Any]]:
        """One dict per attempt abandoned for ``reason`` (with its record's group)."""
        return [
            {"group_id": e["group_id"], "whole_group": e["whole_group"], **attempt}
            for e in self.of("attempts_abandoned")
            for attempt in e["attempts"]
            if attempt["reason"] == reason
        ]

    def abandon_reasons(self) -> set[str]:
        """Why attempts were abandoned (a failed cohort's other siblings say ``cohort``)."""
        return {
            attempt["reason"]
            for event in self.of("attempts_abandoned")
            for attempt in event["attempts"]
        } - {"cohort"}

    def abandoned_rollout_ids(self) -> set[str]:
        return {
            attempt["rollout_id"]
            for event in self.of("attempts_abandoned")
            for attempt in event["attempts"]
        }

    def trained_groups(self) -> Counter[str]:
        return Counter(row["group_id"] for row in self.rows)

    def assert_consistent(self, *, complete: bool = True) -> None:
        report = check_trail(
            self.out, group_size=self.config.job.generations_per_prompt, complete=complete
        )
        assert report.ok, "\n".join(report.violations[:20])
        # A retry is a fresh attempt: nothing abandoned is ever trained.
        assert not self.abandoned_rollout_ids() & {row["rollout_id"] for row in self.rows}

    def assert_finished(self) -> None:
        job = self.config.job
        summary = self.result.summary
        assert summary.steps == job.steps
        assert [m["step"] for m in self.metrics] == list(range(job.steps))
        assert summary.prompts_taken == job.steps * job.prompts_per_step
        assert summary.prompts_trained + summary.prompts_dropped == summary.prompts_taken
        assert summary.prompts_trained == len(self.trained_groups())
        self.assert_consistent()


@pytest.fixture
def run_trail(
    tmp_path: Path, read_jsonl: ReadJsonl, trained_rows: ReadJsonl
) -> Callable[[RunConfig], Trail]:
    """Run ``config`` in process in a new directory; return its trail and timed backend
    (``wrap`` makes it: ``TimedBackend`` or a subclass)."""
    runs = iter(range(1000))

    def run(
        config: RunConfig, wrap: Callable[[SimulatedAgentBackend], TimedBackend] = TimedBackend
    ) -> Trail:
        out = tmp_path / f"run-{next(runs)}"
        backends: list[TimedBackend] = []

        def components(config: RunConfig, data_plane: DataPlane) -> JobComponents:
            parts = default_components(config, data_plane)
            assert isinstance(parts.backend, SimulatedAgentBackend)
            backends.append(wrap(parts.backend))
            return JobComponents(parts.dataset, backends[-1], parts.trainer)

        result = run_job(out, config, components=components)
        return Trail(
            out,
            config,
            result,
            backends[0],
            read_jsonl(out / "events.jsonl"),
            trained_rows(out),
            read_jsonl(out / "metrics.jsonl"),
        )

    return run


# ------------------------------------------------------------------ failed attempts


def test_failed_attempts_are_abandoned_and_retried(
    fault_config: FaultConfig, run_trail: Callable[[RunConfig], Trail]
) -> None:
    trail = run_trail(fault_config({"attempt_failure_rate": 0.3}))

    failed = trail.abandons("attempt_failed")
    assert failed, "no attempt_abandoned event with reason attempt_failed"
    assert trail.abandon_reasons() == {"attempt_failed"}
    assert trail.backend.inner.fault_counts["attempt_failed"] > 0
    summary = trail.result.summary
    assert summary.retries > 0
    assert summary.attempts > summary.prompts_taken * trail.config.job.generations_per_prompt
    trail.assert_finished()


# ------------------------------------------------------------------ slow start-up


class SlowStartBackend(TimedBackend):
    """A backend that comes up slowly, like a Ray actor pool: ``start()`` takes a while,
    and an attempt that finds it not started starts it (and waits) itself."""

    def __init__(self, inner: SimulatedAgentBackend) -> None:
        super().__init__(inner)
        self.up = False
        self.dispatched_before_up = 0
        self._starting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._starting is None:
            self._starting = asyncio.create_task(self._come_up())
        await self._starting

    async def _come_up(self) -> None:
        await asyncio.sleep(0.3)  # a slow start, not a synchronization
        self.up = True

    async def run_attempt(
        self, request: AttemptRequest, capture: CaptureWriter, prefix: StagedPrefix | None = None
    ) -> AttemptResult | AttemptFailure:
        if not self.up:
            self.dispatched_before_up += 1
            await self.start()
        return await super().run_attempt(request, capture, prefix)


def test_a_slow_backend_start_runs_before_any_attempt_and_its_deadline(
    fault_config: FaultConfig, run_trail: Callable[..., Trail]
) -> None:
    config = fault_config({})
    trail = run_trail(config, SlowStartBackend)
    assert trail.result.summary.steps == config.job.steps
    # The controller awaited start() first: no attempt's deadline paid for the start-up.
    backend = trail.backend
    assert isinstance(backend, SlowStartBackend)
    assert backend.up and backend.dispatched_before_up == 0


# -------------------------------------------------------------------- hung attempts


def test_hung_attempts_are_abandoned_at_their_deadline(
    fault_config: FaultConfig, run_trail: Callable[[RunConfig], Trail]
) -> None:
    deadline = 0.5
    config = fault_config({"hang_rate": 0.2}, {"generation": {"attempt_deadline_s": deadline}})
    with virtual_time():  # the deadlines run out on the loop's clock, not the machine's
        trail = run_trail(config)

    assert trail.abandons("deadline_exceeded")
    assert trail.abandon_reasons() == {"deadline_exceeded"}
    assert trail.backend.inner.fault_counts["hang"] > 0
    # Every attempt, hung or not, ended by its deadline, and the hung ones exactly at it
    # (a hung attempt nobody cancels would never end at all).
    assert max(trail.backend.durations) == pytest.approx(deadline, abs=1e-6)
    trail.assert_finished()


# ---------------------------------------------------------------------- stragglers


def test_stragglers_are_slow_but_every_row_is_trained(
    fault_config: FaultConfig, run_trail: Callable[[RunConfig], Trail]
) -> None:
    latency, factor = 0.002, 10.0
    config = fault_config(
        {"straggler_rate": 1.0, "straggler_factor": factor},
        {
            "job": {"steps": 4},
            "generation": {
                "call_latency_s": latency,
                "latency_jitter": 0.0,
                "attempt_deadline_s": 5.0,
            },
        },
    )
    trail = run_trail(config)

    backend = trail.backend
    assert backend.inner.fault_counts["straggler"] == len(backend.durations) > 0
    # Two calls per episode, each `factor` times slower (no jitter).
    assert min(backend.succeeded) >= 0.9 * 2 * latency * factor
    assert not trail.of("attempts_abandoned") and not trail.of("prompt_dropped")
    job = config.job
    assert len(trail.rows) == job.steps * job.prompts_per_step * job.generations_per_prompt
    assert all(row["valid"] for row in trail.rows)
    trail.assert_finished()


# ------------------------------------------- capture failures and tampered rows


@pytest.mark.parametrize(
    ("rate", "fault"),
    [("capture_failure_rate", "capture_failure"), ("tamper_rate", "tamper")],
    ids=["capture-failure", "tamper"],
)
def test_bad_captures_become_masked_placeholders(
    fault_config: FaultConfig, run_trail: Callable[[RunConfig], Trail], rate: str, fault: str
) -> None:
    trail = run_trail(fault_config({rate: 0.3}))

    invalid = [row for row in trail.rows if not row["valid"]]
    injected = trail.backend.inner.fault_counts[fault]
    assert injected > 0
    # Nothing else failed, so each injected fault is exactly one placeholder row, trained
    # in its group (not retried, not dropped).
    assert len(invalid) == injected
    assert not trail.of("attempts_abandoned") and not trail.of("prompt_dropped")
    group_size = trail.config.job.generations_per_prompt
    assert set(trail.trained_groups().values()) == {group_size}
    assert sum(m["rows"] - m["valid_rows"] for m in trail.metrics) == injected
    trail.assert_finished()


# --------------------------------------------------------------------- worker crash


def test_a_crashed_worker_abandons_its_attempts(
    fault_config: FaultConfig, run_trail: Callable[[RunConfig], Trail]
) -> None:
    trail = run_trail(fault_config({"worker_crash_rate": 0.05, "worker_restart_s": 0.05}))

    crashes = trail.backend.inner.worker_crashes
    assert crashes > 0
    crashed = trail.abandons("worker_crashed")
    assert crashed
    assert trail.abandon_reasons() == {"worker_crashed"}
    trail.assert_finished()


# ------------------------------------------------------------ retry budget exhausted


def test_an_exhausted_retry_budget_drops_the_prompt_and_the_step_closes_short(
    fault_config: FaultConfig, run_trail: Callable[[RunConfig], Trail]
) -> None:
    config = fault_config(
        {"attempt_failure_rate": 0.3},
        {
            "job": {"steps": 8, "prompts_per_step": 8, "min_step_fraction": 0.125},
            "retry": {"max_rounds": 2},
        },
    )
    trail = run_trail(config)

    dropped = trail.of("prompt_dropped")
    assert dropped
    assert all(e["reason"] == "retry_budget_exhausted" for e in dropped)
    trained = trail.trained_groups()
    assert not {e["group_id"] for e in dropped} & set(trained)
    assert trail.result.summary.prompts_dropped == len(dropped)
    # Each step trained what was not dropped from it, and did not wait for the rest.
    drops_per_step = Counter(e["target_step"] for e in dropped)
    for metrics in trail.metrics:
        step = metrics["step"]
        assert metrics["groups"] + drops_per_step[step] == config.job.prompts_per_step
    assert any(m["groups"] < config.job.prompts_per_step for m in trail.metrics)
    trail.assert_finished()


def test_too_many_drops_stop_the_run_with_a_step_shortfall(
    tmp_path: Path, fault_config: FaultConfig, read_jsonl: ReadJsonl
) -> None:
    config = fault_config(
        {"attempt_failure_rate": 0.95},
        {"job": {"steps": 3, "min_step_fraction": 0.5}, "retry": {"max_rounds": 1}},
    )
    out = tmp_path / "run"
    # The error itself, not an exception group: callers branch on its class.
    with pytest.raises(StepShortfallError) as caught:
        run_job(out, config)

    error = caught.value
    # The third drop of a step would leave it 1 group: refused before it is recorded.
    assert error.required == 2 and error.available == 1
    assert f"step {error.step} can train at most 1 groups" in str(error)
    assert "job.min_step_fraction <= 0.25" in str(error)
    events = read_jsonl(out / "events.jsonl")
    dropped = [e for e in events if e["event"] == "prompt_dropped"]
    assert len([e for e in dropped if e["target_step"] == error.step]) == 2
    assert all(e["reason"] == "retry_budget_exhausted" for e in dropped)
    assert read_jsonl(out / "metrics.jsonl") == []
    report = check_trail(out, group_size=config.job.generations_per_prompt, complete=False)
    assert report.ok, report.violations
    # No checkpoint holds a step that cannot train; the setting the error names (it is
    # operational) lets a rerun of the same run continue past it.
    lowered = fault_config(
        {"attempt_failure_rate": 0.0},
        {"job": {"steps": 3, "min_step_fraction": 0.25}, "retry": {"max_rounds": 4}},
    )
    result = run_job(out, lowered)
    assert result.restored is not None and result.summary.steps == 3
    assert result.config_changes and "min_step_fraction" in " ".join(result.config_changes)


# ------------------------------------------------------------------------- liveness

LIVENESS = (
    {"hang_rate": 1.0},
    {"generation": {"attempt_deadline_s": 60.0}, "liveness": {"step_timeout_s": 0.5}},
)


def test_a_step_that_cannot_fill_fails_naming_what_it_waited_for(
    tmp_path: Path, fault_config: FaultConfig
) -> None:
    config = fault_config(*LIVENESS)
    with virtual_time() as loops, pytest.raises(LivenessError) as caught:
        run_job(tmp_path / "run", config)
    (loop,) = loops
    elapsed = loop.time()  # virtual seconds: the wall's only while threads worked

    error = caught.value
    assert error.waited_for == "the 4 groups of step 0"
    assert error.seconds == 0.5
    assert "gave up waiting for the 4 groups of step 0 after 0.5 s" in str(error)
    # Bounded by the step timeout, not by the (60 s) attempt deadline.
    assert 0.5 <= elapsed < 60.0


@pytest.mark.parametrize(
    ("faults", "overrides", "message"),
    [
        (*LIVENESS, r"error: the run stopped: LivenessError: gave up waiting for the 4 groups"),
        (
            {"attempt_failure_rate": 1.0},
            {"retry": {"max_rounds": 1}},
            # Every step's prompts fail at once: whichever step loses a third prompt first
            # (0, or 1 or 2 admitted beside it) stops the run.
            r"error: the run stopped: StepShortfallError: step [0-2] can train at most 1 groups",
        ),
    ],
    ids=["liveness", "shortfall"],
)
def test_the_cli_reports_a_stopped_run_without_a_traceback(
    tmp_path: Path,
    write_config: Callable[..., Path],
    run_cli: Cli,
    faults: dict[str, Any],
    overrides: dict[str, Any],
    message: str,
) -> None:
    path = write_config({"faults": faults, **overrides}, faults_off=True)
    result = run_cli(["--out", str(tmp_path / "run"), "--config", str(path), "--plain"])

    assert "Traceback" not in result.stdout, result.stdout
    assert re.search(message, result.stdout), result.stdout
    # A timeout may pass on a rerun; the shortfall would stop the rerun the same way, so it
    # says what to change instead.
    resumes = "rerun the same command to resume" in result.stdout
    assert resumes is ("liveness" in message.lower() or "Liveness" in message)
    assert result.returncode == 1
