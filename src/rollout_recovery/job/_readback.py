"""What a job reads back from its run directory when it ends: the summary's and the reward
plot's inputs, streamed.

Every process end reads the run's metrics, checkpoints and restarts, and the journal and
the metrics grow with the run: each is read one line at a time and only what is drawn or
printed is kept (a reward per step, the checkpoints' steps), so the memory of a process
end follows the number of steps in floats, not the history's bytes. Of the journal only
``checkpoint_committed`` records are decoded; every other line is checksummed and passed
over (``AuditTrail.stream_history``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidStateError, RunNotResumableError
from ..history import AuditTrail
from ..history.records import CheckpointCommitted, HistoryRecord
from ..rundir import RunDirectory
from ._report import RestoreTotals

__all__ = ["RunReadback"]


@dataclass(slots=True)
class RunReadback:
    """The run's steps and mean rewards, checkpoints, restarts, what its restores kept and
    newest backend parts."""

    steps: list[int] = field(default_factory=list)
    #: NaN where a step had no reward.
    mean_rewards: list[float] = field(default_factory=list)
    #: Steps a checkpoint was committed at, in journal order.
    checkpoints: list[int] = field(default_factory=list)
    #: Steps a run resumed at.
    restarts: list[int] = field(default_factory=list)
    #: Per server or actor counts from the newest step's backend telemetry.
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Each ``time/<part>_s`` step field summed over the steps (``time/step_s`` too).
    seconds: dict[str, float] = field(default_factory=dict)
    #: Steps the trainer refused (another model's logprobs) and their valid rows.
    refused_steps: int = 0
    refused_rows: int = 0
    #: What the restores kept, trained again and lost (zeros in a run that never restarted).
    restored: RestoreTotals = field(default_factory=RestoreTotals)

    @classmethod
    def read(cls, run: RunDirectory, *, group_size: int = 1) -> RunReadback:
        """Stream ``run``'s metrics, journal and run log (``group_size``: the job's
        generations per prompt, the rows of a kept group). A journal or metrics file that
        cannot be read (altered while the job ran) is a ``RunNotResumableError``: the next
        start refuses the same damage before it trains."""
        found = cls()
        try:
            found.restarts = [e.step for e in run.read_run_log() if e.event == "resume"]
        except ValueError:
            found.restarts = []
        try:
            found._read_metrics(run)
            found._read_history(run, group_size)
        except InvalidStateError as error:
            raise RunNotResumableError(
                f"the run's history cannot be read back: {error}",
                remedy="Restore the file it names from a backup, or start a new run in "
                "another directory (rollout-recovery audit DIR shows the damage).",
            ) from error
        return found

    @property
    def rewards(self) -> list[float]:
        """The steps' mean rewards, the steps without one left out."""
        return [reward for reward in self.mean_rewards if not math.isnan(reward)]

    def _read_metrics(self, run: RunDirectory) -> None:
        if not run.metrics.is_file():
            return
        backend: object = None
        for values in AuditTrail.stream_metrics(run):
            self.steps.append(values["step"])
            reward = values.get("mean_reward")
            self.mean_rewards.append(math.nan if reward is None else float(reward))
            backend = values.get("backend")
            for name, value in values.items():
                if name.startswith("time/") and name.endswith("_s") and _finite(value):
                    self.seconds[name] = self.seconds.get(name, 0.0) + float(value)
            refused = values.get("refused_rows") or 0
            self.refused_steps += 1 if refused else 0
            self.refused_rows += int(refused)
        self.parts = _parts(backend)

    @property
    def time_shares(self) -> dict[str, float]:
        """Each part's seconds over the steps' seconds (``{"train": 0.15, ...}``); empty
        before a timed step (runs older than the ``time/*`` fields have none)."""
        total = self.seconds.get("time/step_s", 0.0)
        if total <= 0.0:
            return {}
        return {
            name.removeprefix("time/").removesuffix("_s"): seconds / total
            for name, seconds in self.seconds.items()
            if name != "time/step_s"
        }

    def _read_history(self, run: RunDirectory, group_size: int) -> None:
        if not run.events.is_file():
            return
        # Each step's training is decoded only where a restore may have rolled it back.
        events = {"checkpoint_committed"}
        if self.restarts:
            events |= {"restored", "step_trained"}
        self.restored = RestoreTotals.of(self._checkpoints_taken(run, events), group_size)

    def _checkpoints_taken(self, run: RunDirectory, events: set[str]) -> Iterator[HistoryRecord]:
        """``events`` of the journal, the checkpoints' steps kept on the way."""
        for record in AuditTrail.stream_history(run, events=events):
            if isinstance(record, CheckpointCommitted):
                self.checkpoints.append(record.step)
            else:
                yield record


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _parts(backend: object) -> dict[str, dict[str, Any]]:
    """Per server or actor counts from one step's backend telemetry."""
    if not isinstance(backend, Mapping):
        return {}
    for kind in ("servers", "actors"):
        parts = backend.get(kind)
        if isinstance(parts, dict):
            return parts
    return {}
