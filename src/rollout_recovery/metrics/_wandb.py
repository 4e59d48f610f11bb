"""A Weights & Biases run in offline mode, in ``DIR/wandb``: no network, no login.

One W&B run per job: its id is kept in ``DIR/wandb/rollout-recovery-sink.json`` and every
session resumes it (``resume="allow"``); wandb writes each session to its own
``DIR/wandb/offline-run-<time>-<id>`` directory, and ``wandb sync`` of those directories,
oldest first, uploads one run.

W&B history never goes back: a step below the run's newest is dropped by W&B. So a
session never logs a step the run already holds. At open the sink reads the earlier
sessions' ``.wandb`` files (``_wandb_files``) for the highest step W&B really holds, H
(what a kill lost before W&B wrote it is not counted, so it is logged again, once).
Steps S..H, re-trained after a restore to S, are then *not* logged: W&B keeps the values
the rolled-back attempt logged for them (``metrics.jsonl`` and TensorBoard have the
re-trained ones), and logging resumes at H + 1.

Markers go into the row of the next step logged (W&B rows are one per step):
``markers/<kind>/count`` counts them, ``markers/<kind>/<field>`` keeps the last numeric fields,
``markers/<kind>/step`` the step the last one happened at. A restore is also a W&B alert
(recorded offline, sent when synced). Markers after a session's last step are not in
W&B (``events.jsonl`` has them). A step's sample completions are a ``samples`` table in its
row (the W&B UI's table panel steps through them). The job's config is the run's config
(``section.field`` keys; a resume updates what it changed).

W&B offline writes its ``.wandb`` file from a buffer, in its own ``wandb-core`` process,
and wandb 0.31 has no call that makes it write now: a SIGKILL loses what it had not
written yet (measured: everything a session logged in its last interval). The sink asks
for a write every 0.25 s (``x_transaction_log_flush_interval``; wandb's default is 15 s).
What a kill lost past the resume step is logged again by the next session (it reads what
W&B really holds); what it lost before the resume step (steps logged in the 0.25 s before
a checkpoint and a kill) stays a gap in W&B, never a duplicate. ``flush`` at a checkpoint
waits for the sink's queue to reach wandb, not for wandb's write.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._lifecycle import Resource
from ..errors import ClosedResourceError
from ._extras import require
from ._markers import PendingMarkers, marker_text
from ._protocol import MarkerField, Sample, Scalar
from ._run_state import SinkRunState, load_state, save_state
from ._samples import SAMPLE_COLUMNS, sample_table
from ._wandb_files import WANDB_DIR, history_steps, offline_run_files

__all__ = ["WandbSink"]

_FLUSH_INTERVAL_S = 0.25


def _known_high_water(run_dir: Path, state: SinkRunState) -> tuple[SinkRunState, int]:
    """Read the sessions not read yet; the highest step W&B holds over all (-1: none)."""
    sessions = dict(state.sessions)
    for log in offline_run_files(run_dir, state.run_id):
        name = log.parent.name
        if name not in sessions:
            sessions[name] = max(history_steps(log), default=-1)
    updated = SinkRunState(run_id=state.run_id, sessions=sessions)
    return updated, max(sessions.values(), default=-1)


class WandbSink(Resource):
    """Logs each step as one W&B history row, ``step`` = the training step."""

    __slots__ = ("_alert_level", "_high_water", "_pending", "_run", "_samples", "_wandb")

    def __init__(
        self,
        run_dir: Path,
        *,
        resume_step: int,
        project: str,
        run_name: str,
        job_config: Mapping[str, object] | None = None,
    ) -> None:
        wandb: Any = require("wandb")
        directory = run_dir / WANDB_DIR
        directory.mkdir(exist_ok=True)
        state = load_state(directory)
        if state is None:
            # wandb's own ids are 8 characters of [a-z0-9]; so are these.
            state = SinkRunState(run_id=secrets.token_hex(4))
        state, self._high_water = _known_high_water(run_dir, state)
        save_state(directory, state)
        options: dict[str, Any] = {
            "console": "off",
            "silent": True,
            "save_code": False,
            "disable_git": True,
            "x_disable_stats": True,
            "x_disable_meta": True,
        }
        if "x_transaction_log_flush_interval" in wandb.Settings.model_fields:
            options["x_transaction_log_flush_interval"] = _FLUSH_INTERVAL_S
        self._run: Any = wandb.init(
            mode="offline",
            dir=str(run_dir),
            project=project,
            name=run_name,
            id=state.run_id,
            resume="allow",
            # Leaves any run of the caller's alone (and wandb.run with it).
            reinit="create_new",
            settings=wandb.Settings(**options),
        )
        if job_config:
            # A resume may have changed operational settings: the run shows the current.
            self._run.config.update(dict(job_config), allow_val_change=True)
        self._wandb: Any = wandb
        self._alert_level = wandb.AlertLevel.WARN
        self._pending = PendingMarkers()
        self._samples: Any = None

    @property
    def run_id(self) -> str:
        return str(self._live().id)

    def _live(self) -> Any:
        if self._run is None:
            raise ClosedResourceError("wandb sink is closed")
        return self._run

    def log_step(self, step: int, values: Mapping[str, Scalar]) -> None:
        run = self._live()
        if step <= self._high_water:
            return  # W&B already holds this step: the rolled-back attempt's row stays
        row: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
        row.update(self._pending.drain())
        if self._samples is not None:
            row["samples"], self._samples = self._samples, None
        run.log(row, step=step, commit=True)

    def log_samples(self, step: int, samples: Sequence[Sample]) -> None:
        self._live()
        if step <= self._high_water:
            return  # that step's row (and its table) is the rolled-back attempt's
        # Rides on the step's row, which log_step writes next.
        self._samples = self._wandb.Table(
            columns=list(SAMPLE_COLUMNS), data=sample_table(samples)
        )

    def log_marker(self, step: int, kind: str, fields: Mapping[str, MarkerField]) -> None:
        run = self._live()
        self._pending.add(step, kind, fields)
        if kind == "restored":
            run.alert(
                title=f"rollout-recovery restored at step {step}",
                text=marker_text(step, kind, fields),
                level=self._alert_level,
                wait_duration=0,
            )

    def flush(self) -> None:
        # wandb has no flush: wandb-core writes its file every _FLUSH_INTERVAL_S.
        self._live()

    def close(self) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            run.finish()
