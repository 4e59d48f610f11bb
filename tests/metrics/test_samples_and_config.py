"""Sample completions and the job's config in each sink (issue 27 item 4), read back with
each tool's own reader: a TensorBoard text summary, a W&B table and config, an MLflow
artifact and parameters."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.errors import InvalidArgumentError, InvalidArgumentTypeError
from rollout_recovery.metrics import MetricsConfig
from rollout_recovery.metrics._fanout import MetricsFanout
from rollout_recovery.metrics._open import open_metrics
from rollout_recovery.metrics._params import flat_params
from rollout_recovery.metrics._protocol import MarkerField, Scalar
from rollout_recovery.metrics._samples import samples_markdown

SAMPLES = [
    {
        "group_id": "g0000004",
        "generation_index": 0,
        "prompt_idx": 7,
        "prompt": "What is 2+3?",
        "completion": "5 | done\nyes",
        "reward": 1.0,
        "components": {"correct": 1.0, "format": 0.0},
    },
    {
        "group_id": "g0000005",
        "generation_index": 0,
        "prompt_idx": 2,
        "prompt": "1+1=",
        "completion": "",
        "reward": None,
        "reason": "capture_poisoned:data_error:reward_raised",
    },
]
JOB = {"job": {"steps": 30, "seed": 3}, "metrics": {"sinks": ["jsonl", "mlflow"]}, "x": {"y": None}}


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def log_step(self, step: int, values: Mapping[str, Scalar]) -> None:
        self.calls.append(("step", step))

    def log_marker(self, step: int, kind: str, fields: Mapping[str, MarkerField]) -> None:
        self.calls.append(("marker", step, kind))

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        self.calls.append(("samples", step, [s["prompt"] for s in samples]))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_records_samples_reach_each_sink_before_its_values() -> None:
    sink = Recorder()
    metrics = MetricsFanout([("r", sink)], resume_step=3)
    metrics.log_record(3, {"step": 3, "mean_reward": 0.5, "samples": SAMPLES})
    metrics.log_record(4, {"step": 4, "mean_reward": 0.5, "samples": []})
    assert sink.calls == [
        ("samples", 3, ["What is 2+3?", "1+1="]),
        ("step", 3),
        ("step", 4),
    ]


@pytest.mark.parametrize(
    ("step", "samples", "error"),
    [
        (2, SAMPLES, InvalidArgumentError),  # before the resume step
        (3, SAMPLES, InvalidArgumentError),  # its values were logged already
        (4, "text", InvalidArgumentTypeError),
        (4, [1], InvalidArgumentTypeError),
        (4, [{"prompt": object()}], InvalidArgumentTypeError),
    ],
)
def test_bad_samples_are_refused_and_reach_no_sink(step: int, samples: Any, error: type) -> None:
    sink = Recorder()
    metrics = MetricsFanout([("r", sink)], resume_step=3)
    metrics.log_step(3, {})
    with pytest.raises(error):
        metrics.log_samples(step, samples)
    assert sink.calls == [("step", 3)]


def test_the_job_config_is_flat_section_keys() -> None:
    assert flat_params(JOB) == {
        "job.steps": 30,
        "job.seed": 3,
        "metrics.sinks": '["jsonl", "mlflow"]',
        "x.y": None,
    }


def test_the_markdown_keeps_one_line_per_sample() -> None:
    text = samples_markdown(3, SAMPLES)
    lines = text.splitlines()
    assert lines[0] == "samples of step 3" and len(lines) == 4 + len(SAMPLES)
    assert "5 \\| done\\nyes" in lines[4]
    assert '{"correct": 1.0, "format": 0.0}' in lines[4]
    assert "reward_raised" in lines[5]


def test_tensorboard_shows_the_samples_as_text(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metrics = open_metrics(MetricsConfig(sinks=("tensorboard",)), tmp_path, resume_step=0)
    for step in range(3):
        metrics.log_record(step, {"loss": 1.0, "samples": SAMPLES if step != 1 else []})
    metrics.close()
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    accumulator.Reload()
    texts = accumulator.Tensors("samples")
    assert [event.step for event in texts] == [0, 2]
    assert texts[1].tensor_proto.string_val[0].decode() == samples_markdown(2, SAMPLES)


@pytest.mark.slow
def test_wandb_gets_a_samples_table_and_the_config(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    from rollout_recovery.metrics._wandb_files import offline_run_files, read_records

    metrics = open_metrics(MetricsConfig(sinks=("wandb",)), tmp_path, resume_step=0, job_config=JOB)
    metrics.log_record(0, {"loss": 1.0, "samples": SAMPLES})
    metrics.log_record(1, {"loss": 2.0})
    metrics.close()
    assert not metrics.failures
    state = json.loads((tmp_path / "wandb" / "rollout-recovery-sink.json").read_bytes())
    (log,) = offline_run_files(tmp_path, state["run_id"])
    records = read_records(log)
    rows = {
        int(r["history"]["item"]["_step"]): r["history"]["item"]
        for r in records
        if r["type"] == "history"
    }
    assert rows[0]["samples._type"] == "table-file" and rows[0]["samples.nrows"] == 2
    assert not any(key.startswith("samples") for key in rows[1])
    saved = json.loads((log.parent / "files" / rows[0]["samples.path"]).read_text())
    assert saved["columns"] == ["row", "reward", "prompt", "completion", "components", "reason"]
    assert saved["data"][0][:4] == ["g0000004/0", 1.0, "What is 2+3?", "5 | done\nyes"]
    config: dict[str, Any] = {}
    for record in records:
        if record["type"] == "config":
            config.update(record["config"]["update"])
    assert config["job.steps"] == 30 and config["metrics.sinks"] == '["jsonl", "mlflow"]'


def test_mlflow_gets_a_samples_artifact_and_the_config_as_parameters(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    config = MetricsConfig(sinks=("mlflow",))
    metrics = open_metrics(config, tmp_path, resume_step=0, job_config=JOB)
    metrics.log_record(0, {"loss": 1.0, "samples": SAMPLES})
    metrics.close()
    # A resume that raised the step count: a parameter cannot change, a tag says so.
    resumed = open_metrics(
        config, tmp_path, resume_step=1, job_config={**JOB, "job": {"steps": 40, "seed": 3}}
    )
    resumed.log_record(1, {"loss": 2.0, "samples": SAMPLES[:1]})
    resumed.close()
    assert not metrics.failures and not resumed.failures
    state = json.loads((tmp_path / "mlflow" / "rollout-recovery-sink.json").read_bytes())
    client = MlflowClient(tracking_uri=(tmp_path / "mlflow").resolve().as_uri())
    run = client.get_run(state["run_id"])
    assert run.data.params["job.steps"] == "30" and run.data.params["job.seed"] == "3"
    assert run.data.tags["rollout_recovery.config.job.steps"] == "40"
    artifacts = sorted(a.path for a in client.list_artifacts(state["run_id"], "samples"))
    assert artifacts == ["samples/step_000000.json", "samples/step_000001.json"]
    local = client.download_artifacts(state["run_id"], "samples/step_000000.json", str(tmp_path))
    saved = json.loads(Path(local).read_text())
    assert saved["step"] == 0 and saved["samples"] == SAMPLES
    assert saved["data"][1][0] == "g0000005/0"
