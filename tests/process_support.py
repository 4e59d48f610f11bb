"""Processes a test starts and watches: a process group killed on the way out, a job in a
child Python, and whether a pid lives."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process (Linux ``/proc``)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@contextlib.contextmanager
def process_group(
    command: Sequence[str],
    *,
    stderr: IO[Any] | int | None = None,
    env: Mapping[str, str] | None = None,
    text: bool = False,
) -> Iterator[subprocess.Popen[Any]]:
    """``command`` in its own session (so its group is its own), its stdout a pipe;
    SIGKILLs the group on the way out and reaps it."""
    process = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=text,
        env=None if env is None else dict(env),
        start_new_session=True,
    )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


@contextlib.contextmanager
def ready_job(code: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python -c CODE ARGS`` with this test's import path (:func:`process_group`),
    yielded once it printed ``ready``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with process_group([sys.executable, "-c", code, *args], env=env) as job:
        assert job.stdout is not None
        assert job.stdout.readline() == b"ready\n"
        yield job
