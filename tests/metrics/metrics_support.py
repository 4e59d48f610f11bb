"""The restart every sink test replays, as the controller would drive it (``restart``).

Session 1 opens at step 0, logs steps 0-9 (``loss`` = step) with a checkpoint marker at
step 5 and a flush there, and "crashes" after step 9: it is never closed. What it logged
has reached the tool (the harder case: superseded points exist). Session 2 reopens at
resume step 6 with a ``restored`` marker and logs steps 6-12 (``loss`` = 100 + step),
then closes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rollout_recovery.metrics import MetricsConfig
from rollout_recovery.metrics._fanout import MetricsFanout
from rollout_recovery.metrics._open import open_metrics

RESUME = 6
RESTORED = {"checkpoint": "step_000006", "tokens_lost": 402, "seals_lost": 3}


def first_session(config: MetricsConfig, run_dir: Path) -> MetricsFanout:
    metrics = open_metrics(config, run_dir, resume_step=0)
    for step in range(10):
        metrics.log_step(step, {"loss": float(step), "rows": 16, "skipped": None})
        if step == 5:
            metrics.log_marker(step, "checkpoint_committed", {"step": step})
            metrics.flush()
    metrics.flush()  # the tool has everything: steps 6-9 are there to be superseded
    return metrics


def second_session(config: MetricsConfig, run_dir: Path) -> None:
    metrics = open_metrics(config, run_dir, resume_step=RESUME)
    assert not metrics.failures, metrics.failures
    metrics.log_marker(RESUME, "restored", RESTORED)
    for step in range(RESUME, 13):
        metrics.log_step(step, {"loss": 100.0 + step, "rows": 16, "skipped": None})
    metrics.close()
    assert not metrics.failures, metrics.failures


def restart(config: MetricsConfig, run_dir: Path, crash: Callable[[MetricsFanout], None]) -> None:
    """Both sessions; ``crash`` ends the first one."""
    first = first_session(config, run_dir)
    assert not first.failures, first.failures
    crash(first)
    second_session(config, run_dir)
