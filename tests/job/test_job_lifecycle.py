"""The job's resources are on one exit stack: however the job ends (its last step, a
drain, an error in the run, a refused restore, a second Ctrl-C), each resource it opened is
closed once, in reverse order of opening, and the directory's lock is released."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.checkpoint._sidecar_io import SIDECAR_FILENAMES
from rollout_recovery.control import RunConfig
from rollout_recovery.dataplane import DataPlane, SqliteDataPlane
from rollout_recovery.errors import RunNotResumableError
from rollout_recovery.history import AuditTrail
from rollout_recovery.job import _run_job, run_job
from rollout_recovery.job._components import JobComponents, default_components
from rollout_recovery.metrics._fanout import MetricsFanout
from rollout_recovery.policy import NumpyGRPOTrainer
from rollout_recovery.rollout import SimulatedAgentBackend
from rollout_recovery.rundir import CheckpointStore, RunDirectory

MakeConfig = Callable[..., RunConfig]


class Closes:
    """Records, in order, the closes of the resources of the job under test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.order: list[str] = []
        self.plane: DataPlane | None = None
        self.backend: Any = None
        self.sigterm_before: Any = None
        self.sigint_before: Any = None
        self._wrap(monkeypatch, SqliteDataPlane, "close", "data plane", lambda s: s is self.plane)
        self._wrap(monkeypatch, AuditTrail, "close", "trail", lambda s: True)
        joined = _run_job._join_worker_threads

        async def join() -> None:
            # The job's worker threads are joined before the trail, the store and the
            # lock close (a cancelled checkpoint's save must not outlive the lock).
            self.order.append("threads joined")
            await joined()

        monkeypatch.setattr(_run_job, "_join_worker_threads", join)
        self._wrap(monkeypatch, MetricsFanout, "close", "metrics", lambda s: True)
        original = SimulatedAgentBackend.aclose

        async def aclose(backend: SimulatedAgentBackend) -> None:
            if backend is self.backend:
                self.order.append("backend")
            await original(backend)

        monkeypatch.setattr(SimulatedAgentBackend, "aclose", aclose)

    def _wrap(
        self,
        monkeypatch: pytest.MonkeyPatch,
        cls: type[Any],
        name: str,
        label: str,
        ours: Callable[[Any], bool],
    ) -> None:
        original = getattr(cls, name)

        def close(resource: Any) -> None:
            if ours(resource):
                self.order.append(label)
            original(resource)

        monkeypatch.setattr(cls, name, close)

    def components(self, config: RunConfig, data_plane: DataPlane) -> JobComponents[Any]:
        self.plane = data_plane
        parts = default_components(config, data_plane)
        self.backend = parts.backend
        return parts


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Closes]:
    closes = Closes(monkeypatch)
    # What the job must put back: the process's handler before it started (SIG_DFL alone,
    # or another library's: ray.init installs one, so an earlier Ray test leaves its own).
    closes.sigterm_before = signal.getsignal(signal.SIGTERM)
    closes.sigint_before = signal.getsignal(signal.SIGINT)
    yield closes


def _assert_all_closed(closes: Closes, out: Path, *, metrics: bool = True) -> None:
    opened = ["data plane", "trail", "threads joined", "backend"]
    opened += ["metrics"] if metrics else []
    # Each once, the last opened first. (A close may close what it wraps: a trail closes
    # its journal, the controller's deferred-deletion plane the store.)
    assert closes.order == list(reversed(opened))
    assert not RunDirectory(out).is_locked()
    assert signal.getsignal(signal.SIGTERM) is closes.sigterm_before
    held = {os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")}
    assert not [path for path in held if path.startswith(str(out.resolve()))]


class _Signals:
    """A progress sink that sends this process ``signals`` at the first trained step."""

    def __init__(self, *signals: signal.Signals) -> None:
        self._signals = list(signals)

    def start(self, total_steps: int, resumed_from: int | None) -> None:
        return None

    def update(self, **fields: Any) -> None:
        while self._signals:
            os.kill(os.getpid(), self._signals.pop(0))

    def log(self, message: str) -> None:
        return None


def test_a_finished_job_closes_everything_in_reverse_order(
    tmp_path: Path, fast_config: MakeConfig, closes: Closes
) -> None:
    out = tmp_path / "run"
    result = run_job(out, fast_config({"job": {"steps": 2}}), components=closes.components)
    assert result.summary.steps == 2
    _assert_all_closed(closes, out)


def test_a_drained_job_closes_everything_in_reverse_order(
    tmp_path: Path, fast_config: MakeConfig, closes: Closes
) -> None:
    out = tmp_path / "run"
    result = run_job(
        out,
        fast_config({"job": {"steps": 40}}),
        components=closes.components,
        progress=_Signals(signal.SIGTERM),
    )
    assert result.drained is not None
    _assert_all_closed(closes, out)


def test_a_job_cancelled_by_a_second_ctrl_c_closes_everything(
    tmp_path: Path, fast_config: MakeConfig, closes: Closes
) -> None:
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_job(
            out,
            fast_config({"job": {"steps": 40}}),
            components=closes.components,
            progress=_Signals(signal.SIGINT, signal.SIGINT),
        )
    _assert_all_closed(closes, out)
    assert signal.getsignal(signal.SIGINT) is closes.sigint_before


def test_a_job_whose_trainer_fails_closes_everything(
    tmp_path: Path, fast_config: MakeConfig, closes: Closes, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(self: NumpyGRPOTrainer, *args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("the trainer failed")

    monkeypatch.setattr(NumpyGRPOTrainer, "train_step", fail)
    out = tmp_path / "run"
    with pytest.raises(ZeroDivisionError, match="the trainer failed"):
        run_job(out, fast_config({"job": {"steps": 2}}), components=closes.components)
    _assert_all_closed(closes, out)


def test_a_refused_restore_closes_the_backend_too(
    tmp_path: Path, fast_config: MakeConfig, closes: Closes
) -> None:
    out = tmp_path / "run"
    config = fast_config({"job": {"steps": 2}})
    run_job(out, config)
    for checkpoint in CheckpointStore(out, keep=config.checkpoint.keep).committed():
        for name in SIDECAR_FILENAMES:
            if (checkpoint.directory / name).exists():
                (checkpoint.directory / name).write_bytes(b"torn")
    closes.order.clear()  # the first run's
    with pytest.raises(RunNotResumableError, match="can be restored"):
        run_job(out, config, components=closes.components)
    # Refused before the metrics sinks were opened: everything else is closed.
    _assert_all_closed(closes, out, metrics=False)


def test_ctrl_c_while_the_job_opens_interrupts_it_at_once_and_closes_what_was_opened(
    tmp_path: Path, fast_config: MakeConfig, closes: Closes
) -> None:
    """Opening is synchronous (servers, a Ray session block): a Ctrl-C then raises
    ``KeyboardInterrupt`` where the job is, as outside an event loop, rather than waiting
    for the first ``await`` of the job's loop."""
    went_on: list[bool] = []

    def components(config: RunConfig, data_plane: DataPlane) -> JobComponents[Any]:
        parts = closes.components(config, data_plane)
        os.kill(os.getpid(), signal.SIGINT)
        went_on.append(True)
        return parts

    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_job(out, fast_config({"job": {"steps": 2}}), components=components)
    assert went_on == []
    # The backend was built but not yet on the stack: the trail and the store are closed.
    assert closes.order == ["threads joined", "trail", "data plane"]
    assert not RunDirectory(out).is_locked()
    assert signal.getsignal(signal.SIGINT) is closes.sigint_before
