"""A local Ray cluster for the ``ray`` tests, one per module (``ray.init(num_cpus=2)``).

Every test here needs the ``[ray]`` extra; without Ray installed they skip, so the
ordinary suite passes on a default install.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from cluster_support import layout  # noqa: E402

from rollout_recovery.cluster._sharded_plane import RayShardedDataPlane  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    ray.init(
        num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False
    )
    yield
    _KEEP.clear()
    ray.shutdown()


@pytest.fixture
def new_plane(tmp_path: Path, request: pytest.FixtureRequest) -> Callable[..., RayShardedDataPlane]:
    """``new_plane(shards=3)``: a driver-side plane on fresh files.

    Shard actors are reused from test to test (the n-th plane of every test adopts the
    same named actors and points them at its own files): starting actors costs about a
    second each on two cores, files cost nothing. The module's cluster ends them all.
    """
    counter = itertools.count()
    module = request.module.__name__

    def make(shards: int = 3) -> RayShardedDataPlane:
        n = next(counter)
        plane = RayShardedDataPlane.start(
            layout(tmp_path / f"shards-{n}", shards, prefix=f"{module}-{n}-{shards}")
        )
        # The driver-side handles own the actors: dropping the last one would end them.
        _KEEP.append(plane)
        return plane

    return make


_KEEP: list[RayShardedDataPlane] = []
