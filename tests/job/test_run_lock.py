"""A second ``rollout-recovery run`` on a live run directory exits 2 naming the holder's
pid, before it writes anything (issue 15, item 1).

The first job runs in a child process group. Once it prints its second step, the test
stops the group (SIGSTOP), so the directory holds still, runs the second job on the same
directory, compares every byte and mtime of the directory before and after, and lets the
first job go on (SIGCONT). The first job then finishes and the audit passes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.history import audit_run

Cli = Callable[..., subprocess.CompletedProcess[str]]


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (a syscall in flight has returned)."""
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        # "pid (comm) S ...": the state follows the last ")".
        if stat.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
            return False
    return True


def wait_until_stopped(pid: int) -> None:
    # SIGSTOP takes effect as each thread returns to user space: a write or an fsync it was
    # in still completes. Only then does the directory hold still.
    while not _stopped(pid):
        os.sched_yield()


@pytest.mark.slow
def test_a_second_run_on_a_live_directory_exits_2_naming_the_pid_and_writes_nothing(
    tmp_path: Path,
    write_config: Callable[..., Path],
    run_cli_until: Cli,
    dir_snapshot: Callable[[Path], dict[str, Any]],
    read_jsonl: Callable[[Path], list[dict[str, Any]]],
) -> None:
    out = tmp_path / "run"
    # Long enough that it is still running when the test stops it at step 2.
    config = write_config({"job": {"steps": 30}})
    args = ["--out", str(out), "--config", str(config), "--plain"]
    second: dict[str, Any] = {}

    def meet_a_second_job(line: str, lines: list[str]) -> bool:
        if second or not line.startswith("step 1 ("):
            return False
        # The first job's pid, from its own start record (its group is run_cli_until's).
        (started,) = read_jsonl(out / "run_log.jsonl")
        pid = started["pid"]
        os.killpg(pid, signal.SIGSTOP)
        try:
            wait_until_stopped(pid)
            assert started["event"] == "start" and Path(f"/proc/{pid}").exists()
            before = dir_snapshot(out)
            refused = subprocess.run(
                [sys.executable, "-m", "rollout_recovery", "run", *args],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            second.update(pid=pid, refused=refused, unchanged=dir_snapshot(out) == before)
        finally:
            os.killpg(pid, signal.SIGCONT)
        return False  # the first job runs on to its end

    first = run_cli_until(args, stop=meet_a_second_job)

    refused: subprocess.CompletedProcess[str] = second["refused"]
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"is in use by another rollout-recovery job (pid {second['pid']})" in refused.stdout
    assert "Traceback" not in refused.stdout + refused.stderr
    assert "rerun the same command to resume" not in refused.stdout
    assert second["unchanged"], "the refused job changed the run directory"

    assert first.returncode == 0, first.stdout
    report = audit_run(out)
    assert report.ok and report.complete, report.violations
    # One job ran in the directory: one start, no resume.
    assert [(e["event"], e["pid"]) for e in read_jsonl(out / "run_log.jsonl")] == [
        ("start", second["pid"])
    ]
