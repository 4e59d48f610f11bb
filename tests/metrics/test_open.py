"""open_metrics and [metrics]: the extras stay optional, a broken tool never stops a run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from rollout_recovery.errors import ConfigError
from rollout_recovery.metrics import MetricsConfig
from rollout_recovery.metrics._open import open_metrics


@pytest.mark.parametrize(
    ("sink", "module", "extra"),
    [
        ("wandb", "wandb", "wandb"),
        ("mlflow", "mlflow", "mlflow"),
        ("tensorboard", "tensorboard", "tensorboard"),
    ],
)
def test_a_sink_without_its_extra_is_a_config_error_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sink: str, module: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # "import module" raises ImportError
    config = msgspec.convert({"sinks": ["jsonl", sink]}, MetricsConfig)
    with pytest.raises(ConfigError) as raised:
        open_metrics(config, tmp_path, resume_step=0)
    assert raised.value.path == "$.metrics.sinks"
    assert f"pip install 'rollout-recovery[{extra}]'" in str(raised.value)
    assert list(tmp_path.iterdir()) == []


def test_importing_the_package_imports_no_tool() -> None:
    code = (
        "import sys, rollout_recovery, rollout_recovery.metrics; "
        "from rollout_recovery.metrics import MetricsConfig; "
        "from rollout_recovery.metrics._open import open_metrics; "
        "loaded = [m for m in ('wandb', 'mlflow', 'tensorboard', 'tensorboardX') "
        "if m in sys.modules]; assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"sinks": ["jsonl", "jsonl"]}, "`sinks` names 'jsonl' more than once"),
        ({"sinks": ["prometheus"]}, "Invalid enum value 'prometheus'"),
        ({"queue_size": 0}, "Expected `int` >= 1"),
        ({"flush_timeout_s": float("inf")}, "Expected `float` <= 3600.0"),
        ({"wandb_project": "a/b"}, "Expected `str` matching regex"),
        ({"wand_project": "x"}, "unknown field `wand_project`"),
    ],
)
def test_the_config_refuses_bad_values(data: dict[str, object], message: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=message):
        msgspec.convert(data, MetricsConfig)


def test_a_tool_sink_that_cannot_open_is_left_out_and_the_rest_runs(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    (tmp_path / "mlflow").mkdir()
    (tmp_path / "mlflow" / "rollout-recovery-sink.json").write_text("not json")
    config = MetricsConfig(sinks=("jsonl", "mlflow"))
    metrics = open_metrics(config, tmp_path, resume_step=0)
    # jsonl is the run trail's own metrics.jsonl: nothing of the fanout's.
    assert metrics.names == ()
    assert "not a metrics sink state file" in metrics.failures["mlflow"]
    metrics.log_step(0, {"loss": 1.0})  # the run goes on without the failed sink
    metrics.close()
    # The unreadable state is kept, not replaced: replacing it would start a second run.
    assert (tmp_path / "mlflow" / "rollout-recovery-sink.json").read_text() == "not json"
