"""A SIGKILL while a sidecar is being written leaves the previous one intact (invariant 6).

A real child process rewrites one sidecar in a loop and announces each write; the parent
kills it at an announced point, then loads the file: it must be complete and valid, and be
the last finished write or the one in progress, never a torn mix.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_recovery.checkpoint import load_sidecar

CHILD = Path(__file__).with_name("crash_sidecar_writer.py")


def _run_until(path: Path, format: str, line: str) -> None:
    """Start the writer and SIGKILL it the moment it prints ``line``."""
    pause_at = line.split()[1] if line.startswith("mid-write") else "0"
    # Killed at "done N" or during write N ("start N"): the child holds after write N, so
    # a slow parent cannot let write N+1 finish first.
    hold_after = line.split()[1] if line.startswith(("done", "start")) else "0"
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(path), format, pause_at, hold_after],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    try:
        for output in child.stdout:
            if output.strip() == line:
                os.kill(child.pid, signal.SIGKILL)
                break
        else:
            pytest.fail(f"writer exited before printing {line!r}")
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        if child.stdin is not None:
            child.stdin.close()


@pytest.mark.parametrize("format", ["native", "pt"])
@pytest.mark.parametrize("kill_at", ["mid-write 1", "mid-write 4", "done 3", "start 5"])
def test_a_killed_writer_leaves_a_complete_sidecar(
    tmp_path: Path, format: str, kill_at: str
) -> None:
    path = tmp_path / "sidecar"
    _run_until(path, format, kill_at)
    number = int(kill_at.split()[1])
    if kill_at == "mid-write 1":
        # Killed inside the very first write: there is no previous sidecar, and no torn
        # file may stand in for one.
        assert not path.exists()
        return
    loaded = load_sidecar(path)  # complete and fully valid, or this raises
    written = loaded.parsed.batch_shortfall[0]
    if kill_at.startswith("done"):
        assert written == number
    elif kill_at.startswith("mid-write"):
        assert written == number - 1  # the write in progress never became visible
    else:
        # Killed during write N: the file is write N-1, or write N if it had finished.
        assert written in {number - 1, number}
    assert len(loaded.parsed.ledger_state["groups"]) == 400
