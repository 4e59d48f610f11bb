"""BackgroundSink: the slow sinks' calls, in order, on a worker thread, every wait bounded."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import pytest

from rollout_recovery.errors import ClosedResourceError, LivenessError
from rollout_recovery.metrics._background import BackgroundSink
from rollout_recovery.metrics._protocol import MarkerField, Scalar


class Gated:
    """Records calls; each waits for ``gate`` (open unless a test closes it)."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail: Exception | None = None

    def _do(self, *call: object) -> None:
        self.entered.set()
        assert self.gate.wait(30)
        if self.fail is not None and call[0] == "step":
            raise self.fail
        self.calls.append(call)

    def log_step(self, step: int, values: Mapping[str, Scalar]) -> None:
        self._do("step", step)

    def log_marker(self, step: int, kind: str, fields: Mapping[str, MarkerField]) -> None:
        self._do("marker", step, kind)

    def flush(self) -> None:
        self._do("flush")

    def close(self) -> None:
        self.calls.append(("close",))


def test_calls_run_in_order_and_flush_waits_for_them() -> None:
    inner = Gated()
    sink = BackgroundSink(inner, name="slow", queue_size=8, timeout_s=30)
    inner.gate.clear()
    sink.log_step(0, {})
    sink.log_marker(1, "restored", {})
    sink.log_step(1, {})
    assert inner.calls == []  # the caller did not wait for the sink
    inner.gate.set()
    sink.flush()
    assert inner.calls == [("step", 0), ("marker", 1, "restored"), ("step", 1), ("flush",)]
    sink.close()
    assert inner.calls[-1] == ("close",)
    with pytest.raises(ClosedResourceError):
        sink.log_step(2, {})


def test_a_full_queue_and_a_stuck_flush_time_out_naming_the_sink() -> None:
    inner = Gated()
    sink = BackgroundSink(inner, name="wandb", queue_size=1, timeout_s=0.05)
    inner.gate.clear()
    sink.log_step(0, {})  # taken by the worker, which now waits on the gate
    assert inner.entered.wait(30)
    sink.log_step(1, {})  # fills the queue
    with pytest.raises(LivenessError, match="room in the wandb metrics queue"):
        sink.log_step(2, {})
    inner.gate.set()
    sink.flush()
    assert inner.calls == [("step", 0), ("step", 1), ("flush",)]
    inner.gate.clear()
    inner.entered.clear()
    sink.log_step(3, {})
    assert inner.entered.wait(30)
    with pytest.raises(LivenessError, match="the wandb metrics sink to flush"):
        sink.flush()
    inner.gate.set()
    sink.close()


def test_the_sinks_failure_is_raised_in_the_callers_thread_and_close_still_closes() -> None:
    inner = Gated()
    inner.fail = OSError("disk full")
    sink = BackgroundSink(inner, name="mlflow", queue_size=8, timeout_s=30)
    sink.log_step(0, {})
    with pytest.raises(OSError, match="disk full"):
        sink.flush()
    with pytest.raises(OSError, match="disk full"):
        sink.log_step(1, {})
    with pytest.raises(OSError, match="disk full"):
        sink.close()
    assert inner.calls == [("close",)]
