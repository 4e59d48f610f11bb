"""A real ``rollout-recovery serve`` for job tests: one helper instead of a copy per file."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from process_support import process_group

SERVE = [sys.executable, "-m", "rollout_recovery", "serve"]


@contextlib.contextmanager
def running_serve(log: Path, *args: str, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """``rollout-recovery serve --port 0 ARGS`` in its own process group, its stderr in
    ``log``; yields its URL once it listens, and SIGKILLs the group on the way out."""
    with serve_process(log, *args, env=env) as (url, _pid):
        yield url


@contextlib.contextmanager
def serve_process(
    log: Path, *args: str, env: Mapping[str, str] | None = None
) -> Iterator[tuple[str, int]]:
    """As :func:`running_serve`, yielding the server's URL and pid."""
    with (
        open(log, "wb") as handle,
        process_group([*SERVE, "--port", "0", *args], stderr=handle, env=env, text=True) as process,
    ):
        assert process.stdout is not None
        line = process.stdout.readline()  # "serving on URL", once it listens
        assert line.startswith("serving on "), log.read_text()
        yield line.split()[-1], process.pid
