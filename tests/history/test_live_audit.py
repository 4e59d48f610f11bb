"""``rollout-recovery audit`` of a run that is still going never fails a correct run.

The job runs in a child process (``run_cli_until``) and checkpoints at every step, keeping
only two, so checkpoints are published, ``LATEST`` moves and old checkpoints are pruned
(their rows deleted) all the time. On every line the job prints, the test audits the live
directory. Each audit overlaps whatever the job is doing at that moment; every one must
pass, and the finished run must pass complete.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.history import audit_run
from rollout_recovery.history._auditor import AuditReport

STEPS = 40


@pytest.mark.slow
def test_auditing_a_live_run_that_checkpoints_and_prunes_always_passes(
    tmp_path: Path,
    write_config: Callable[..., Path],
    run_cli_until: Callable[..., Any],
) -> None:
    config = write_config(
        {
            "job": {"steps": STEPS, "prompts_per_step": 3, "generations_per_prompt": 3},
            # A checkpoint (and a prune of the oldest) at every step.
            "checkpoint": {"every_steps": 1, "keep": 2},
        }
    )
    out = tmp_path / "live"
    audits: list[AuditReport] = []
    failed: list[tuple[str, list[str]]] = []

    def audit_on_each_line(line: str, lines: list[str]) -> bool:
        if (out / "job.toml").is_file():
            report = audit_run(out)
            audits.append(report)
            if not report.ok:
                failed.append((line.strip(), report.violations))
        return False  # never stop the job: it runs to its end

    args = ["--out", str(out), "--plain", "--config", str(config)]
    result = run_cli_until(args, stop=audit_on_each_line)

    assert result.returncode == 0, result.stdout
    assert failed == [], failed[:3]
    # The audits really overlapped the run: most saw it in progress, at many steps.
    in_progress = [report for report in audits if not report.complete]
    assert len(in_progress) >= STEPS // 2
    assert len({report.audited_through_step for report in in_progress}) >= STEPS // 4
    final = audit_run(out)
    assert final.ok and final.complete, final.violations
    assert final.audited_through_step == STEPS
