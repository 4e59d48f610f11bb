"""``[metrics]``: which sinks a job writes to, and their few settings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Final, Literal

from msgspec import Meta

from .._settings import Section
from ..errors import ConfigError
from ._extras import EXTRAS, require
from ._fanout import MetricsFanout
from ._open import open_metrics
from ._protocol import MetricsSink

__all__ = ["SINK_NAMES", "MetricsConfig", "SinkName"]

SinkName = Literal["jsonl", "tensorboard", "wandb", "mlflow"]
SINK_NAMES: Final[tuple[SinkName, ...]] = ("jsonl", "tensorboard", "wandb", "mlflow")

# W&B refuses these characters in a project name; MLflow takes any experiment name, but one
# bound for both keeps a config portable between them.
_Name = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[^/\\#?%:]+$")]
_OptionalName = Annotated[str, Meta(max_length=128, pattern=r"^[^/\\#?%:]*$")]


class MetricsConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[metrics]``: the sinks every step's metrics and the run's markers go to.

    ``jsonl`` is ``DIR/metrics.jsonl``, which every run writes (naming it or not);
    ``tensorboard`` event files in ``DIR/tensorboard``
    (the ``[tensorboard]`` extra); ``wandb`` an offline Weights & Biases run in
    ``DIR/wandb`` (``[wandb]``); ``mlflow`` a run in the MLflow file store ``DIR/mlflow``
    (``[mlflow]``). Each sink is named at most once.
    """

    sinks: tuple[SinkName, ...] = ("jsonl",)
    wandb_project: _Name = "rollout-recovery"
    #: "" names the W&B run, and the MLflow run, after the run directory.
    run_name: _OptionalName = ""
    mlflow_experiment: _Name = "rollout-recovery"
    #: Steps a slow sink (W&B, MLflow) may fall behind the training loop before a log call
    #: waits for it.
    queue_size: Annotated[int, Meta(ge=1, le=100_000)] = 1024
    #: How long a log call waits for room in a slow sink's queue, and a flush for the sink
    #: to catch up; past it that sink is given up for the rest of the session.
    flush_timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 60.0
    #: Sample completions of the LLM job shown per step (prompt, completion, reward): on
    #: the console, in metrics.jsonl and in each sink (a W&B table, TensorBoard text, an
    #: MLflow artifact). 0 shows none.
    samples: Annotated[int, Meta(ge=0, le=64)] = 2

    def __post_init__(self) -> None:
        # msgspec turns this (a ValueError) into a ValidationError with the section's path.
        repeated = sorted({name for name in self.sinks if self.sinks.count(name) > 1})
        if repeated:
            raise ConfigError(f"`sinks` names {', '.join(map(repr, repeated))} more than once")

    def check_installed(self) -> None:
        """Refuse, with the extra to install, a configured sink whose tool is missing (a
        job calls this before it writes anything)."""
        for sink_name in self.sinks:
            if sink_name in EXTRAS:
                require(sink_name)

    def open(
        self,
        run_dir: Path,
        *,
        resume_step: int,
        job_config: Mapping[str, object] | None = None,
        also: Sequence[tuple[str, MetricsSink]] = (),
    ) -> MetricsFanout:
        """Open every configured sink for ``run_dir``, training (re)starting at
        ``resume_step``, with ``job_config`` as the tools' run config, and the sinks
        ``also`` names beside them (the console's samples; see ``_open.open_metrics``)."""
        return open_metrics(
            self, run_dir, resume_step=resume_step, job_config=job_config, also=also
        )
