"""The one sink the controller holds: checks every call once, then hands it to each sink.

Arguments are checked before any sink sees them (a refused call changes nothing): flat
keys of the one grammar (``_keys``), numbers or None, ``log_step`` steps strictly
increasing from the resume step, marker steps not below it. A marker may name any later
step (a drop's target step): it moves nothing, so it can never make the next
``log_step`` a refused call.

Metrics must never stop training: a sink that raises (disk full, a W&B error, a queue
that stayed full past its timeout) is given up for the rest of the session, with a
warning on the ``rollout_recovery.metrics`` logger, and ``failures`` names it with its
error; the other sinks go on. Argument errors are the caller's and are raised.

Log calls come from one thread (the controller's loop); ``flush`` may come from another.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

from .._lifecycle import Resource
from ..errors import ClosedResourceError, InvalidArgumentError
from ._keys import check_fields, check_kind, check_step, check_values, flatten_scalars
from ._protocol import MarkerField, MetricsSink, Sample, Scalar
from ._samples import check_samples

__all__ = ["MetricsFanout"]

_log = logging.getLogger("rollout_recovery.metrics")


class MetricsFanout(Resource):
    """``MetricsSink`` over several named sinks; see the module docstring."""

    __slots__ = ("_closed", "_failures", "_last_step", "_lock", "_resume_step", "_sinks")

    def __init__(
        self,
        sinks: Sequence[tuple[str, MetricsSink]],
        *,
        resume_step: int,
        failures: Mapping[str, str] | None = None,
    ) -> None:
        self._sinks = dict(sinks)
        self._failures: dict[str, str] = dict(failures or {})
        self._resume_step = check_step(resume_step, name="resume_step")
        self._last_step: int | None = None
        self._closed = False
        # flush() may run in a worker thread (asyncio.to_thread) while the loop logs.
        self._lock = threading.Lock()

    @property
    def names(self) -> tuple[str, ...]:
        """The sinks still being written to."""
        with self._lock:
            return tuple(name for name in self._sinks if name not in self._failures)

    @property
    def failures(self) -> dict[str, str]:
        """Sinks given up this session (or that failed to open), with their error."""
        with self._lock:
            return dict(self._failures)

    def sink(self, name: str) -> MetricsSink:
        return self._sinks[name]

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError("metrics sinks are closed")

    def _check_not_before_resume(self, step: int) -> None:
        if step < self._resume_step:
            raise InvalidArgumentError(
                f"step {step} is before this session's resume step {self._resume_step}"
            )

    def _each(self, call: str, *args: object, given_up_too: bool = False) -> None:
        # The sinks are called outside the lock: a flush waiting on W&B in a worker thread
        # must not hold up the loop's next log call.
        with self._lock:
            live = [
                (n, s) for n, s in self._sinks.items() if given_up_too or n not in self._failures
            ]
        for name, sink in live:
            try:
                getattr(sink, call)(*args)
            except Exception as exc:
                with self._lock:
                    self._failures.setdefault(name, f"{type(exc).__name__}: {exc}")
                _log.warning("metrics sink %r given up after %s failed: %r", name, call, exc)

    def log_step(self, step: int, values: Mapping[str, Scalar]) -> None:
        check_step(step)
        checked = check_values(values)
        with self._lock:
            self._check_open()
            self._check_not_before_resume(step)
            if self._last_step is not None and step <= self._last_step:
                raise InvalidArgumentError(
                    f"step {step} was logged after step {self._last_step}: one call per "
                    "step, in increasing order"
                )
            self._last_step = step
        self._each("log_step", step, checked)

    def log_record(self, step: int, record: Mapping[str, object]) -> None:
        """``log_step`` of the numbers of a nested record (a step's ``metrics.jsonl``
        record) as flat ``a/b/c`` keys (``_keys.flatten_scalars``), after
        ``log_samples`` of its ``samples`` when it has some."""
        samples = record.get("samples")
        if isinstance(samples, list) and samples:
            self.log_samples(step, samples)
        self.log_step(step, flatten_scalars(record))

    def log_samples(self, step: int, samples: Sequence[Sample]) -> None:
        """The step's sample completions; call before its ``log_step``."""
        check_step(step)
        checked = check_samples(samples)
        with self._lock:
            self._check_open()
            self._check_not_before_resume(step)
            if self._last_step is not None and step <= self._last_step:
                raise InvalidArgumentError(
                    f"samples of step {step} after step {self._last_step} was logged: give "
                    "a step's samples before its values"
                )
        self._each("log_samples", step, checked)

    def log_marker(self, step: int, kind: str, fields: Mapping[str, MarkerField]) -> None:
        check_step(step)
        kind = check_kind(kind)
        checked = check_fields(fields)
        with self._lock:
            self._check_open()
            self._check_not_before_resume(step)
        self._each("log_marker", step, kind, checked)

    def flush(self) -> None:
        with self._lock:
            self._check_open()
        self._each("flush")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # A given-up sink is closed too, to release its tool (a W&B run, a writer thread).
        self._each("close", given_up_too=True)
