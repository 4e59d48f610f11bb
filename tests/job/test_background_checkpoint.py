"""Checkpoints the step does not wait for (issue 28, item 3): ``[checkpoint] background``.

The train pump pays only the capture (the hold's position, the trainer's state copied to
memory); the write, the publication and the ``checkpoint_committed`` record come while
the next steps train. The tests hold a checkpoint's save in its worker thread until the
generation backend has been handed the weights of two later steps (each step's records are
journaled before its weights are handed over), so the order is the test's, not the
machine's: no sleeps, no wall-clock slack.

- the steps after a checkpoint train while it is written, its ``checkpoint_committed``
  lands after their records, and the history audits clean; a rerun restored from it (the
  newer one failed) replays that interleaving and finishes;
- a failed background write fails the run with its own error, never swallowed;
- a SIGKILL at ``checkpoint.captured`` (the new crash point: captured, nothing written,
  the run training on) resumes from the previous checkpoint and audits clean.
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rollout_recovery.control import RunConfig
from rollout_recovery.dataplane import DataPlane
from rollout_recovery.history import audit_run
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.history.records import CheckpointCommitted, Restored, StepTrained
from rollout_recovery.job import run_job
from rollout_recovery.job._components import JobComponents, default_components
from rollout_recovery.policy import NumpyGRPOTrainer
from rollout_recovery.rundir import CheckpointStore

#: Four steps, a checkpoint every two: step_000000 (the bootstrap anchor, in the
#: foreground), step_000002 (taken after step 1, in the background), step_000004 (the
#: final one, in the background).
JOB: dict[str, dict[str, Any]] = {
    "job": {"steps": 4},
    "checkpoint": {"every_steps": 2, "keep": 3},
}
#: Bounds a test that fails (a save held for steps that never come), never a pass.
STUCK_S = 60.0


class Held:
    """Holds the save of checkpoint ``step`` until the backend has been handed ``pushes``
    weight versions in all (a fresh run hands one over after each step, none before)."""

    def __init__(self, step: int, *, pushes: int) -> None:
        self.step = step
        self.pushes = pushes
        self.versions: list[int] = []
        self.released = threading.Event()
        self.lock = threading.Lock()

    def pushed(self, version: int) -> None:
        with self.lock:
            self.versions.append(version)
            if len(self.versions) >= self.pushes:
                self.released.set()

    def wait(self) -> None:
        if not self.released.wait(STUCK_S):
            raise AssertionError(
                f"the steps after checkpoint step {self.step} never trained while it was "
                "written: the train pump waited for the write"
            )


@pytest.fixture
def holding(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """``holding(step, pushes=4, fail={step: error})``: a components function for
    ``run_job`` whose backend reports each weight hand-over, with ``CheckpointStore.save``
    held (see :class:`Held`) for ``step`` and raising for the steps of ``fail``."""
    real_save = CheckpointStore.save

    def install(
        step: int | None, *, pushes: int = 0, fail: dict[int, Exception] | None = None
    ) -> tuple[Held, Callable[[RunConfig, DataPlane], JobComponents[Any]]]:
        held = Held(-1 if step is None else step, pushes=pushes)

        def save(self: CheckpointStore, at: int, files: Any, **kwargs: Any) -> Any:
            if fail and at in fail:
                raise fail[at]
            if at == held.step:
                held.wait()
            return real_save(self, at, files, **kwargs)

        monkeypatch.setattr(CheckpointStore, "save", save)

        def components(config: RunConfig, plane: DataPlane) -> JobComponents[Any]:
            parts = default_components(config, plane)
            backend = parts.backend
            update = backend.update_weights

            def update_weights(version: int, weights: Any) -> None:
                update(version, weights)
                held.pushed(version)

            backend.update_weights = update_weights  # type: ignore[method-assign]
            return parts

        return held, components

    yield install


def _records(out: Path) -> list[Any]:
    return [entry.record for entry in read_entries(out / "events.jsonl")]


def _steps_before_commit(records: list[Any], step: int) -> list[int]:
    """The steps from ``step`` on trained before checkpoint ``step``'s record."""
    index = next(
        i for i, r in enumerate(records) if isinstance(r, CheckpointCommitted) and r.step == step
    )
    return [r.step for r in records[:index] if isinstance(r, StepTrained) and r.step >= step]


def test_the_next_steps_train_while_a_checkpoint_is_written(
    tmp_path: Path,
    fast_config: Callable[..., RunConfig],
    holding: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = fast_config(JOB)
    assert config.checkpoint.background  # the default
    out = tmp_path / "run"
    # step_000002's save waits until steps 2 and 3 have trained and handed their weights
    # over (the 3rd and 4th hand-overs); step_000004's save fails (the run fails with
    # it), so a rerun restores step_000002, whose record came after those steps.
    held, components = holding(2, pushes=4, fail={4: OSError(28, "the disk is full")})
    with pytest.raises(OSError, match="the disk is full"):
        run_job(out, config, components=components)
    assert len(held.versions) == 4  # one hand-over per step
    records = _records(out)
    assert _steps_before_commit(records, 2) == [2, 3], "the steps waited for the write"
    assert not any(isinstance(r, CheckpointCommitted) and r.step == 4 for r in records)
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == [
        "step_000000",
        "step_000002",
    ]
    report = audit_run(out)
    assert not report.violations, report.violations

    # The rerun (its saves as they are) restores step_000002 and replays the journal
    # after it: steps 2 and 3, then step_000002's own record, then the failed end.
    monkeypatch.undo()
    rerun = run_job(out, config)
    restored = rerun.restored
    assert restored is not None and restored.checkpoint == "step_000002"
    assert restored.rolled_back_steps == [2, 3]
    assert [t.step for t in rerun.checkpoints] == [4]
    report = audit_run(out)
    assert report.complete and not report.violations, report.violations
    assert sum(isinstance(r, Restored) for r in _records(out)) == 1


def test_a_failed_background_write_fails_the_run(
    tmp_path: Path, fast_config: Callable[..., RunConfig], holding: Callable[..., Any]
) -> None:
    config = fast_config({**JOB, "job": {"steps": 6}})
    out = tmp_path / "run"
    _, components = holding(None, fail={2: PermissionError(13, "checkpoints are read-only")})
    with pytest.raises(PermissionError, match="checkpoints are read-only"):
        run_job(out, config, components=components)
    # Never past the next checkpoint: it awaits the failed one first, if the failure did
    # not stop the run before.
    records = _records(out)
    assert [r.step for r in records if isinstance(r, CheckpointCommitted)] == [0]
    assert max(r.step for r in records if isinstance(r, StepTrained)) < 4


def test_in_the_foreground_the_step_waits_for_the_write(
    tmp_path: Path, fast_config: Callable[..., RunConfig], holding: Callable[..., Any]
) -> None:
    """``background = false`` is the old behaviour: the record comes before the next step."""
    config = fast_config({**JOB, "checkpoint": {**JOB["checkpoint"], "background": False}})
    out = tmp_path / "run"
    _, components = holding(None)
    run_job(out, config, components=components)
    assert _steps_before_commit(_records(out), 2) == []


Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.mark.slow
def test_a_kill_while_a_checkpoint_is_written_resumes_from_the_previous_one(
    tmp_path: Path, write_config: Callable[..., Path], run_cli: Cli
) -> None:
    job = {"job": {"steps": 8}, "checkpoint": {"every_steps": 2, "keep": 3}}
    out = tmp_path / "run"
    args = ["--out", str(out), "--config", str(write_config(job)), "--plain"]
    # Hit 1 is the bootstrap anchor, hit 2 step_000002, hit 3 step_000004: captured, its
    # write in the background, and the process killed before anything of it is written.
    killed = run_cli(args, env={"ROLLOUT_RECOVERY_CRASH_AT": "checkpoint.captured:3"})
    assert killed.returncode == -9, killed.stdout
    assert "crash point checkpoint.captured fired" in killed.stdout
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == [
        "step_000000",
        "step_000002",
    ]
    final = run_cli(args)
    assert final.returncode == 0, final.stdout
    assert "resumed from step_000002" in final.stdout
    audited = subprocess.run(
        [sys.executable, "-m", "rollout_recovery", "audit", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert audited.returncode == 0, audited.stdout + audited.stderr
    report = audit_run(out)
    assert report.complete and not report.violations, report.violations


class OneCopyTrainer(NumpyGRPOTrainer):
    """The numpy trainer with its state as files, copied the torch trainer's way: into
    reused staging buffers (``llm/_staging.py``) that hold one copy at a time. Its encoding
    waits until the controller has gone on to settle the write (the next checkpoint, the
    run's end), so every later capture is asked for while a write is unfinished."""

    settles = 0
    settled = threading.Condition()
    held_versions = range(1, 4)
    #: Per capture: the files ``state_files()`` gave at it.
    expected: list[dict[str, bytes]] = []  # noqa: RUF012 - shared on purpose

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from rollout_recovery.llm._staging import StagingBuffers

        super().__init__(*args, **kwargs)
        self.buffers = StagingBuffers()

    def state_files(self) -> dict[str, bytes]:
        return _npz_files(self.state())

    def load_state_files(self, files: Mapping[str, bytes]) -> None:
        with np.load(io.BytesIO(files["state.npz"]), allow_pickle=False) as npz:
            self.load_state({name: npz[name] for name in npz.files})

    def staged_state_files(self) -> Callable[[], dict[str, bytes]]:
        import torch

        # Not held: the bootstrap anchor (written in the foreground) and the last step's
        # checkpoint (the run ends by awaiting its write).
        held = self.weight_version in OneCopyTrainer.held_versions
        OneCopyTrainer.expected.append(self.state_files())
        state = self.state()
        staged = self.buffers.stage({k: torch.from_numpy(v.copy()) for k, v in state.items()})
        with OneCopyTrainer.settled:
            captured_at = OneCopyTrainer.settles

        def encode() -> dict[str, bytes]:
            with OneCopyTrainer.settled:
                if held and not OneCopyTrainer.settled.wait_for(
                    lambda: OneCopyTrainer.settles > captured_at, STUCK_S
                ):
                    raise AssertionError("the controller never came back for the write")
            return staged.read(lambda copy: _npz_files({k: t.numpy() for k, t in copy.items()}))

        return encode


def _npz_files(state: Mapping[str, Any]) -> dict[str, bytes]:
    buffer = io.BytesIO()
    np.savez(buffer, **state)
    return {"state.npz": buffer.getvalue()}


def test_the_next_capture_waits_for_the_previous_write_to_read_its_copy(
    tmp_path: Path, fast_config: Callable[..., RunConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer that reuses one set of staging buffers (the torch trainer) refuses a
    capture while the previous copy is unread: the controller awaits the previous write
    before it captures, so a run checkpointing at every step in the background, each
    write still reading its copy when the next capture is asked for, finishes, and every
    checkpoint holds the trainer's state at its own capture."""
    pytest.importorskip("torch")
    import rollout_recovery.control._backends as backends
    from rollout_recovery.control._controller import Controller

    real_settle = Controller.settle_checkpoint

    async def settle(self: Any) -> Any:
        with OneCopyTrainer.settled:
            OneCopyTrainer.settles += 1
            OneCopyTrainer.settled.notify_all()
        return await real_settle(self)

    OneCopyTrainer.expected = []
    monkeypatch.setattr(Controller, "settle_checkpoint", settle)
    monkeypatch.setattr(backends, "NumpyGRPOTrainer", OneCopyTrainer)
    config = fast_config({"job": {"steps": 4}, "checkpoint": {"every_steps": 1, "keep": 5}})
    assert config.checkpoint.background  # the default
    out = tmp_path / "run"
    result = run_job(out, config)
    assert [t.step for t in result.checkpoints] == [0, 1, 2, 3, 4]
    store = CheckpointStore(out, keep=5)
    saved = [
        {name: data for name, data in store.load(c).files.items() if name.startswith("trainer.")}
        for c in reversed(store.committed())  # newest first
    ]
    expected = OneCopyTrainer.expected
    assert saved == [{f"trainer.{name}": data for name, data in e.items()} for e in expected]
    report = audit_run(out)
    assert report.complete and not report.violations, report.violations
