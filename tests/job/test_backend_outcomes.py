"""A backend's failures are values; what it raises stops the run (issue 16, item 5).

The job runs the default simulated backend (no injected faults) behind a wrapper that
replaces the outcome of chosen attempts:

- a returned ``AttemptFailure`` is abandoned with its reason and the sibling retried; the
  run finishes and its audit passes;
- a raised ``GenerationError`` is a backend that broke the protocol: the run stops with
  it (before item 5 the controller caught it and retried);
- a returned failure that is not retryable (a closed backend) stops the run instead of
  spending the group's rounds and dropping its prompt, and the round it cost goes back to
  the group's budget; a rerun resumes and loses nothing, even with one round a group
  (before, the prompt was dropped with ``retry_budget_exhausted``);
- a ``TimeoutError`` the backend raises itself is no missed deadline: it stops the run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import read_jsonl

from rollout_recovery.capture import CaptureWriter, StagedPrefix
from rollout_recovery.control import RunConfig
from rollout_recovery.dataplane import DataPlane
from rollout_recovery.errors import GenerationError
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job
from rollout_recovery.job._components import JobComponents, default_components
from rollout_recovery.rollout import (
    AttemptFailure,
    AttemptRequest,
    AttemptResult,
    FailureReason,
    GenerationBackend,
)

MakeConfig = Callable[..., RunConfig]
# What the wrapper does with attempt number n (0-based, in dispatch order): None runs it.
Script = Callable[[int, AttemptRequest], AttemptFailure | BaseException | None]


class _Scripted:
    """The default backend, with the outcome of the attempts ``script`` picks replaced."""

    def __init__(self, inner: GenerationBackend[Any], script: Script) -> None:
        self._inner = inner
        self._script = script
        self.attempts = 0

    def update_weights(self, version: int, weights: Any) -> None:
        self._inner.update_weights(version, weights)

    async def run_attempt(
        self, request: AttemptRequest, capture: CaptureWriter, prefix: StagedPrefix | None = None
    ) -> AttemptResult | AttemptFailure:
        n, self.attempts = self.attempts, self.attempts + 1
        scripted = self._script(n, request)
        if isinstance(scripted, BaseException):
            raise scripted
        if scripted is not None:
            return scripted
        return await self._inner.run_attempt(request, capture, prefix)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _failure(request: AttemptRequest, reason: FailureReason) -> AttemptFailure:
    return AttemptFailure(
        rollout_id=request.rollout_id,
        generation_index=request.generation_index,
        reason=reason,
        detail="scripted by the test",
        worker="scripted-0",
    )


def _components(script: Script) -> Callable[[RunConfig, DataPlane], JobComponents[Any]]:
    def build(config: RunConfig, data_plane: DataPlane) -> JobComponents[Any]:
        parts = default_components(config, data_plane)
        return JobComponents(
            dataset=parts.dataset,
            backend=_Scripted(parts.backend, script),
            trainer=parts.trainer,
        )

    return build


def _config(fault_config: Callable[..., RunConfig], max_rounds: int = 8) -> RunConfig:
    return fault_config(
        {},
        {
            "job": {"steps": 4},
            "checkpoint": {"every_steps": 1},
            "retry": {"max_rounds": max_rounds},
        },
    )


def _abandoned(out: Path) -> list[dict[str, Any]]:
    return [
        attempt
        for event in read_jsonl(out / "events.jsonl")
        if event["event"] == "attempts_abandoned"
        for attempt in event["attempts"]
    ]


def _dropped(out: Path) -> list[dict[str, Any]]:
    return [e for e in read_jsonl(out / "events.jsonl") if e["event"] == "prompt_dropped"]


def test_returned_failures_are_retried_and_the_run_finishes(
    tmp_path: Path, fault_config: Callable[..., RunConfig]
) -> None:
    reasons = [FailureReason.WORKER_CRASHED, FailureReason.NO_LIVE_ACTOR]

    def script(n: int, request: AttemptRequest) -> AttemptFailure | None:
        return _failure(request, reasons[n % 2]) if n < 6 else None

    out = tmp_path / "run"
    result = run_job(out, _config(fault_config), components=_components(script))

    assert result.summary.steps == 4
    abandoned = _abandoned(out)
    assert sorted(a["reason"] for a in abandoned) == ["no_live_actor"] * 3 + ["worker_crashed"] * 3
    assert _dropped(out) == []
    assert audit_run(out).ok


def test_a_raised_generation_error_stops_the_run(
    tmp_path: Path, fault_config: Callable[..., RunConfig]
) -> None:
    def script(n: int, request: AttemptRequest) -> BaseException | None:
        return (
            GenerationError(FailureReason.WORKER_CRASHED, "raised by the test") if n == 2 else None
        )

    with pytest.raises(GenerationError, match="raised by the test"):
        run_job(tmp_path / "run", _config(fault_config), components=_components(script))


def test_a_timeout_the_backend_raises_is_no_missed_deadline(
    tmp_path: Path, fault_config: Callable[..., RunConfig]
) -> None:
    def script(n: int, request: AttemptRequest) -> BaseException | None:
        return TimeoutError("the backend's own wait") if n == 2 else None

    out = tmp_path / "run"
    with pytest.raises(TimeoutError, match="the backend's own wait"):
        run_job(out, _config(fault_config), components=_components(script))
    assert "deadline_exceeded" not in (out / "events.jsonl").read_text()


@pytest.mark.parametrize("max_rounds", [1, 4])
def test_a_closed_backend_stops_the_run_and_the_rerun_loses_no_prompt(
    tmp_path: Path, fault_config: Callable[..., RunConfig], max_rounds: int
) -> None:
    config = _config(fault_config, max_rounds)
    closed_at = 40  # past the first checkpoint: the rerun resumes from it

    def script(n: int, request: AttemptRequest) -> AttemptFailure | None:
        return _failure(request, FailureReason.BACKEND_CLOSED) if n >= closed_at else None

    out = tmp_path / "run"
    with pytest.raises(GenerationError, match="backend_closed") as stopped:
        run_job(out, config, components=_components(script))
    assert "closed under a running job" in str(stopped.value)
    assert stopped.value.rerun_resumes
    # Recorded as what it was, and no prompt given up for it.
    assert {a["reason"] for a in _abandoned(out)} == {"backend_closed"}
    assert _dropped(out) == []

    # The same job, its backend healthy again: with one round a group, a round the closed
    # backend had spent would drop the prompt at once.
    result = run_job(out, config)
    assert result.summary.steps == 4
    assert _dropped(out) == []
    report = audit_run(out)
    assert report.ok, report.violations
