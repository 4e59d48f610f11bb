"""The clock seam (issue 16, item 5): the event loop's clock, virtual in tests.

Every test here bounds nothing in wall time: a virtual clock either reads exactly what
the timers say, or the test fails.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from rollout_recovery._clock import VirtualClockLoop, monotonic, off_loop, virtual_time


def _cpu_work() -> int:
    # Work a thread does for a while (however long it takes here), with no timer of its own.
    return sum(range(2_000_000))


def test_the_clock_is_the_running_loops() -> None:
    async def main() -> tuple[float, float]:
        return monotonic(), asyncio.get_running_loop().time()

    loop = VirtualClockLoop()
    try:
        loop.advance(12.5)
        assert loop.run_until_complete(main()) == (12.5, 12.5)
    finally:
        loop.close()


def test_a_manual_clock_moves_only_when_advanced() -> None:
    loop = VirtualClockLoop()

    async def main() -> list[str]:
        seen: list[str] = []
        sleeper = asyncio.create_task(asyncio.sleep(30.0))
        for _ in range(100):
            await asyncio.sleep(0)
        seen.append(f"done={sleeper.done()}")
        loop.advance(29.0)
        for _ in range(100):
            await asyncio.sleep(0)
        seen.append(f"done={sleeper.done()}")
        loop.advance(1.0)
        await sleeper
        seen.append(f"now={monotonic()}")
        return seen

    try:
        assert loop.run_until_complete(main()) == ["done=False", "done=False", "now=30.0"]
    finally:
        loop.close()


def test_an_idle_autojump_loop_goes_straight_to_its_next_timer() -> None:
    async def main() -> tuple[float, bool]:
        await asyncio.sleep(3600.0)
        try:
            async with asyncio.timeout(86_000.0):
                await asyncio.Event().wait()  # nothing will ever set it
        except TimeoutError:
            return monotonic(), True
        return monotonic(), False

    loop = VirtualClockLoop(autojump=True)
    try:
        assert loop.run_until_complete(main()) == (3600.0 + 86_000.0, True)
    finally:
        loop.close()


def test_the_clock_does_not_jump_while_a_thread_works_for_the_loop() -> None:
    """A deadline far beyond the work is not hit: the clock keeps the wall's pace while
    ``to_thread`` work is pending, instead of jumping to the deadline."""

    async def main() -> int:
        async with asyncio.timeout(3600.0):
            return await asyncio.to_thread(_cpu_work)

    loop = VirtualClockLoop(autojump=True)
    try:
        assert loop.run_until_complete(main()) == _cpu_work()
        # Wall pace: a few milliseconds at most (0.0 when the thread finished before the
        # loop next looked at its clock), never the deadline an idle loop would jump to.
        assert 0.0 <= loop.time() < 3600.0
    finally:
        loop.close()


def test_a_thread_of_ones_own_holds_the_clock_through_off_loop() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()

        def work() -> None:
            result = _cpu_work()
            loop.call_soon_threadsafe(future.set_result, result)

        off_loop(future)
        threading.Thread(target=work, daemon=True).start()
        async with asyncio.timeout(3600.0):
            return await future

    loop = VirtualClockLoop(autojump=True)
    try:
        assert loop.run_until_complete(main()) == _cpu_work()
        assert not loop.holding
    finally:
        loop.close()


def test_virtual_time_makes_asyncio_run_use_virtual_loops() -> None:
    async def main() -> float:
        await asyncio.sleep(7.0)
        return monotonic()

    with virtual_time() as loops:
        assert asyncio.run(main()) == 7.0
        assert asyncio.run(main()) == 7.0
    assert [loop.time() for loop in loops] == [7.0, 7.0]
    assert not isinstance(asyncio.new_event_loop(), VirtualClockLoop)


def test_off_loop_is_a_no_op_on_an_ordinary_loop() -> None:
    async def main() -> None:
        future = asyncio.get_running_loop().create_future()
        off_loop(future)
        future.set_result(None)
        await future

    asyncio.run(main())


@pytest.mark.parametrize("autojump", [False, True])
def test_io_still_wakes_a_virtual_loop(autojump: bool) -> None:
    """A callback from another thread (how to_thread reports back) wakes the loop even
    while it waits for a far timer."""

    async def main() -> str:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        loop.call_later(10_000.0, lambda: None)
        threading.Thread(
            target=lambda: loop.call_soon_threadsafe(future.set_result, "woken"), daemon=True
        ).start()
        return await future

    loop = VirtualClockLoop(autojump=autojump)
    try:
        assert loop.run_until_complete(main()) == "woken"
    finally:
        loop.close()
