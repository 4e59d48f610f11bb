"""``rollout-recovery chaos`` on the LLM job: the tiny example, shortened, killed at a
random moment and at crash points inside a checkpoint (the trainer's safetensors written,
not yet committed), a restore and a staged model call; every kill verified, the run
finishes, the audit passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_llm_job import TINY_EXAMPLE, TRAINER_FILES, example_config

from rollout_recovery.chaos._chaos import PlannedKill, run_chaos
from rollout_recovery.rundir import CheckpointStore

#: Each kill comes within the two steps a child runs after its restore, so the 8-step job
#: is still running when it comes.
SCHEDULE = [
    PlannedKill(None, 5),  # after "step 2 (3/8 done)": the bootstrap checkpoint is committed
    PlannedKill("checkpoint.before_committed", 1),
    PlannedKill("restore.mid", 1),
    PlannedKill("capture.before_ack", 20),
]


@pytest.mark.slow
def test_chaos_kills_the_llm_job_and_the_audit_passes(tmp_path: Path, model_cache: Path) -> None:
    config = example_config(
        TINY_EXAMPLE, tmp_path, model_cache, {"job": {"steps": 8}, "checkpoint": {"every_steps": 2}}
    )
    out = tmp_path / "chaos"
    lines: list[str] = []
    report = run_chaos(
        kills=len(SCHEDULE),
        seed=0,
        out=out,
        config_path=config,
        log=lines.append,
        schedule=SCHEDULE,
        child_timeout_s=600.0,
    )
    detail = "\n".join(lines + report.failures)
    assert report.ok, detail
    assert report.kills == len(SCHEDULE), detail
    # Every child after the first restored, but the one killed in the middle of it.
    assert report.restores == len(SCHEDULE) - 1, detail
    assert report.audit is not None and report.audit.ok
    newest = CheckpointStore(out, keep=1).committed()[0]
    assert newest.step == 8
    assert set(TRAINER_FILES) <= {path.name for path in newest.directory.iterdir()}
