"""MetricsFanout: one check for every call, time only forward, a failing sink given up."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from rollout_recovery.errors import (
    ClosedResourceError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
)
from rollout_recovery.metrics._fanout import MetricsFanout
from rollout_recovery.metrics._protocol import MarkerField, Scalar


class Recorder:
    def __init__(self, *, fail_on: str | None = None) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.fail_on = fail_on

    def _record(self, *call: object) -> None:
        if call[0] == self.fail_on:
            raise OSError(28, "No space left on device")
        self.calls.append(call)

    def log_step(self, step: int, values: Mapping[str, Scalar]) -> None:
        self._record("step", step, dict(values))

    def log_marker(self, step: int, kind: str, fields: Mapping[str, MarkerField]) -> None:
        self._record("marker", step, kind, dict(fields))

    def flush(self) -> None:
        self._record("flush")

    def close(self) -> None:
        self._record("close")


def test_calls_reach_every_sink_in_order() -> None:
    a, b = Recorder(), Recorder()
    metrics = MetricsFanout([("a", a), ("b", b)], resume_step=6)
    metrics.log_marker(6, "restored", {"tokens_lost": 3})
    metrics.log_step(6, {"loss": 1.0})
    metrics.log_marker(7, "checkpoint_committed", {})
    metrics.log_step(7, {"loss": None})
    metrics.flush()
    metrics.close()
    expected = [
        ("marker", 6, "restored", {"tokens_lost": 3}),
        ("step", 6, {"loss": 1.0}),
        ("marker", 7, "checkpoint_committed", {}),
        ("step", 7, {"loss": None}),
        ("flush",),
        ("close",),
    ]
    assert a.calls == expected
    assert b.calls == expected
    assert metrics.names == ("a", "b")
    with pytest.raises(ClosedResourceError):
        metrics.log_step(8, {})


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda m: m.log_step(5, {}), InvalidArgumentError),  # before the resume step
        (lambda m: m.log_step(7, {}), InvalidArgumentError),  # logged already
        (lambda m: m.log_step(6, {}), InvalidArgumentError),
        (lambda m: m.log_marker(5, "prompt_dropped", {}), InvalidArgumentError),
        (lambda m: m.log_step(True, {}), InvalidArgumentTypeError),
        (lambda m: m.log_step(9, {"a": "1"}), InvalidArgumentTypeError),
        (lambda m: m.log_marker(9, "a/b", {}), InvalidArgumentError),
        (lambda m: m.log_marker(9, "k", {"f": [1]}), InvalidArgumentTypeError),
        (lambda m: m.log_marker(9, "k", {"a/b": 1}), InvalidArgumentError),
    ],
)
def test_a_refused_call_reaches_no_sink_and_changes_nothing(call, error) -> None:  # type: ignore[no-untyped-def]
    sink = Recorder()
    metrics = MetricsFanout([("a", sink)], resume_step=6)
    metrics.log_step(7, {"x": 1})
    metrics.log_marker(9, "prompt_dropped", {"target_step": 9})
    metrics.log_marker(6, "checkpoint_committed", {})
    before = list(sink.calls)
    with pytest.raises(error):
        call(metrics)
    assert sink.calls == before
    metrics.log_step(8, {"x": 2})  # nothing moved: 8 is still next (the marker moves nothing)
    assert sink.calls[-1] == ("step", 8, {"x": 2})


def test_a_failing_sink_is_given_up_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken, healthy = Recorder(fail_on="step"), Recorder()
    metrics = MetricsFanout([("broken", broken), ("healthy", healthy)], resume_step=0)
    with caplog.at_level(logging.WARNING, logger="rollout_recovery.metrics"):
        metrics.log_step(0, {"loss": 1.0})
    metrics.log_step(1, {"loss": 2.0})
    metrics.close()
    assert metrics.failures == {"broken": "OSError: [Errno 28] No space left on device"}
    assert metrics.names == ("healthy",)
    assert broken.calls == [("close",)]  # given up, but still closed
    assert [call[0] for call in healthy.calls] == ["step", "step", "close"]
    assert "'broken' given up after log_step failed" in caplog.text


def test_open_failures_are_reported() -> None:
    metrics = MetricsFanout([], resume_step=0, failures={"wandb": "boom"})
    assert metrics.failures == {"wandb": "boom"}
    assert metrics.names == ()
