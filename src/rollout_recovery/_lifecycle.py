"""One lifecycle for every resource: ``async with`` opens nothing and closes it on the way out.

Every object that holds something to give back (a connection, a thread, a process, a file, an
actor) derives from one of two bases, so a composition root can stack any mix of them in one
``contextlib.AsyncExitStack`` and close them in reverse order, error or not:

- :class:`AsyncResource`: the one verb is ``await aclose()`` (backends, pools, fleets).
- :class:`Resource`: the one verb is ``close()``, for resources that sync code also uses
  (a CLI command reading a data plane); it is an :class:`AsyncResource` too, so ``async with``
  works the same, and ``with`` works as well.

Closing twice is a no-op in every implementation; that is part of the contract, because an exit
stack and an error path may both reach the same resource.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["AsyncResource", "Resource"]


class AsyncResource:
    """A resource closed by ``await aclose()``; ``async with`` returns it and closes it."""

    __slots__ = ()

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


class Resource(AsyncResource):
    """A resource closed by ``close()``: ``with`` in sync code, ``async with`` in async code."""

    __slots__ = ()

    def close(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        # Closing is quick and thread-bound (sqlite connections, file handles): run it here
        # rather than in a worker thread, which a sqlite connection would refuse.
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
