"""Memory a background checkpoint copies the trainer's tensors into, kept and reused.

Why: a capture used to clone the AdamW moments (8 bytes per parameter: 1.07 GB for
SmolLM2-135M) into fresh memory, and the kernel zeroed and mapped every page of it again
at every checkpoint, inside the step. Copying into the same buffers each time skips that:
the step pays the copy alone (``benchmarks/bench_checkpoint_async.py --micro``).

Reuse is safe only once the previous copy has been read, so the buffers are leased: a
:meth:`StagingBuffers.stage` hands out a :class:`StagedTensors` and refuses another stage
until that one has been read through (:meth:`StagedTensors.read` returned) or dropped. A
read after a later stage refuses too. One lock orders the copy and the reads, so a read
never sees a copy half done. The controller never meets a refusal: it awaits the previous
checkpoint's write (which reads its copy first) before it captures the next one.

The cost: the buffers stay allocated from the first stage for the trainer's lifetime,
instead of only while a write is in flight.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from ..errors import InvalidOperationError, InvalidStateError

__all__ = ["StagedTensors", "StagingBuffers"]

_T = TypeVar("_T")


class StagedTensors:
    """One stage's copy, readable until the buffers are staged into again."""

    def __init__(
        self, owner: StagingBuffers, generation: int, tensors: dict[str, torch.Tensor]
    ) -> None:
        self._owner = owner
        self._generation = generation
        self._tensors = tensors

    def read(self, use: Callable[[Mapping[str, torch.Tensor]], _T]) -> _T:
        """``use(tensors)`` on the copy, from any thread; may be called again until the
        next stage. ``use`` must not keep the tensors: the next stage overwrites them."""
        owner = self._owner
        with owner.lock:
            if owner.generation != self._generation:
                raise InvalidStateError(
                    "the trainer's staged state was overwritten by a later checkpoint's "
                    "capture before this checkpoint encoded it: capture the next checkpoint "
                    "only after the previous one's write has finished"
                )
            result = use(self._tensors)
            owner.leased = False
        return result


class StagingBuffers:
    """Named buffers reused by every :meth:`stage`; at most one stage leased at a time."""

    def __init__(self) -> None:
        # Reentrant: a dropped stage's finalizer may run in a thread already holding it.
        self.lock = threading.RLock()
        self.generation = 0
        #: A stage handed out and neither read through nor dropped yet.
        self.leased = False
        self._buffers: dict[str, torch.Tensor] = {}

    def stage(
        self,
        tensors: Mapping[str, torch.Tensor],
        *,
        reserve: Mapping[str, torch.Tensor] | None = None,
    ) -> StagedTensors:
        """Copy ``tensors`` into the buffers (allocated on first use or a change of shape or
        dtype) and lease them. ``reserve``: tensors shaped like ones a later stage will
        copy (AdamW's moments before its first step), allocated and touched now so that
        stage does not pay for fresh pages. Refuses (``InvalidOperationError``, nothing
        copied) while the previous stage is leased."""
        with self.lock:
            if self.leased:
                raise InvalidOperationError(
                    "the trainer's state is already staged for a checkpoint that has not "
                    "encoded it yet: await the previous checkpoint's write before capturing "
                    "another"
                )
            self.generation += 1
            generation = self.generation
            wanted = {**(reserve or {}), **tensors}
            for name in set(self._buffers) - set(wanted):
                del self._buffers[name]
            for name, like in wanted.items():
                buffer = self._buffers.get(name)
                if buffer is None or buffer.shape != like.shape or buffer.dtype != like.dtype:
                    # zeros, not empty: the pages are touched here, not by a later copy.
                    self._buffers[name] = torch.zeros(like.shape, dtype=like.dtype)
            with torch.no_grad():
                for name, tensor in tensors.items():
                    self._buffers[name].copy_(tensor)
            staged = StagedTensors(
                self, generation, {name: self._buffers[name] for name in tensors}
            )
            self.leased = True
        # A stage dropped unread (a write that failed before encoding) frees the lease.
        weakref.finalize(staged, self._dropped, generation)
        return staged

    def _dropped(self, generation: int) -> None:
        with self.lock:
            if self.generation == generation:
                self.leased = False
