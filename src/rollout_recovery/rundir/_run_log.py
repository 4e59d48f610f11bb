"""``run_log.jsonl``: one line per start, resume or drain; never cut.

The history (``events.jsonl``) is cut back to a checkpoint on resume; this log is not, so
it keeps every process that ever ran the job, which is what "the run was restarted K
times" and "this setting changed at step S" are read from.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

import msgspec

from .._durable import PRIVATE_FILE_MODE
from ..errors import InvalidStateError

if TYPE_CHECKING:  # _layout imports this module to give RunDirectory its log methods
    from ._layout import RunDirectory

__all__ = ["RunLogEntry", "append_run_log", "read_run_log"]


class RunLogEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    event: Literal["start", "resume", "drain"]
    time: float
    pid: int
    #: The step the process started training at (a drain: the step a rerun resumes at).
    step: int
    #: The checkpoint a resume restored (a drain: the one it committed).
    checkpoint: str | None = None
    #: Operational settings this start changed (``"$.http.servers: [...] != [...]"``).
    config_changes: list[str] = []
    #: What asked for a drain (``"SIGTERM"``, the drain file, ...).
    reason: str | None = None


def append_run_log(
    run: RunDirectory,
    event: Literal["start", "resume", "drain"],
    *,
    step: int,
    checkpoint: str | None = None,
    config_changes: list[str] | None = None,
    reason: str | None = None,
) -> None:
    entry = RunLogEntry(
        event=event,
        time=time.time(),
        pid=os.getpid(),
        step=step,
        checkpoint=checkpoint,
        config_changes=config_changes or [],
        reason=reason,
    )
    fd = os.open(
        run.run_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE
    )
    try:
        os.write(fd, msgspec.json.encode(entry) + b"\n")
    finally:
        os.close(fd)


def read_run_log(run: RunDirectory) -> Iterator[RunLogEntry]:
    """The log's entries; ``InvalidStateError`` naming ``file:line`` for a damaged one."""
    if not run.run_log.is_file():
        return
    with open(run.run_log, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield msgspec.json.decode(line, type=RunLogEntry)
            except (msgspec.ValidationError, msgspec.DecodeError) as error:
                raise InvalidStateError(
                    f"{run.run_log.name}:{number} is not a run log entry: {error}",
                    file=str(run.run_log),
                ) from None
