"""Joining a Ray cluster for one job: attach to ``address`` or start a local one."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
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
    # ray.init installs its own SIGTERM handler in the driver and ray.shutdown leaves it:
    # the process's handlers are put back as they were (the main thread only can).
    restore = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
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
        if restore:
            for sig, handler in handlers.items():
                if handler is not None:  # None: a handler not set from Python
                    signal.signal(sig, handler)
