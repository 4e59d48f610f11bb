"""``rollout-recovery audit`` of a run that is still going never fails a correct run.

The job checkpoints at every step, keeping only two, so checkpoints are published,
``LATEST`` moves and old checkpoints are pruned (their rows deleted) all the time. After
every trained step the test starts an audit of the live directory in a thread, which
overlaps whatever the job does next (the next step, a checkpoint's write, a prune). Every
one must pass, and the finished run must pass complete.

The job's next step report waits for the audit before it, so the job is never more than a
step ahead of the audits: the overlap is the test's construction, not the scheduler's
(a job in another process, audited on each line it printed, could finish before a slow
auditor on a loaded machine had read half its lines).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.control import RunConfig
from rollout_recovery.history import audit_run
from rollout_recovery.history._auditor import AuditReport
from rollout_recovery.job import run_job

STEPS = 40


class AuditAfterEachStep:
    """A run's progress display that audits the run directory after every trained step,
    in a thread, while the job goes on; the next step's report first waits for it."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.audits: list[tuple[int, AuditReport]] = []
        self._running: threading.Thread | None = None

    def start(self, total_steps: int, resumed_from: int | None) -> None:
        pass

    def log(self, message: str) -> None:
        pass

    def update(self, *, step: int, **_: Any) -> None:
        self.wait()
        self._running = threading.Thread(target=self._audit, args=(step,))
        self._running.start()

    def wait(self) -> None:
        if self._running is not None:
            self._running.join()
            self._running = None

    def _audit(self, step: int) -> None:
        self.audits.append((step, audit_run(self.out)))


@pytest.mark.slow
def test_auditing_a_live_run_that_checkpoints_and_prunes_always_passes(
    tmp_path: Path, fast_config: Callable[..., RunConfig]
) -> None:
    config = fast_config(
        {
            "job": {"steps": STEPS, "prompts_per_step": 3, "generations_per_prompt": 3},
            # A checkpoint (and a prune of the oldest) at every step.
            "checkpoint": {"every_steps": 1, "keep": 2},
        }
    )
    out = tmp_path / "live"
    auditor = AuditAfterEachStep(out)
    try:
        result = run_job(out, config, progress=auditor)
    finally:
        auditor.wait()

    assert result.summary.steps == STEPS
    failed = [(step, report.violations) for step, report in auditor.audits if not report.ok]
    assert failed == [], failed[:3]
    # The audits really overlapped the run: one after every step, each in progress but the
    # last two (the job, one step ahead at most, may end under them), at many steps.
    assert [step for step, _ in auditor.audits] == list(range(1, STEPS + 1))
    in_progress = [report for _, report in auditor.audits if not report.complete]
    assert len(in_progress) >= STEPS - 2
    assert len({report.audited_through_step for report in in_progress}) >= STEPS // 4
    final = audit_run(out)
    assert final.ok and final.complete, final.violations
    assert final.audited_through_step == STEPS
