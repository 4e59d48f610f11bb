"""Time for code on an event loop: the loop's own clock, and a loop whose time is virtual.

asyncio's timers (``asyncio.timeout``, ``asyncio.sleep``, ``wait_for``, ``call_later``)
all read the running loop's clock, ``loop.time()``. Code that also measures a deadline
by hand (a wait that loops until ``no_server_wait_s`` has passed, a quarantine, a drain
grace) must read the same clock, or the two disagree on any loop whose clock is not the
wall's. So the event loop is the clock seam: :func:`monotonic` is the running loop's
clock (on an ordinary loop, ``time.monotonic()``), and a test that must control time runs
the code on a :class:`VirtualClockLoop` instead of adding slack for a loaded machine.

A :class:`VirtualClockLoop`'s clock starts at 0 and moves only

- when the test says so (:meth:`VirtualClockLoop.advance`), or
- with ``autojump=True``, when the loop has nothing to do (no callback ready, no I/O
  ready, no work in a thread it waits for): then it jumps to the next timer, so a 30 s
  deadline costs no wall time. While work in a thread is pending (``run_in_executor``,
  ``asyncio.to_thread``, or a future handed to :func:`off_loop`) it runs with the wall
  clock, so a deadline on that work still means what it says.

Autojump is for code whose I/O is in process (``httpx.MockTransport``, stores in
threads): a reply on a real socket may arrive after the clock has jumped past its
deadline. :func:`virtual_time` makes every loop ``asyncio.run`` creates a virtual one, for
code (``run_job``) that starts its own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

__all__ = ["VirtualClockLoop", "monotonic", "off_loop", "virtual_time"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


def monotonic() -> float:
    """The running event loop's clock, the one its timers and ``asyncio.timeout`` read."""
    return asyncio.get_running_loop().time()


def off_loop(future: asyncio.Future[Any]) -> None:
    """Say that ``future`` is resolved by work outside the loop (a thread of one's own):
    a virtual clock does not jump while it is pending. A no-op on any other loop."""
    loop = future.get_loop()
    if isinstance(loop, VirtualClockLoop):
        loop.hold(future)


class _JumpingSelector(selectors.BaseSelector):
    """The loop's selector: where the loop would block until its next timer, an idle
    virtual loop moves its clock there instead (see the module docstring)."""

    def __init__(self) -> None:
        self._inner = selectors.DefaultSelector()
        self.loop: VirtualClockLoop | None = None

    def register(
        self, fileobj: FileDescriptorLike, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: FileDescriptorLike) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(
        self, fileobj: FileDescriptorLike, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_map(self) -> Mapping[FileDescriptorLike, selectors.SelectorKey]:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self.loop
        # No timer due (None), or something is due now (0), or time moves by hand only.
        if loop is None or not loop.autojump or timeout is None or timeout <= 0:
            return self._inner.select(timeout)
        ready = self._inner.select(0)
        if ready:
            return ready
        if not loop.holding:
            loop.jump(timeout)  # idle: straight to the next timer
            return []
        # Work in a thread: the clock keeps the wall's pace until it reports back.
        started = time.monotonic()
        ready = self._inner.select(timeout)
        loop.jump(min(time.monotonic() - started, timeout))
        return ready


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock starts at 0 and moves by :meth:`advance`, or with
    ``autojump`` also by itself when the loop is idle (see the module docstring)."""

    def __init__(self, *, autojump: bool = False) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self.autojump = autojump
        self._now = 0.0
        self._held: set[asyncio.Future[Any]] = set()

    def time(self) -> float:
        return self._now

    @property
    def holding(self) -> bool:
        """Whether work outside the loop is pending (the clock may not jump)."""
        return bool(self._held)

    def jump(self, seconds: float) -> None:
        """Move the clock on without waking the loop (the selector's own move)."""
        self._now += seconds

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds``; timers now due run at the next loop turn."""
        self._now += seconds
        self.call_soon_threadsafe(lambda: None)  # wake the loop: a timer may be due now

    def hold(self, future: asyncio.Future[Any]) -> None:
        """Keep the clock from jumping until ``future`` is done."""
        self._held.add(future)
        future.add_done_callback(self._held.discard)

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*Ts], T], *args: *Ts
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self.hold(future)
        return future


@contextlib.contextmanager
def virtual_time(*, autojump: bool = True) -> Iterator[list[VirtualClockLoop]]:
    """Within, every loop a new ``asyncio.run`` makes is a :class:`VirtualClockLoop`;
    the list yielded collects them in order (their clocks say how long each ran)."""
    loops: list[VirtualClockLoop] = []

    class _Policy(asyncio.DefaultEventLoopPolicy):
        def new_event_loop(self) -> asyncio.AbstractEventLoop:
            loop = VirtualClockLoop(autojump=autojump)
            loops.append(loop)
            return loop

    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_Policy())
    try:
        yield loops
    finally:
        asyncio.set_event_loop_policy(previous)
