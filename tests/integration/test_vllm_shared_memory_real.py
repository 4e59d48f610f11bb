"""A real vLLM server's ``/dev/shm/psm_*`` segments after its guard or its job ends it.

vLLM's shm_broadcast message queues are ``multiprocessing.shared_memory`` segments; their
creator unlinks them when it exits cleanly. Measured (tiny model, 2 cores): a SIGTERM of
the API server ends the whole group within a second with no segment left; a SIGKILL of
the group leaves every one. The guard ends its server with a SIGTERM first, so vLLM
removes them itself; the job SIGKILLs a guard's group that outlived its grace, and then
removes them itself (``_guard.kill_group``). One server each (~45 s to start).
Skips without ``ROLLOUT_RECOVERY_VLLM_PYTHON`` / ``ROLLOUT_RECOVERY_VLLM_MODEL``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rollout_recovery.vllm._guard import Segment, group_segments, kill_group

if TYPE_CHECKING:  # conftest is not importable by name at run time (several exist)
    from conftest import VllmServer, VllmServerFactory

pytestmark = pytest.mark.vllm


def _paths(segments: set[Segment]) -> list[str]:
    return sorted(path for path, _, _ in segments)


def _left(segments: set[Segment]) -> list[str]:
    return [path for path in _paths(segments) if Path(path).exists()]


def _guarded(factory: VllmServerFactory) -> tuple[VllmServer, set[Segment]]:
    """A ready server under its guard, and the segments its group maps."""
    server = factory(guarded=True)
    segments = group_segments(server.pgid)
    assert segments, "the server maps no /dev/shm/psm_ segment: nothing to check"
    return server, segments


def test_a_guard_ends_its_server_with_a_sigterm_and_vllm_removes_its_segments(
    vllm_server_factory: VllmServerFactory,
) -> None:
    server, segments = _guarded(vllm_server_factory)
    os.kill(server.pgid, signal.SIGTERM)  # the guard: the job stopping its servers
    assert server.process.wait(timeout=60) == 0
    assert _left(segments) == []
    server.kill()


def test_a_group_the_job_sigkills_leaves_no_segments(
    vllm_server_factory: VllmServerFactory,
) -> None:
    server, segments = _guarded(vllm_server_factory)
    assert sorted(kill_group(server.pgid)) == _paths(segments)
    server.process.wait()
    assert _left(segments) == []
    server.kill()
