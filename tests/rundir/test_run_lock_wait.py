"""The run directory's lock as ``rollout-recovery stop`` reads it, and configured paths."""

from __future__ import annotations

import threading
from pathlib import Path

from rollout_recovery.rundir import RunDirectory


def test_wait_unlocked_returns_once_the_holder_lets_go(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with run.lock():
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(60)
        assert run.is_locked()
        assert run.wait_unlocked(timeout=0) is False
        waited: list[bool] = []
        waiter = threading.Thread(target=lambda: waited.append(run.wait_unlocked()))
        waiter.start()
        assert waited == []  # blocked in flock while the lock is held
        release.set()
        waiter.join(60)
        assert waited == [True]
    finally:
        release.set()
        holder.join(60)
    assert not run.is_locked()
    assert run.wait_unlocked(timeout=0) is True
    assert RunDirectory(tmp_path / "nowhere").wait_unlocked() is True


def test_a_configured_path_is_relative_to_the_run_directory_unless_absolute(
    tmp_path: Path,
) -> None:
    run = RunDirectory(tmp_path / "run")
    assert run.resolve("DRAIN") == tmp_path / "run" / "DRAIN"
    assert run.resolve("notices/drain") == tmp_path / "run" / "notices" / "drain"
    assert run.resolve("/var/run/preempt") == Path("/var/run/preempt")


def test_the_run_log_records_a_drain_with_its_reason(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    run.append_run_log("start", step=0)
    run.append_run_log("drain", step=4, checkpoint="step_000004", reason="SIGTERM")
    start, drain = run.read_run_log()
    assert (start.event, start.reason) == ("start", None)
    assert (drain.event, drain.step, drain.checkpoint, drain.reason) == (
        "drain",
        4,
        "step_000004",
        "SIGTERM",
    )
