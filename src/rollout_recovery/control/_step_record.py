"""What one trained step records: :class:`StepRecord`, typed until it is written.

The controller fills one per step; :meth:`StepRecord.flat` turns it into the flat
``metrics.jsonl`` line once, and that same dict goes to the journal's metrics file and to
the ``[metrics]`` sinks, so the two cannot say different things. The flat keys (and the
values) are the file's format: ``step``, ``mean_reward``, ``groups``, ``rows``,
``valid_rows``, ``valid_row_fraction``, ``refused_rows``, ``placeholder_reasons``,
``weight_version``, ``train_seconds``, ``train/<trainer metric>``, ``backend`` (a backend
with telemetry), the sample completions (``samples``, when the job describes them) and
the ``time/*`` fields (``_step_timing``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ._step_timing import StepTimes

__all__ = ["StepRecord"]


class StepRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One trained step's metrics."""

    step: int
    #: Over the valid rows the step trained; None when it trained none.
    mean_reward: float | None
    groups: int
    #: Every canonical row the step consumed, placeholders included.
    rows: int
    valid_rows: int
    #: Valid rows the trainer refused (another model's logprobs): not trained.
    refused_rows: int
    placeholder_reasons: dict[str, int]
    #: The controller's weight version after the step.
    weight_version: int
    train_seconds: float
    #: The trainer's own metrics (``train/<name>`` in the line).
    train: dict[str, Any]
    #: The backend's cumulative per-part counts; None for a backend without telemetry.
    backend: dict[str, Any] | None
    #: What the job's sample describer adds (``samples``).
    described: dict[str, Any]
    times: StepTimes

    def flat(self) -> dict[str, Any]:
        """The ``metrics.jsonl`` line (keys in the file's order)."""
        line: dict[str, Any] = {
            "step": self.step,
            "mean_reward": self.mean_reward,
            "groups": self.groups,
            "rows": self.rows,
            "valid_rows": self.valid_rows,
            "valid_row_fraction": self.valid_rows / self.rows if self.rows else None,
            "refused_rows": self.refused_rows,
            "placeholder_reasons": self.placeholder_reasons,
            "weight_version": self.weight_version,
            "train_seconds": self.train_seconds,
            **{f"train/{name}": value for name, value in self.train.items()},
        }
        if self.backend is not None:
            line["backend"] = self.backend
        line.update(self.described)
        line.update(self.times.flat())
        return line
