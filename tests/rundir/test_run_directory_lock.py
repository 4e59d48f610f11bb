"""The run directory's lock: one live job per directory, a second one refused at once.

The holder is a real second process (a ``flock`` is per open file, so only another
process shows what another job would meet); it takes the lock, says so on stdout and
waits on stdin, so the test acts on what it printed, never on sleeps.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_recovery.errors import RunDirectoryLockedError
from rollout_recovery.rundir import RunDirectory

HOLDER = """
import sys
from rollout_recovery.rundir import RunDirectory
with RunDirectory(sys.argv[1]).lock():
    print("locked", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def holding(root: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process holding ``root``'s lock until the block ends (or it is killed)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "locked\n"
        yield process
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError):
                    stream.close()


def test_a_second_holder_is_refused_naming_the_pid_and_writes_nothing(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    with holding(run.root) as holder:
        assert run.lock_holder() == holder.pid
        assert run.is_locked()
        before = run.lock_file.read_bytes(), run.lock_file.stat().st_mtime_ns

        with pytest.raises(RunDirectoryLockedError) as caught, run.lock():
            pytest.fail("the lock was taken twice")

        error = caught.value
        assert error.pid == holder.pid
        assert f"(pid {holder.pid})" in str(error)
        assert error.directory == str(run.root)
        assert error.rerun_resumes is False
        # The holder's pid is still what the file says: the refused call wrote nothing.
        assert (run.lock_file.read_bytes(), run.lock_file.stat().st_mtime_ns) == before
        assert sorted(p.name for p in run.root.iterdir()) == [".lock"]


def test_the_lock_dies_with_its_holder_even_by_sigkill(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    with holding(run.root) as holder:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        # The dead job's pid is still in the file; the kernel dropped its lock.
        assert run.lock_holder() == holder.pid
        assert not run.is_locked()
        with run.lock():
            assert run.lock_holder() == os.getpid()
            assert run.is_locked()  # seen from another open file description
    assert not run.is_locked()


def test_a_released_lock_is_taken_by_the_next_job(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    with run.lock():
        pass
    with run.lock():
        assert run.lock_holder() == os.getpid()
