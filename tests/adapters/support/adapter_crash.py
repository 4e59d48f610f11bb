"""Kill a peer's process at an event it reports, and run it again: the adapter suites' crash.

The child runs in its own session and process group, so SIGKILL reaches everything it
started (a kill -9 of a Ray driver alone orphans its agents). It reports on stdout; the
parent reads line by line and kills when ``until`` holds for the lines so far: the signal
follows an observed event, never a sleep. A child that stops at the event blocks on its
stdin, which the parent holds open and never writes, so nothing happens between the event
and the kill.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ChildRun", "python_argv", "read_jsonl", "run_and_kill_at", "run_to_end"]


@dataclass(frozen=True, slots=True)
class ChildRun:
    """What a child printed (stdout and stderr interleaved) and how it ended."""

    output: str
    returncode: int

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


def _popen(argv: Sequence[str], env: Mapping[str, str] | None, cwd: Path | None) -> Any:
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=None if env is None else dict(env),
        cwd=cwd,
        start_new_session=True,
    )


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(process.pid, signal.SIGKILL)


def run_and_kill_at(
    argv: Sequence[str],
    until: Callable[[list[str]], bool],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ChildRun:
    """Run ``argv`` and SIGKILL its process group as soon as ``until(lines)`` is true.

    Fails (AssertionError with the child's output) if the child exits first.
    """
    process = _popen(argv, env, cwd)
    lines: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if until(lines):
                _kill_group(process)
                break
        else:
            process.wait()
            raise AssertionError(
                f"the child exited ({process.returncode}) before the event to kill it at:\n"
                + "\n".join(lines[-60:])
            )
        process.wait()
        lines.extend(line.rstrip("\n") for line in process.stdout)
    finally:
        # A failing or timed-out test must not leave the child (or its group) behind.
        if process.poll() is None:
            _kill_group(process)
            process.wait()
        # The child's descendants outlive it when it is killed; take the group down too.
        _kill_group(process)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
    return ChildRun("\n".join(lines), process.returncode)


def run_to_end(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ChildRun:
    """Run ``argv`` to its end in its own process group; fails if it does not exit 0."""
    process = _popen(argv, env, cwd)
    try:
        output, _ = process.communicate()
    finally:
        if process.poll() is None:
            _kill_group(process)
            process.wait()
        _kill_group(process)
    if process.returncode != 0:
        tail = "\n".join(output.splitlines()[-80:])
        raise AssertionError(f"{' '.join(argv)} exited {process.returncode}:\n{tail}")
    return ChildRun(output, process.returncode)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a JSON-lines log (a line cut by the kill is dropped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().splitlines(keepends=True):
        if line.endswith(b"\n"):
            out.append(json.loads(line))
    return out


def python_argv(script: Path, *args: str) -> list[str]:
    """``script`` run by this interpreter (the suite's venv), unbuffered."""
    return [sys.executable, "-u", str(script), *args]
