"""The data-plane checkpoint barrier and the cut it hands out.

Every change to the ledger, the replay index or the data plane happens inside a *mutation*
section of one :class:`DataPlaneCheckpointBarrier`; a checkpoint takes the *exclusive* section,
so the data-plane snapshot, the replay index and the ledger sidecar it captures describe one
consistent cut. Mutation sections run concurrently with each other; a checkpoint excludes all
mutations and every other checkpoint, and checkpoints go in arrival order.

A section yields a :class:`DataPlaneMutationCut`: proof that the code holding it runs inside a
live section. Callees take the cut as an argument and call ``require_live()``; helpers that run
under a caller's section reuse that cut, because the barrier is deliberately not reentrant (a
nested section in one task would deadlock against a waiting checkpoint).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from ..errors import (
    BarrierNestingError,
    BarrierTimeoutError,
    DeadCutError,
    InvalidArgumentError,
    UnknownMutationKindError,
)

__all__ = [
    "CHECKPOINT_MUTATION_KINDS",
    "DataPlaneCheckpointBarrier",
    "DataPlaneCheckpointBarrierTelemetry",
    "DataPlaneMutationCut",
    "UnknownMutationKindError",
]

CHECKPOINT_MUTATION_KINDS: Final[tuple[str, ...]] = (
    "advantage_writeback",
    "group_commits",
    "group_removals",
    "other",
    "prompt_reservations",
    "recovery_restore",
    "recovery_retries",
    "sample_clears",
    "sibling_seals",
)

# Bounded so a long run of blocked mutations between two drains cannot grow memory.
WAIT_DURATION_SAMPLES: Final = 10_000

_DEAD_CUT = "data-plane mutation cut is no longer active"
_NO_TASK = "data-plane barrier sections require an asyncio task"
_NESTED = (
    "this task already holds a data-plane barrier section; pass the DataPlaneMutationCut "
    "you already have instead of opening another"
)


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
        raise InvalidArgumentError(
            f"timeout must be a positive number of seconds or None, got {timeout!r}"
        )


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else asyncio.get_running_loop().time() + timeout


def _as_barrier_timeout(error: BaseException, timeout: float | None) -> BaseException:
    """A TimeoutError of our own deadline becomes the project error; anything else stays."""
    if isinstance(error, TimeoutError) and timeout is not None:
        return BarrierTimeoutError(section="checkpoint", kind=None, timeout=timeout)
    return error


class DataPlaneMutationCut:
    """Capability proving that its holder runs inside a live barrier section.

    Only the barrier creates cuts. A cut is live from the moment its section is entered until
    the ``async with`` block exits, however it exits. ``require_live()`` checks nothing else:
    not the task (a cut may be handed to helper tasks) and not which barrier a callee uses.
    """

    __slots__ = ("_barrier", "_live")

    def __init__(self, barrier: DataPlaneCheckpointBarrier) -> None:
        self._barrier = barrier
        self._live = True

    @property
    def barrier(self) -> DataPlaneCheckpointBarrier:
        """The barrier whose section produced this cut."""
        return self._barrier

    @property
    def is_live(self) -> bool:
        """Whether the section that produced this cut is still open."""
        return self._live

    def require_live(self) -> None:
        """Raise :class:`DeadCutError` if the cut's section has exited."""
        if not self._live:
            raise DeadCutError(_DEAD_CUT)

    def __repr__(self) -> str:
        return f"DataPlaneMutationCut(live={self._live})"


@dataclass(frozen=True, slots=True, kw_only=True)
class DataPlaneCheckpointBarrierTelemetry:
    """What :meth:`DataPlaneCheckpointBarrier.drain_telemetry` saw since the previous drain.

    ``blocked_by_kind``, ``wait_durations_s`` and ``max_waiting_mutations`` cover the interval;
    ``active_mutations``, ``waiting_mutations`` and ``checkpoint_active`` are gauges at drain
    time. Both containers are fresh copies owned by the caller.
    """

    blocked_by_kind: Mapping[str, int]
    wait_durations_s: tuple[float, ...]
    active_mutations: int
    waiting_mutations: int
    max_waiting_mutations: int
    checkpoint_active: bool


class DataPlaneCheckpointBarrier:
    """Readers-writer barrier for one event loop: shared mutations, exclusive checkpoints.

    Writer preference: once a checkpoint has arrived, mutations that arrive after it wait until
    it has finished, so a steady stream of mutations cannot starve checkpoints. Checkpoints are
    served in arrival order. Sections do not nest within one task, in any combination.
    """

    #: The mutation kinds :meth:`mutation` accepts, and what :meth:`drain_telemetry`
    #: reports (the package root re-exports both under their seed names).
    MUTATION_KINDS: ClassVar[tuple[str, ...]] = CHECKPOINT_MUTATION_KINDS
    Telemetry: ClassVar[type[DataPlaneCheckpointBarrierTelemetry]]

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        # Checkpoints that arrived but do not yet own the writer slot, oldest first.
        self._checkpoint_queue: deque[object] = deque()
        # A checkpoint owns the writer slot: it is draining mutations or holds its section.
        self._checkpoint_active = False
        self._active_mutations = 0
        self._holders: set[asyncio.Task[Any]] = set()
        self._mutation_version = 0
        # Tasks inside ``Condition.wait_for``; lets section exits skip waking nobody.
        self._sleepers = 0
        self._notifiers: set[asyncio.Task[None]] = set()
        self._waiting_mutations = 0
        self._max_waiting_mutations = 0
        self._blocked_by_kind: Counter[str] = Counter()
        self._wait_durations_s: deque[float] = deque(maxlen=WAIT_DURATION_SAMPLES)

    # -- public surface ---------------------------------------------------------------------

    @property
    def mutation_version(self) -> int:
        """Number of mutation sections that have finished, including those whose body raised.

        A body that raised may have applied part of its change, so it counts: a redundant
        snapshot is safe, skipping a partially applied mutation is not.
        """
        return self._mutation_version

    @property
    def active_mutations(self) -> int:
        """Mutation sections currently open."""
        return self._active_mutations

    @property
    def waiting_mutations(self) -> int:
        """Mutation sections currently blocked by a checkpoint."""
        return self._waiting_mutations

    @property
    def waiting_checkpoints(self) -> int:
        """Checkpoints that arrived and wait behind another checkpoint."""
        return len(self._checkpoint_queue)

    @property
    def checkpoint_active(self) -> bool:
        """A checkpoint owns the exclusive slot (draining mutations or inside its section)."""
        return self._checkpoint_active

    def mutation(
        self, kind: str = "other", *, timeout: float | None = None
    ) -> AbstractAsyncContextManager[DataPlaneMutationCut]:
        """Open a shared mutation section; ``kind`` labels it for telemetry.

        Raises :class:`UnknownMutationKindError` (a ``ValueError``) at call time for a kind
        outside :data:`CHECKPOINT_MUTATION_KINDS`, and :class:`BarrierNestingError` on entry
        when the current task already holds a section or there is no current task.
        ``timeout`` bounds the wait to enter (not the body): past it,
        :class:`BarrierTimeoutError` is raised and nothing is held.
        """
        if kind not in CHECKPOINT_MUTATION_KINDS:
            raise UnknownMutationKindError(
                f"unknown checkpoint mutation kind {kind!r}; "
                f"expected one of {CHECKPOINT_MUTATION_KINDS}"
            )
        _check_timeout(timeout)
        return self._mutation_section(kind, timeout)

    def checkpoint(
        self, *, timeout: float | None = None
    ) -> AbstractAsyncContextManager[DataPlaneMutationCut]:
        """Open the exclusive checkpoint section once every earlier checkpoint has finished
        and every open mutation section has exited.

        The yielded cut may also guard ledger mutations made while checkpointing.
        ``timeout`` bounds the wait to enter: a mutation that never exits must not hang a
        checkpoint forever. Past it, :class:`BarrierTimeoutError` is raised, the checkpoint
        leaves the queue and mutations flow again.
        """
        _check_timeout(timeout)
        return self._checkpoint_section(timeout)

    def drain_telemetry(self) -> DataPlaneCheckpointBarrierTelemetry:
        """Report mutations blocked by checkpoints since the last drain and reset the interval."""
        report = DataPlaneCheckpointBarrierTelemetry(
            blocked_by_kind=dict(self._blocked_by_kind),
            wait_durations_s=tuple(self._wait_durations_s),
            active_mutations=self._active_mutations,
            waiting_mutations=self._waiting_mutations,
            max_waiting_mutations=self._max_waiting_mutations,
            checkpoint_active=self._checkpoint_active,
        )
        self._blocked_by_kind.clear()
        self._wait_durations_s.clear()
        # Mutations still waiting belong to the next interval's high-water mark as well.
        self._max_waiting_mutations = self._waiting_mutations
        return report

    # -- sections ---------------------------------------------------------------------------

    @asynccontextmanager
    async def _mutation_section(
        self, kind: str, timeout: float | None
    ) -> AsyncIterator[DataPlaneMutationCut]:
        task = self._task_free_of_sections()
        deadline = _deadline(timeout)
        async with self._cond:
            if not self._mutations_admitted():
                try:
                    await self._wait_behind_checkpoint(kind, deadline)
                except TimeoutError:
                    assert timeout is not None
                    raise BarrierTimeoutError(
                        section="mutation", kind=kind, timeout=timeout
                    ) from None
            self._active_mutations += 1
            self._holders.add(task)
        cut = DataPlaneMutationCut(self)
        try:
            yield cut
        finally:
            # Synchronous on purpose: a second cancellation cannot interrupt the bookkeeping.
            cut._live = False
            self._holders.discard(task)
            self._active_mutations -= 1
            self._mutation_version += 1
            if self._active_mutations == 0:
                self._wake_sleepers()

    @asynccontextmanager
    async def _checkpoint_section(
        self, timeout: float | None
    ) -> AsyncIterator[DataPlaneMutationCut]:
        task = self._task_free_of_sections()
        ticket = object()
        deadline = _deadline(timeout)
        async with self._cond:
            # Queue first: from here on, newly arriving mutations wait behind this checkpoint.
            self._checkpoint_queue.append(ticket)
            try:
                await self._sleep_until(
                    lambda: not self._checkpoint_active and self._checkpoint_queue[0] is ticket,
                    deadline,
                )
                self._checkpoint_queue.popleft()
                self._checkpoint_active = True
            except BaseException as error:
                self._checkpoint_queue.remove(ticket)
                # Mutations queued only behind us, and the next checkpoint, may now proceed.
                self._cond.notify_all()
                raise _as_barrier_timeout(error, timeout) from None
            try:
                await self._sleep_until(lambda: self._active_mutations == 0, deadline)
            except BaseException as error:
                self._checkpoint_active = False
                self._cond.notify_all()
                raise _as_barrier_timeout(error, timeout) from None
            self._holders.add(task)
        cut = DataPlaneMutationCut(self)
        try:
            yield cut
        finally:
            cut._live = False
            self._holders.discard(task)
            self._checkpoint_active = False
            self._wake_sleepers()

    # -- helpers ----------------------------------------------------------------------------

    def _task_free_of_sections(self) -> asyncio.Task[Any]:
        # Checked before any state changes, so a refused nesting attempt leaves nothing behind.
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running event loop at all
            task = None
        if task is None:
            raise BarrierNestingError(_NO_TASK)
        if task in self._holders:
            raise BarrierNestingError(_NESTED)
        return task

    def _mutations_admitted(self) -> bool:
        return not self._checkpoint_active and not self._checkpoint_queue

    async def _wait_behind_checkpoint(self, kind: str, deadline: float | None) -> None:
        self._waiting_mutations += 1
        self._max_waiting_mutations = max(self._max_waiting_mutations, self._waiting_mutations)
        started = time.monotonic()
        try:
            await self._sleep_until(self._mutations_admitted, deadline)
        finally:
            # Counted when the wait ends (entered or cancelled), so each blocked mutation has
            # exactly one duration sample next to its kind count.
            self._waiting_mutations -= 1
            self._blocked_by_kind[kind] += 1
            self._wait_durations_s.append(time.monotonic() - started)

    async def _sleep_until(self, predicate: Callable[[], bool], deadline: float | None) -> None:
        """Wait on the condition until ``predicate`` holds; TimeoutError past ``deadline``.

        A timed-out wait is a cancelled condition wait, which re-acquires the lock before
        it propagates, so callers clean up exactly as for a cancellation.
        """
        if predicate():
            return
        self._sleepers += 1
        try:
            if deadline is None:
                await self._cond.wait_for(predicate)
            else:
                # timeout_at, not wait_for: it waits in this task. On Python 3.11,
                # wait_for's child task can finish just as the caller is cancelled and
                # then drop the cancellation, so a cancelled checkpoint would still run.
                async with asyncio.timeout_at(deadline):
                    await self._cond.wait_for(predicate)
        finally:
            self._sleepers -= 1

    def _wake_sleepers(self) -> None:
        # Section exits run in ``finally`` blocks, where awaiting the condition lock could be
        # cancelled a second time and strand the waiters. The state is already updated
        # synchronously (new arrivals see it at once); a separate task delivers the wake-up.
        if self._sleepers == 0:
            return
        notifier = asyncio.get_running_loop().create_task(self._notify_all())
        self._notifiers.add(notifier)
        notifier.add_done_callback(self._notifiers.discard)

    async def _notify_all(self) -> None:
        async with self._cond:
            self._cond.notify_all()


DataPlaneCheckpointBarrier.Telemetry = DataPlaneCheckpointBarrierTelemetry
