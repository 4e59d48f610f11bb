"""TensorBoard event files in ``DIR/tensorboard``, written by the ``tensorboard`` package.

Why ``tensorboard`` and not tensorboardX (numbers in docs/benchmarks.md): its writer's
``flush()`` waits for the queued events, and it names each file by pid and a counter, so a
checkpoint's flush is real and two sessions in one second never share a file; it also
brings the viewer and the reader the tests use. tensorboardX installs 4 MB against 66 MB
with their dependencies, but its ``flush()`` leaves queued events unwritten (up to
``flush_secs``, 120 s, lost on a kill), its file names have one-second resolution and are
opened with truncation, and it imports torch when torch is installed (0.75 s).

Resume: every session's file starts with a ``SessionLog.START`` event at the resume step
S (what ``SummaryWriter(purge_step=S)`` writes). TensorBoard's loader then drops every
event of an earlier file at a step >= S, so a re-trained step shows once, with its new
value. The superseded events stay in the older files; a reader that ignores the START
event (a raw protobuf walk) sees them.

One event per step holds all of that step's scalars (one record, one CRC: 55 us for 20
scalars, against 20 us per scalar one event each). Scalars are ``simple_value``, float32
as everywhere in TensorBoard. A marker is one event: a text summary ``markers/<kind>/text`` (the
Text dashboard lists them by step) and its scalars (``markers/<kind>/count``,
``markers/<kind>/<field>``). A step's sample completions are the text summary ``samples``: a
markdown table the Text dashboard renders, one per step.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from .._lifecycle import Resource
from ..errors import ClosedResourceError
from ._extras import require
from ._markers import marker_scalars, marker_text
from ._protocol import MarkerField, Sample, Scalar
from ._samples import samples_markdown

__all__ = ["TENSORBOARD_DIR", "TensorBoardSink"]

TENSORBOARD_DIR: Final = "tensorboard"
_DT_STRING: Final = 7  # tensorflow.DataType.DT_STRING


class TensorBoardSink(Resource):
    """One event file per session in ``run_dir / "tensorboard"``."""

    __slots__ = ("_Event", "_Summary", "_TensorProto", "_text_metadata", "_writer")

    def __init__(self, run_dir: Path, *, resume_step: int, max_queue: int = 1024) -> None:
        event_pb2: Any = require("tensorboard", "tensorboard.compat.proto.event_pb2")
        summary_pb2: Any = require("tensorboard", "tensorboard.compat.proto.summary_pb2")
        tensor_pb2: Any = require("tensorboard", "tensorboard.compat.proto.tensor_pb2")
        text_metadata: Any = require("tensorboard", "tensorboard.plugins.text.metadata")
        writer_module: Any = require("tensorboard", "tensorboard.summary.writer.event_file_writer")
        self._Event = event_pb2.Event
        self._Summary = summary_pb2.Summary
        self._TensorProto = tensor_pb2.TensorProto
        self._text_metadata = text_metadata.create_summary_metadata("", "")
        # flush_secs: the writer thread also flushes on its own now and then; a checkpoint
        # flushes explicitly.
        writer = writer_module.EventFileWriter(
            str(run_dir / TENSORBOARD_DIR), max_queue_size=max_queue, flush_secs=5
        )
        start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
        writer.add_event(self._Event(wall_time=time.time(), step=resume_step, session_log=start))
        writer.flush()
        self._writer: Any = writer

    def _live(self) -> Any:
        if self._writer is None:
            raise ClosedResourceError("tensorboard sink is closed")
        return self._writer

    def _scalar_values(self, values: Mapping[str, Scalar]) -> list[Any]:
        value = self._Summary.Value
        return [value(tag=k, simple_value=float(v)) for k, v in values.items() if v is not None]

    def log_step(self, step: int, values: Mapping[str, Scalar]) -> None:
        summary = self._Summary(value=self._scalar_values(values))
        self._live().add_event(self._Event(wall_time=time.time(), step=step, summary=summary))

    def _text(self, tag: str, text: str) -> Any:
        tensor = self._TensorProto(dtype=_DT_STRING, string_val=[text.encode()])
        return self._Summary.Value(tag=tag, metadata=self._text_metadata, tensor=tensor)

    def log_marker(self, step: int, kind: str, fields: Mapping[str, MarkerField]) -> None:
        entries = [
            self._text(f"markers/{kind}/text", marker_text(step, kind, fields)),
            *self._scalar_values(marker_scalars(kind, fields)),
        ]
        summary = self._Summary(value=entries)
        self._live().add_event(self._Event(wall_time=time.time(), step=step, summary=summary))

    def log_samples(self, step: int, samples: Sequence[Sample]) -> None:
        summary = self._Summary(value=[self._text("samples", samples_markdown(step, samples))])
        self._live().add_event(self._Event(wall_time=time.time(), step=step, summary=summary))

    def flush(self) -> None:
        self._live().flush()

    def close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()
