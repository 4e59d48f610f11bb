"""The job writes each step's metrics and its markers to the configured sinks, across a
SIGKILL and a restore, with no step shown twice (TensorBoard's loader reads them back)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.mark.slow
def test_tensorboard_gets_every_step_once_across_a_kill(
    tmp_path: Path, write_config: Callable[..., Path], run_cli_until: Cli, run_cli: Cli
) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = write_config(
        {
            "job": {"steps": 8},
            "checkpoint": {"every_steps": 3},
            "metrics": {"sinks": ["jsonl", "tensorboard"]},
        }
    )
    out = tmp_path / "run"
    args = ["--out", str(out), "--config", str(config), "--plain"]
    killed = run_cli_until(args, stop=lambda line, lines: line.startswith("step 4 ("))
    assert killed.returncode == -9, killed.stdout
    finished = run_cli(args)
    assert finished.returncode == 0, finished.stdout

    accumulator = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    rewards = accumulator.Scalars("mean_reward")
    assert [event.step for event in rewards] == list(range(8))
    tags = accumulator.Tags()["scalars"]
    assert "markers/restored/count" in tags and "markers/checkpoint_committed/count" in tags


def test_a_sink_whose_tool_is_missing_is_refused_before_anything_is_written(
    tmp_path: Path, write_config: Callable[..., Path], run_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A module named like the tool that cannot be imported stands for a missing install.
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "mlflow.py").write_text("raise ImportError('not installed here')\n")
    config = write_config({"metrics": {"sinks": ["mlflow"]}})
    out = tmp_path / "run"
    result = run_cli(
        ["--out", str(out), "--config", str(config), "--plain"],
        env={"PYTHONPATH": f"{shadow}:{Path.cwd() / 'src'}"},
    )
    assert result.returncode != 0
    assert "pip install 'rollout-recovery[mlflow]'" in result.stdout
    assert not out.exists()
