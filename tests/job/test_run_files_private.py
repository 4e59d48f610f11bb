"""A run's files hold prompts, rewards and server names: nobody but their owner reads them
(issue 15, item 18), whatever the umask.

The run directory itself is made owner-only (so nothing under it, the SQLite store and
the checkpoint directories included, is reachable by anyone else), and the files the job
writes itself are created owner-only too.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollout_recovery.control import RunConfig
from rollout_recovery.job import run_job


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def test_a_run_is_private_to_its_owner_even_under_umask_0(
    tmp_path: Path, fast_config: Callable[..., RunConfig], permissive_umask: None
) -> None:
    out = tmp_path / "run"
    run_job(out, fast_config({"job": {"steps": 2}}))

    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for name in ("job.toml", "events.jsonl", "metrics.jsonl", "run_log.jsonl", ".lock"):
        mode = stat.S_IMODE((out / name).stat().st_mode)
        assert mode & 0o077 == 0, f"{name} is {oct(mode)}"
