"""Where a step's wall time goes: the ``time/*`` fields of each step's metrics.

A step's period runs from the end of the previous step's record (the run's start for the
first one) to the end of its own. Inside it the job, in order: hands the previous step's
weights to generation, takes the previous step's checkpoint (if one fell due), waits for
the step's groups (generation on the critical path), waits for the journal to make the
publishes durable, and trains. Each of those is one field, in seconds::

    time/weight_sync_s    the previous step's weights: the trainer's snapshot and the
                          hand-over to generation, plus every push a server finished since
                          the previous step (an HTTP backend pushes in the background; its
                          ``weights_loaded`` events carry each push's seconds)
    time/checkpoint_s     the checkpoint taken after the previous step (0.0 if none)
    time/generation_s     waiting for the step's groups to be ready
    time/journal_s        the journal's flush before training
    time/train_s          the trainer's step
    time/step_s           the whole period; what the fields above leave is bookkeeping
    time/wall             the wall-clock time (Unix seconds) the step's record was made

A background push overlaps generation, so ``time/weight_sync_s`` can count seconds that
``time/generation_s`` counts too: the shares are each part's cost, not a partition. The
checkpoint and the hand-over after the last step are in no step's period.

Durations are read from the event loop's clock (``_clock.monotonic``), so a test on a
virtual clock sees virtual seconds; ``time/wall`` is ``time.time()``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .._clock import monotonic
from ..errors import InvalidArgumentError

__all__ = ["TIME_FIELDS", "StepTimer"]

#: The summed fields, in the order the summary shows their shares.
TIME_FIELDS = (
    "time/generation_s",
    "time/train_s",
    "time/weight_sync_s",
    "time/checkpoint_s",
    "time/journal_s",
)


@dataclass(slots=True)
class StepTimer:
    """Accumulates one step period's parts; :meth:`fields` closes the period."""

    _period_started: float | None = None
    _parts: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        """The run (or a resume) starts: the first period begins now."""
        self._period_started = monotonic()
        self._parts = {}

    def add(self, name: str, seconds: float) -> None:
        """``seconds`` more of ``name`` (one of :data:`TIME_FIELDS`) in this period."""
        if name not in TIME_FIELDS:
            raise InvalidArgumentError(
                f"unknown step time field {name!r}; one of {', '.join(TIME_FIELDS)}"
            )
        self._parts[name] = self._parts.get(name, 0.0) + max(0.0, seconds)

    def fields(self) -> dict[str, float]:
        """The period's ``time/*`` fields; the next period starts now."""
        now = monotonic()
        started = now if self._period_started is None else self._period_started
        out = {name: round(self._parts.get(name, 0.0), 6) for name in TIME_FIELDS}
        out["time/step_s"] = round(now - started, 6)
        out["time/wall"] = round(time.time(), 3)
        self._period_started = now
        self._parts = {}
        return out
