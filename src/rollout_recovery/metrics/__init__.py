"""Metrics where RL users look: JSONL, TensorBoard, Weights & Biases (offline), MLflow.

``open_metrics(config, run_dir, resume_step=S)`` opens the sinks ``[metrics] sinks``
names (:class:`MetricsConfig`) as one :class:`MetricsFanout`, a :class:`MetricsSink`:
``log_step(step, values)`` once per trained step with flat scalar values
(:func:`flatten_scalars` makes them from a nested record), ``log_marker(step, kind,
fields)`` for restores, checkpoints and drops, ``flush()`` at checkpoints, ``close()``.
A restart opens them again at the restored step; no sink shows a step twice. The tool
packages are optional extras, imported only when their sink is opened.
"""

from ._config import MetricsConfig
from ._keys import flatten_scalars
from ._protocol import MetricsSink

__all__ = [
    "MetricsConfig",
    "MetricsSink",
    "flatten_scalars",
]
