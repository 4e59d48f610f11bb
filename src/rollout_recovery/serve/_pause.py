"""Pausing generation between tokens, as vLLM's ``/pause?mode=keep`` and ``/resume`` do.

While the server is paused no request takes another token: a request in flight stops at
its next token boundary and keeps what it has generated; a new one waits before it
starts. ``/resume`` lets them all go on. A request that waited out a pause takes the
current weights again (the :class:`WeightStore`'s snapshot), so weights loaded while
paused generate the rest of every call in flight, and the reply's ``weight_versions``
spans say which tokens came from which version. A load without a pause never changes a
request in flight (each keeps its snapshot), unlike vLLM, which silently switches.
"""

from __future__ import annotations

import threading

from .._lifecycle import Resource

__all__ = ["PauseGate"]


class PauseGate(Resource):
    """The paused flag, and the count of resumes that tells a request its weights may be
    stale. Thread-safe; :meth:`close` releases every waiter for good (shutdown)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._paused = False
        self._closed = False
        self._resumes = 0

    @property
    def paused(self) -> bool:
        with self._changed:
            return self._paused

    @property
    def resumes(self) -> int:
        """How many pauses have ended so far."""
        with self._changed:
            return self._resumes

    def pause(self) -> None:
        with self._changed:
            self._paused = True

    def resume(self) -> None:
        with self._changed:
            if self._paused:
                self._paused = False
                self._resumes += 1
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait_running(self) -> tuple[int, bool]:
        """Wait until the server is not paused; ``(resumes so far, closed)``."""
        with self._changed:
            self._changed.wait_for(lambda: not self._paused or self._closed)
            return self._resumes, self._closed
