"""Each sink read back with its tool's own reader, across a restart (``metrics_support.py``).

Every step 0-12 is there exactly once. JSONL and TensorBoard show the re-trained values of
steps 6-9 (the file is cut back; TensorBoard's loader purges them); W&B and MLflow keep the
rolled-back attempt's values for 6-9 and continue at 10 (neither can take a step back
without showing it twice).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from metrics_support import RESTORED, RESUME, restart

from rollout_recovery.metrics import MetricsConfig
from rollout_recovery.metrics._fanout import MetricsFanout
from rollout_recovery.metrics._open import open_metrics

RETRAINED = {step: (100.0 + step if step >= RESUME else float(step)) for step in range(13)}
FIRST_WINS = {step: (100.0 + step if step >= 10 else float(step)) for step in range(13)}


def _abandon(metrics: MetricsFanout) -> None:
    """A crash: nothing is closed (the sinks' files stay as they are)."""


def test_tensorboard_purges_the_superseded_steps(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    restart(MetricsConfig(sinks=("tensorboard",)), tmp_path, _abandon)
    files = sorted((tmp_path / "tensorboard").iterdir())
    assert len(files) == 2  # one per session

    # The superseded points are in the first file; only the loader's purge hides them.
    raw_steps = _raw_loss_steps(files[0])
    assert raw_steps == list(range(10))

    accumulator = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    loss = accumulator.Scalars("loss")
    assert [event.step for event in loss] == list(range(13))
    assert {event.step: event.value for event in loss} == RETRAINED
    assert "skipped" not in accumulator.Tags()["scalars"]
    tokens = accumulator.Scalars("markers/restored/tokens_lost")
    assert [(e.step, e.value) for e in tokens] == [(RESUME, 402.0)]
    assert [e.step for e in accumulator.Scalars("markers/checkpoint_committed/count")] == [5]
    texts = accumulator.Tensors("markers/restored/text")
    assert [e.step for e in texts] == [RESUME]
    assert texts[0].tensor_proto.string_val[0].decode().startswith("restored at step 6: ")


def _raw_loss_steps(path: Path) -> list[int]:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps = []
    for event in EventFileLoader(str(path)).Load():
        if any(value.tag == "loss" for value in event.summary.value):
            steps.append(event.step)
    return steps


def _finish_wandb_run(metrics: MetricsFanout) -> None:
    """A crash after W&B wrote what it was given: the tool's run ends, the sink never closes."""
    background: Any = metrics.sink("wandb")
    background.sink._run.finish()


@pytest.mark.slow
def test_wandb_offline_never_logs_a_step_twice(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    from rollout_recovery.metrics._wandb_files import offline_run_files, read_records

    restart(MetricsConfig(sinks=("wandb",)), tmp_path, _finish_wandb_run)
    state = json.loads((tmp_path / "wandb" / "rollout-recovery-sink.json").read_bytes())
    sessions = offline_run_files(tmp_path, state["run_id"])
    assert len(sessions) == 2  # one W&B run id, one offline directory per session
    rows: dict[int, dict[str, Any]] = {}
    alerts = []
    for log in sessions:
        for record in read_records(log):
            if record["type"] == "history":
                item = record["history"]["item"]
                step = int(item["_step"])
                assert step not in rows, f"step {step} logged twice"
                rows[step] = item
            elif record["type"] == "alert":
                alerts.append(record["alert"])
            elif record["type"] == "run":
                assert record["run"]["run_id"] == state["run_id"]
    assert sorted(rows) == list(range(13))
    assert {step: row["loss"] for step, row in rows.items()} == FIRST_WINS
    assert all("skipped" not in row for row in rows.values())
    # Markers ride on the next row logged: the checkpoint at 5 on step 6's, the restore
    # (at 6, whose row W&B already holds) on step 10's.
    assert rows[6]["markers/checkpoint_committed/count"] == 1
    assert rows[6]["markers/checkpoint_committed/step"] == 5
    assert rows[10]["markers/restored/count"] == 1
    assert rows[10]["markers/restored/step"] == RESUME
    assert rows[10]["markers/restored/tokens_lost"] == RESTORED["tokens_lost"]
    assert [alert["title"] for alert in alerts] == ["rollout-recovery restored at step 6"]


def test_mlflow_file_store_keeps_one_point_per_step(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    restart(MetricsConfig(sinks=("mlflow",)), tmp_path, _abandon)
    state = json.loads((tmp_path / "mlflow" / "rollout-recovery-sink.json").read_bytes())
    client = MlflowClient(tracking_uri=(tmp_path / "mlflow").resolve().as_uri())
    run = client.get_run(state["run_id"])
    assert run.info.status == "FINISHED"
    loss = client.get_metric_history(state["run_id"], "loss")
    assert sorted(point.step for point in loss) == list(range(13))
    assert {point.step: point.value for point in loss} == FIRST_WINS
    assert "skipped" not in run.data.metrics
    tokens = client.get_metric_history(state["run_id"], "markers/restored/tokens_lost")
    assert [(p.step, p.value) for p in tokens] == [(RESUME, 402.0)]
    checkpoints = client.get_metric_history(state["run_id"], "markers/checkpoint_committed/count")
    assert [p.step for p in checkpoints] == [5]
    assert run.data.tags["rollout_recovery.restarts"] == "1"
    assert run.data.tags["rollout_recovery.restart.1"].startswith("restored at step 6: ")
    assert len(client.search_runs([run.info.experiment_id])) == 1


_KILLED_SESSION = """
import sys
from pathlib import Path
from rollout_recovery.metrics import MetricsConfig
from rollout_recovery.metrics._open import open_metrics
metrics = open_metrics(MetricsConfig(sinks=("wandb",)), Path(sys.argv[1]), resume_step=0)
for step in range(10):
    metrics.log_step(step, {"loss": float(step)})
metrics.flush()
print("logged", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_wandb_after_a_real_sigkill_logs_what_wandb_lost_once(tmp_path: Path) -> None:
    """A SIGKILL of the job's process group loses what wandb had not yet written (its
    .wandb file is written every 0.25 s at best): the next session learns from the file
    what W&B really holds, so a step is never twice and nothing it lost past the resume
    step is missing."""
    pytest.importorskip("wandb")
    import os
    import signal
    import subprocess
    import sys

    from rollout_recovery.metrics._wandb_files import history_steps, offline_run_files

    # Its own wandb-core, as a job has: not this process's, which an earlier test started
    # and advertises in WANDB_SERVICE (it would outlive the kill and keep the run in use).
    env = {name: value for name, value in os.environ.items() if name != "WANDB_SERVICE"}
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SESSION, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"logged\n"
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    [killed] = offline_run_files(tmp_path, _wandb_run_id(tmp_path))
    held = history_steps(killed)
    assert held == list(range(len(held)))  # a prefix of 0-9, maybe empty

    metrics = open_metrics(MetricsConfig(sinks=("wandb",)), tmp_path, resume_step=RESUME)
    for step in range(RESUME, 13):
        metrics.log_step(step, {"loss": 100.0 + step})
    metrics.close()
    assert not metrics.failures, metrics.failures
    first, second = offline_run_files(tmp_path, _wandb_run_id(tmp_path))
    assert first == killed
    assert history_steps(second) == list(range(max(RESUME, len(held)), 13))


def _wandb_run_id(run_dir: Path) -> str:
    state = json.loads((run_dir / "wandb" / "rollout-recovery-sink.json").read_bytes())
    return str(state["run_id"])
