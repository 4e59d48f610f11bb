"""A tool sink's own small record in the run directory: which tool run it writes to.

The W&B and MLflow sinks resume the same tool run after a restart, so its id must outlive
the process: it is written (atomically, fsynced) before the tool run is first created and
read back by every later session. A file that does not decode is refused, never replaced:
replacing it would start a second tool run for the same job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import msgspec

from .._durable import atomic_write_bytes
from ..errors import InvalidStateError

__all__ = ["STATE_FILE", "SinkRunState", "load_state", "save_state"]

STATE_FILE: Final = "rollout-recovery-sink.json"
_FORMAT: Final = "rollout-recovery-metrics-sink"
_VERSION: Final = 1


class SinkRunState(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    format: str = _FORMAT
    version: int = _VERSION
    #: The tool's run id (W&B run id, MLflow run id).
    run_id: str
    #: W&B: the highest history step of each earlier session's file (read once, at the
    #: open after it ended), by session directory name.
    sessions: dict[str, int] = msgspec.field(default_factory=dict)


def load_state(directory: Path) -> SinkRunState | None:
    path = directory / STATE_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        state = msgspec.json.decode(raw, type=SinkRunState)
    except msgspec.DecodeError as exc:
        raise InvalidStateError(f"not a metrics sink state file: {exc}", file=str(path)) from exc
    if state.format != _FORMAT or state.version != _VERSION:
        raise InvalidStateError(
            f"metrics sink state {state.format!r} version {state.version} is not "
            f"{_FORMAT} version {_VERSION}",
            file=str(path),
        )
    return state


def save_state(directory: Path, state: SinkRunState) -> None:
    atomic_write_bytes(directory / STATE_FILE, msgspec.json.encode(state))
