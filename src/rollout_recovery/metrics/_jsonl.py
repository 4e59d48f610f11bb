"""``metrics.jsonl``: one strict-JSON line per trained step, cut back on resume.

Each line is appended with one ``os.write`` on an ``O_APPEND`` descriptor, so a SIGKILL
never leaves half a line (the audit trail's rule). Opening for resume step S cuts the
file at its first line whose step is S or more (or that does not parse: a torn tail),
so the file tells one history; lines are in step order, so that is one ``ftruncate``.
Markers are not written here: ``events.jsonl`` holds every one of them, with all fields.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import msgspec

from .._closing import Closing
from ..errors import ClosedResourceError, StorageFullError
from ._protocol import MarkerField, Scalar

__all__ = ["METRICS_FILE", "JsonlSink"]

METRICS_FILE: Final = "metrics.jsonl"

# msgspec writes NaN and the infinities as null: strict JSON by construction.
_ENCODER = msgspec.json.Encoder()
_STEP_ONLY = msgspec.json.Decoder(dict[str, object])


def _cut_offset(path: Path, resume_step: int) -> int | None:
    """Where the first line at or past ``resume_step`` starts, or None to keep it all."""
    offset = 0
    with open(path, "rb") as handle:
        for line in handle:
            try:
                step = _STEP_ONLY.decode(line).get("step")
            except msgspec.DecodeError:
                return offset
            if not isinstance(step, int) or step >= resume_step or not line.endswith(b"\n"):
                return offset
            offset += len(line)
    return None


class JsonlSink(Closing):
    """Appends ``{"step": N, ...values}`` lines to ``run_dir / name``."""

    __slots__ = ("_fd", "_path")

    def __init__(self, run_dir: Path, *, resume_step: int, name: str = METRICS_FILE) -> None:
        self._path = run_dir / name
        fd = os.open(self._path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            cut = _cut_offset(self._path, resume_step)
            if cut is not None:
                os.ftruncate(fd, cut)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd

    @property
    def path(self) -> Path:
        return self._path

    def _descriptor(self) -> int:
        if self._fd is None:
            raise ClosedResourceError(f"{self._path.name} sink is closed")
        return self._fd

    def log_step(self, step: int, values: Mapping[str, Scalar]) -> None:
        line = _ENCODER.encode({"step": step, **values}) + b"\n"
        # A short write means the disk filled mid-line: stop, so nothing is appended after
        # a torn line (the next open cuts it off).
        if os.write(self._descriptor(), line) != len(line):
            raise StorageFullError(f"appending to {self._path.name}", filename=str(self._path))

    def log_marker(self, step: int, kind: str, fields: Mapping[str, MarkerField]) -> None:
        self._descriptor()  # events.jsonl has the marker; only refuse a closed sink

    def flush(self) -> None:
        os.fsync(self._descriptor())

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
