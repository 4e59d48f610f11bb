"""The metrics seam: one object per tool, written to by the controller once per step.

A sink is opened for a run directory and a *resume step* S: the first step this session
will train. A restart rolls training back to a checkpoint, so every point an earlier
session wrote for a step >= S is superseded; each sink makes sure a reader never sees a
step twice (how depends on what the tool can do: see each sink's docstring).

Within a session ``log_step`` steps strictly increase from S, one call per trained step;
a marker names any step from S on (the controller's current step; a drop's target step
belongs in its fields).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = ["MarkerField", "MetricsSink", "Sample", "Scalar"]

#: A metric value; ``None`` is "no value this step" (JSONL writes null, the tools skip it).
Scalar = float | int | None
#: A marker's field: shown as text; the numeric ones are charted too.
MarkerField = str | int | float | bool | None
#: One sample completion of a step: ``prompt``, ``completion``, ``reward``, where it came
#: from (``group_id``, ``generation_index``, ``prompt_idx``), ``components`` and, for a
#: placeholder, ``reason`` (``_samples.check_samples``).
Sample = Mapping[str, Any]


class MetricsSink(Protocol):
    """Where per-step metrics and run markers go: a file, TensorBoard, W&B, MLflow."""

    def log_step(self, step: int, values: Mapping[str, Scalar]) -> None:
        """The scalar metrics of one trained step (flat ``a/b/c`` keys)."""
        ...

    def log_marker(self, step: int, kind: str, fields: Mapping[str, MarkerField]) -> None:
        """Something that happened at ``step``: ``restored``, ``checkpoint_committed``,
        ``prompt_dropped``, ... with its fields (``tokens_lost``, ``reason``, ...)."""
        ...

    def log_samples(self, step: int, samples: Sequence[Sample]) -> None:
        """A few of the step's completions as text, given before the step's values (a
        W&B table, TensorBoard text, an MLflow artifact)."""
        ...

    def flush(self) -> None:
        """Make everything logged so far durable in the tool's files (called at checkpoints)."""
        ...

    def close(self) -> None:
        """Flush and release the tool; the sink is unusable afterwards."""
        ...
