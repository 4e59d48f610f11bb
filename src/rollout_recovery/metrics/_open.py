"""``open_metrics``: the ``[metrics]`` config made into the sinks a session writes to."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ._background import BackgroundSink
from ._fanout import MetricsFanout
from ._keys import check_step
from ._mlflow import MlflowSink
from ._params import flat_params
from ._protocol import MetricsSink
from ._tensorboard import TensorBoardSink
from ._wandb import WandbSink

if TYPE_CHECKING:  # [metrics] opens its sinks here: its types, for the type checker
    from ._config import MetricsConfig, SinkName

__all__ = ["open_metrics"]

_log = logging.getLogger("rollout_recovery.metrics")

_Params = Mapping[str, object] | None
_Opener = Callable[[Path, int, "MetricsConfig", str, _Params], MetricsSink]

# "jsonl" is DIR/metrics.jsonl, which the run's trail always writes (one line per step,
# cut back with the rest of a checkpoint's files on a restore): nothing to open here.
_OPENERS: dict[SinkName, _Opener] = {
    "tensorboard": lambda run_dir, resume, config, name, params: TensorBoardSink(
        run_dir, resume_step=resume, max_queue=config.queue_size
    ),
    "wandb": lambda run_dir, resume, config, name, params: WandbSink(
        run_dir,
        resume_step=resume,
        project=config.wandb_project,
        run_name=name,
        job_config=params,
    ),
    "mlflow": lambda run_dir, resume, config, name, params: MlflowSink(
        run_dir,
        resume_step=resume,
        experiment=config.mlflow_experiment,
        run_name=name,
        job_config=params,
    ),
}
# A few ms a step: their calls run on a worker thread, off the train loop.
_SLOW: frozenset[SinkName] = frozenset({"wandb", "mlflow"})


def open_metrics(
    config: MetricsConfig,
    run_dir: Path,
    *,
    resume_step: int,
    job_config: Mapping[str, object] | None = None,
    also: Sequence[tuple[str, MetricsSink]] = (),
) -> MetricsFanout:
    """Open every sink of ``config`` for ``run_dir``, training (re)starting at ``resume_step``.

    ``job_config`` (the job's config, nested sections) becomes the W&B run's config and
    the MLflow run's parameters, as flat ``section.field`` keys. ``also`` are sinks of the
    caller's (the console showing samples), fanned out to like the rest.

    ``resume_step`` is the first step this session trains: 0 for a new run, the restored
    checkpoint's step after a restart. A sink whose extra is not installed is a
    :class:`~rollout_recovery.errors.ConfigError` (at ``$.metrics.sinks``, naming the extra)
    before any file is written. A tool sink that fails to open (a wandb start-up error, an
    unreadable store) is left out, named in ``failures``, and the run goes on.
    """
    check_step(resume_step, name="resume_step")
    config.check_installed()
    run_name = config.run_name or run_dir.resolve().name
    params = None if job_config is None else flat_params(job_config)
    opened: list[tuple[str, MetricsSink]] = []
    failures: dict[str, str] = {}
    try:
        for sink_name in config.sinks:
            if sink_name not in _OPENERS:
                continue  # jsonl: the trail's own metrics.jsonl
            try:
                sink = _OPENERS[sink_name](run_dir, resume_step, config, run_name, params)
            except ConfigError:
                raise
            except Exception as exc:
                failures[sink_name] = f"{type(exc).__name__}: {exc}"
                _log.warning("metrics sink %r could not be opened: %r", sink_name, exc)
                continue
            if sink_name in _SLOW:
                sink = BackgroundSink(
                    sink,
                    name=sink_name,
                    queue_size=config.queue_size,
                    timeout_s=config.flush_timeout_s,
                )
            opened.append((sink_name, sink))
    except BaseException:
        for _, sink in opened:
            sink.close()
        raise
    return MetricsFanout([*also, *opened], resume_step=resume_step, failures=failures)
