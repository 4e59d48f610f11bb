"""Metrics where RL users look: JSONL, TensorBoard, Weights & Biases (offline), MLflow.

``MetricsConfig.open(run_dir, resume_step=S)`` opens the sinks ``[metrics] sinks`` names
(:class:`MetricsConfig`) as one ``MetricsFanout``, itself a sink: ``log_step(step,
values)`` once per trained step with flat scalar values (``log_record(step, record)``
flattens a nested record first), ``log_marker(step, kind, fields)`` for restores,
checkpoints and drops, ``flush()`` at checkpoints, ``close()``.
A restart opens them again at the restored step; no sink shows a step twice. The tool
packages are optional extras, imported only when their sink is opened.
"""

from ._config import MetricsConfig

__all__ = ["MetricsConfig"]
