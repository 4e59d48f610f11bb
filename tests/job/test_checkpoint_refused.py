"""A checkpoint the restore cannot use is skipped for the previous one, or the run is
reported unresumable, never a traceback nor the advice to rerun what fails again (issue
24, items 18 and 19).

Its verification now loads the trainer's state (a refused load changes nothing) and
checks the trainer's weight version against the controller state's, so an edited trainer
state (its manifest updated, so it loads) skips the checkpoint for the previous one. A
refusal from the restore itself, after verification, is a ``RunNotResumableError``
naming the checkpoint and how to resume from the previous one.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from run_fixtures import rewrite_checkpoint_file

from rollout_recovery.control import RunConfig, _checkpointing
from rollout_recovery.errors import RunNotResumableError, StagingInventoryError
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job


def edit_policy(checkpoint: Path, **arrays: Any) -> None:
    with np.load(checkpoint / "policy.npz", allow_pickle=False) as npz:
        state = {name: npz[name] for name in npz.files}
    state.update(arrays)
    buffer = io.BytesIO()
    np.savez(buffer, **state)
    rewrite_checkpoint_file(checkpoint, "policy.npz", buffer.getvalue())


def _checkpoints(out: Path) -> list[Path]:
    return sorted((out / "checkpoints").glob("step_*"))


def _more_steps(config: RunConfig, steps: int) -> RunConfig:
    return msgspec.structs.replace(config, job=msgspec.structs.replace(config.job, steps=steps))


def _version(checkpoint: Path) -> int:
    with np.load(checkpoint / "policy.npz", allow_pickle=False) as npz:
        return int(npz["version"])


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        # A count past int64: loaded, it failed only when the next checkpoint wrote it.
        ({"adam_step": np.array(2**64 - 1, dtype=np.uint64)}, "'adam_step' must be in"),
        # A version the controller state does not name: refused at restore, with "rerun".
        ("version+1", "but the trainer's state is at"),
    ],
    ids=["count-past-int64", "version-mismatch"],
)
def test_an_edited_trainer_state_is_skipped_for_the_previous_checkpoint(
    finished_run: tuple[Path, RunConfig], edit: Any, named: str
) -> None:
    out, config = finished_run
    *_, previous, newest = _checkpoints(out)
    arrays = {"version": np.array(_version(newest) + 1)} if edit == "version+1" else edit
    edit_policy(newest, **arrays)

    result = run_job(out, _more_steps(config, 12))

    assert [skip.name for skip in result.skipped] == [newest.name]
    assert named in result.skipped[0].reason
    assert result.restored is not None and result.restored.checkpoint == previous.name
    assert result.summary.steps == 12
    report = audit_run(out)
    assert report.ok and report.complete, report.violations


def test_a_restore_refused_after_verification_is_unresumable_naming_the_checkpoint(
    finished_run: tuple[Path, RunConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever verification misses and the restore still refuses (here a staging row
    the inventory finds missing) would be refused again by every rerun: the run stops as
    unresumable, saying how to resume from the previous checkpoint."""
    out, config = finished_run
    newest = _checkpoints(out)[-1]

    def missing_row(*args: object, **kwargs: object) -> list[str]:
        raise StagingInventoryError(["g0000001_g0_a0/call-0"])

    monkeypatch.setattr(_checkpointing, "reconcile_staging", missing_row)
    with pytest.raises(RunNotResumableError) as caught:
        run_job(out, _more_steps(config, 12))
    error = caught.value
    assert f"checkpoint {newest.name} passed its verification but its restore was refused" in str(
        error
    )
    assert "StagingInventoryError" in str(error)
    assert f"Move {newest}" in error.remedy and "previous checkpoint" in error.remedy
    assert error.rerun_resumes is False
