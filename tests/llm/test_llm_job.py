"""The torch trainer and the transformers backend through the real controller: it learns,
and a SIGKILL mid-run costs nothing (rerun, audit passes, trainer state restored exactly)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from llm_job import job_config, llm_components

from rollout_recovery.history import Restored, audit_run, read_records
from rollout_recovery.job import run_job
from rollout_recovery.llm import TorchGRPOTrainer

JOB_SCRIPT = Path(__file__).with_name("llm_job.py")
CHILD_TIMEOUT_S = 300.0


def test_the_job_learns_to_emit_the_target(tmp_path: Path, tiny_model_dir: Path) -> None:
    """30 steps of 8 prompts x 4 samples: mean reward from about 0 in the first tenth of
    the steps to 1.0 in the last (measured: 0.0 -> 0.14 at step 9 -> 0.98 at step 18)."""
    started = time.process_time()
    config = job_config(tmp_path)
    result = run_job(tmp_path / "run", config, components=llm_components(tiny_model_dir))
    cpu = time.process_time() - started
    summary = result.summary
    assert summary.steps == 30 and summary.prompts_trained == 240
    first, last = summary.first_tenth_reward, summary.last_tenth_reward
    assert first is not None and last is not None
    assert first < 0.1 and last > 0.6, (first, last)
    assert cpu < 60.0, cpu
    metrics = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in metrics] == list(range(30))
    assert all(m["train/skipped"] == 0.0 for m in metrics)
    assert audit_run(tmp_path / "run").ok


def _run_child(args: list[str], *, kill_when: str | None = None) -> tuple[int, list[str]]:
    """The job script in its own process group; SIGKILL the group at the first line that
    contains ``kill_when`` (never after a sleep). A watchdog bounds its lifetime."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, str(JOB_SCRIPT), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    watchdog = threading.Timer(CHILD_TIMEOUT_S, lambda: os.killpg(child.pid, signal.SIGKILL))
    watchdog.start()
    lines: list[str] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.rstrip("\n"))
            if kill_when is not None and kill_when(line):  # type: ignore[operator]
                os.killpg(child.pid, signal.SIGKILL)
                break
        return child.wait(), lines
    finally:
        watchdog.cancel()
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_then_rerun_restores_the_trainer_exactly(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """And costs nothing: on policy (staleness 0) the job is deterministic (the backend
    seeds draws per sibling), so the killed and resumed run ends with the very weights and
    per-step rewards of an uninterrupted one."""
    out = tmp_path / "killed" / "run"
    out.parent.mkdir()
    args = [str(out), str(tiny_model_dir)]

    def second_checkpoint_committed(line: str) -> bool:
        # The bootstrap checkpoint is number 1; a step line saying 2 comes after the first
        # checkpoint of a trained step was committed.
        parts = line.split()
        return len(parts) == 6 and parts[0] == "step" and int(parts[5]) >= 2

    code, lines = _run_child(args, kill_when=second_checkpoint_committed)
    assert code == -signal.SIGKILL, lines
    latest = (out / "checkpoints" / "LATEST").read_text().strip()
    saved = _npz((out / "checkpoints" / latest / "policy.npz").read_bytes())
    assert int(saved["version"]) > 0

    dump, final = tmp_path / "restored.npz", tmp_path / "final.npz"
    code, lines = _run_child([*args, "--dump-restored", str(dump), "--dump-final", str(final)])
    assert code == 0, lines
    assert any(line.startswith(f"resumed from {latest}") for line in lines), lines
    restored = _npz(dump.read_bytes())
    assert sorted(restored) == sorted(saved)
    for name, value in saved.items():
        assert restored[name].dtype == value.dtype and np.array_equal(restored[name], value), name

    report = audit_run(out)
    assert report.ok, report.violations[:10]
    assert report.complete
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(30))

    clean_dir = tmp_path / "clean"
    clean_dir.mkdir()
    trainers: list[TorchGRPOTrainer] = []
    run_job(
        clean_dir / "run",
        job_config(clean_dir),
        components=llm_components(tiny_model_dir, trainers=trainers),
    )
    clean = [
        json.loads(line) for line in (clean_dir / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["mean_reward"] for m in metrics] == [m["mean_reward"] for m in clean]
    expected = trainers[-1].state()
    resumed_final = _npz(final.read_bytes())
    assert sorted(resumed_final) == sorted(expected)
    # The one difference: steps trained after the checkpoint and before the kill were
    # rolled back and trained again under new version numbers (a version names one set
    # of weights, so none is reused), so the resumed run ends that many versions ahead.
    rolled_back = sum(
        len(record.rolled_back_steps)
        for _, record in read_records(out / "events.jsonl")
        if isinstance(record, Restored)
    )
    assert int(resumed_final["version"]) == int(expected["version"]) + rolled_back
    for name, value in expected.items():
        if name == "trainer_json":
            meta, clean_meta = (json.loads(bytes(v).decode()) for v in (resumed_final[name], value))
            assert meta.pop("version") == clean_meta.pop("version") + rolled_back
            assert meta == clean_meta
        elif name != "version":
            assert np.array_equal(resumed_final[name], value), name
