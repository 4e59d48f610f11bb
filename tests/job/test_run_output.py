"""What ``rollout-recovery run`` prints: one start line, and output that never stops
training (issue 15, items 7 and 24).

``rollout-recovery run ... | head -2`` used to stop training after one step with a
traceback from the progress display. The test does what ``head -2`` does with a real pipe:
it reads two lines and closes its end while the job still has lines to print (the job's
group is stopped while the test checks that and closes). The job must train to the end,
say once on stderr that its output is off, exit 0, and pass the audit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from rollout_recovery.history import audit_run

Cli = Callable[..., subprocess.CompletedProcess[str]]

STEPS = 20


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (a syscall in flight has returned)."""
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        # "pid (comm) S ...": the state follows the last ")".
        if stat.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
            return False
    return True


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_a_reader_that_goes_away_never_stops_training(
    tmp_path: Path, write_config: Callable[..., Path]
) -> None:
    out = tmp_path / "run"
    config = write_config({"job": {"steps": STEPS}})
    command = [sys.executable, "-m", "rollout_recovery", "run"]
    process = subprocess.Popen(
        [*command, "--out", str(out), "--config", str(config), "--plain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "200"},
        start_new_session=True,  # its own group: the watchdog and the cleanup reach it all
    )
    watchdog = threading.Timer(120, lambda: os.killpg(process.pid, signal.SIGKILL))
    watchdog.start()
    try:
        assert process.stdout is not None and process.stderr is not None
        head = [process.stdout.readline() for _ in range(2)]
        assert head[0] == b"starting 20 steps (step 0 to 19)\n", head
        # `head -2` exits here. Stop the job first, so the check below holds at the close:
        # it has steps (and the summary) left to print into a pipe nobody reads.
        os.killpg(process.pid, signal.SIGSTOP)
        while not _stopped(process.pid):
            os.sched_yield()
        assert _lines(out / "metrics.jsonl") < STEPS, "the job ended before the close"
        process.stdout.close()
        os.killpg(process.pid, signal.SIGCONT)
        stderr = process.stderr.read().decode()
        returncode = process.wait()
    finally:
        watchdog.cancel()
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stderr is not None:
            process.stderr.close()

    assert returncode == 0, stderr
    assert stderr.splitlines() == [
        "rollout-recovery: output closed (BrokenPipeError); the run goes on without printing "
        "progress"
    ]
    assert _lines(out / "metrics.jsonl") == STEPS
    report = audit_run(out)
    assert report.ok and report.complete, report.violations
    assert report.audited_through_step == STEPS


@pytest.mark.slow
def test_a_fresh_run_prints_one_start_line_and_a_resume_one_resume_line(
    tmp_path: Path, write_config: Callable[..., Path], run_cli_until: Cli, run_cli: Cli
) -> None:
    out = tmp_path / "run"
    # Long enough to be killed at step 3, not finished, on a loaded machine.
    args = ["--out", str(out), "--config", str(write_config({"job": {"steps": 20}})), "--plain"]
    killed = run_cli_until(args, stop=lambda line, lines: line.startswith("step 2 ("))
    assert killed.returncode == -signal.SIGKILL, killed.stdout
    resumed = run_cli(args)
    assert resumed.returncode == 0, resumed.stdout

    fresh = killed.stdout.splitlines()
    assert fresh[0] == "starting 20 steps (step 0 to 19)"
    assert [line for line in fresh if "start" in line] == ["starting 20 steps (step 0 to 19)"]
    assert not any("new run" in line for line in fresh)
    again = resumed.stdout.splitlines()
    assert not any(line.startswith("starting") or "new run" in line for line in again)
    assert len([line for line in again if line.startswith("resuming at step ")]) == 1
