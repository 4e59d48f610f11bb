"""Where a step's wall time goes: the ``time/*`` fields of each step's metrics.

A step's period runs from the end of the previous step's record (the run's start for the
first one) to the end of its own. Inside it the job, in order: hands the previous step's
weights to generation, takes the previous step's checkpoint (if one fell due), waits for
the step's groups (generation on the critical path), waits for the journal to make the
publishes durable, and trains. Each of those is one field, in seconds::

    time/weight_sync_s    the previous step's weights: the trainer's snapshot and the
                          hand-over to generation, plus every push a server finished since
                          the previous step (an HTTP backend pushes in the background; its
                          ``weights_loaded`` events carry each push's ``seconds``, and
                          ``weights_push_failed`` the first failed one's of a streak,
                          which cost them too (its phases, but no ``write_s`` or
                          ``drain_s``); with ``weight_sync = "vllm"`` a loaded one says
                          where they went: ``write_s`` (the
                          file, ``file_s`` of it in the writer's thread), ``pause_s``,
                          ``unname_s``, ``load_s``, ``tag_s``, ``resume_s``; ``drain_s``,
                          the wait for the server's calls before, is not counted)
    time/checkpoint_s     the checkpoint taken after the previous step (0.0 if none): the
                          wait for its whole write, or with ``[checkpoint] background``
                          the wait for the previous checkpoint's write plus the capture
                          (the hold, the trainer's state copied to memory)
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

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from .._clock import monotonic
from ..errors import InvalidArgumentError

__all__ = ["PUSH_EVENTS", "TIME_FIELDS", "StepTimer", "StepTimes"]

#: The backend events whose ``seconds`` are a weight push's (done or failed).
PUSH_EVENTS = frozenset({"weights_loaded", "weights_push_failed"})


class StepTimes(msgspec.Struct, frozen=True, kw_only=True):
    """One step period's parts, in seconds; :meth:`flat` names them ``time/<field>``."""

    generation_s: float
    train_s: float
    weight_sync_s: float
    checkpoint_s: float
    journal_s: float
    step_s: float
    #: Unix seconds, the wall-clock time the step's record was made.
    wall: float

    def flat(self) -> dict[str, float]:
        """The ``time/*`` fields of the step's ``metrics.jsonl`` line, in field order."""
        return {f"time/{name}": getattr(self, name) for name in self.__struct_fields__}


#: The summed fields, in the order the summary shows their shares.
TIME_FIELDS: tuple[str, ...] = tuple(
    f"time/{name}" for name in StepTimes.__struct_fields__ if name not in ("step_s", "wall")
)


@dataclass(slots=True)
class StepTimer:
    """Accumulates one step period's parts; :meth:`lap` closes the period (a stopwatch lap)."""

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

    def add_backend_event(self, kind: str, event: Mapping[str, object]) -> None:
        """A backend event since the last step: a push's ``seconds`` (done or failed)
        count as weight sync; other events, and a missing or broken count, add nothing."""
        seconds = event.get("seconds")
        if kind not in PUSH_EVENTS or isinstance(seconds, bool):
            return
        if isinstance(seconds, int | float) and math.isfinite(seconds):
            self.add("time/weight_sync_s", float(seconds))

    def lap(self) -> StepTimes:
        """The period's parts; the next period starts now."""
        now = monotonic()
        started = now if self._period_started is None else self._period_started
        parts = {
            name.removeprefix("time/"): round(self._parts.get(name, 0.0), 6)
            for name in TIME_FIELDS
        }
        self._period_started = now
        self._parts = {}
        return StepTimes(**parts, step_s=round(now - started, 6), wall=round(time.time(), 3))
