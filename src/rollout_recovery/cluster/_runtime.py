"""Joining a Ray cluster for one job: attach to ``address`` or start a local one."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import ray

__all__ = ["ray_session"]


@contextlib.contextmanager
def ray_session(address: str, num_cpus: int) -> Iterator[None]:
    """Attach to the cluster at ``address`` (``""``: start a local one with ``num_cpus``),
    unless this process already is a Ray driver; leave it as found."""
    if ray.is_initialized():
        yield
        return
    ray.init(
        address=address or None,
        num_cpus=None if address else num_cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()
