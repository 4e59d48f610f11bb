"""The trainer's state copied to memory inside a checkpoint's step, encoded as files after.

Why: encoding a real model's weights and AdamW moments takes seconds (3.5 s for SmolLM2's
1.6 GB of fp32 tensors), and the trainer may not train while its state is read. So a
checkpoint's step only copies the state (the trainer is idle: the train pump awaits the
capture), and the encoding runs later, in a worker thread, while the next steps train.

What the copy is, by trainer:

- one with ``staged_state_files()`` (the torch trainer): its own copy (the weights
  snapshot and AdamW's moments in staging buffers it reuses, ``llm/_staging.py``),
  encoded by the function it returns into the files ``state_files()`` would have
  returned; it allows one such copy at a time, so the next capture must follow the
  previous commit's encoding (the controller awaits the previous write first);
- another ``policy.FileStateTrainer``: its ``state_files()`` bytes, taken now (the step
  pays the encoding: such a trainer has no cheaper exact copy to offer);
- any other trainer: ``state()``'s arrays, copied (they may be views of live ones), saved
  as ``policy.npz`` later.

The memory it costs: one more copy of the trainer's state, from the capture until the
checkpoint's files are encoded; the torch trainer keeps its staging buffers between
checkpoints (``docs/reliability.md``, "Background checkpoints").
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ..policy import FileStateTrainer, Trainer
from ..rundir import CheckpointStore

__all__ = ["StagedTrainerState", "stage_trainer_state"]

_FILES = CheckpointStore.FILES


@runtime_checkable
class _StagesStateFiles(Protocol):
    """A ``FileStateTrainer`` that copies its state first and encodes it when asked:
    ``staged_state_files()`` returns a function, callable from any thread while the
    trainer trains on, giving the files ``state_files()`` gave at the call. It may refuse
    a call while the previous call's function has not been called yet (the torch
    trainer's reused buffers hold one copy at a time)."""

    def staged_state_files(self) -> Callable[[], dict[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class StagedTrainerState:
    """The trainer's state at one checkpoint's capture, held in memory."""

    #: The weight version the trainer held (what the checkpoint's snapshot must be at).
    weight_version: int
    #: The checkpoint files of the state (``trainer.<name>`` or ``policy.npz``); encodes
    #: from the copy, in any thread, however the trainer has moved on.
    encode: Callable[[], dict[str, bytes]]


async def stage_trainer_state(trainer: Trainer[Any]) -> StagedTrainerState:
    """Copy ``trainer``'s state to memory; call with the trainer idle. The copy runs in a
    worker thread (a large model's takes a while), the event loop serving meanwhile."""
    version = trainer.weight_version
    if isinstance(trainer, _StagesStateFiles):
        own_later = await asyncio.to_thread(trainer.staged_state_files)
        return StagedTrainerState(version, lambda: _as_trainer_files(own_later()))
    if isinstance(trainer, FileStateTrainer):
        own = _as_trainer_files(await asyncio.to_thread(trainer.state_files))
        return StagedTrainerState(version, lambda: own)
    arrays = {name: np.array(value, copy=True) for name, value in trainer.state().items()}
    return StagedTrainerState(version, lambda: {_FILES.trainer_state: _npz_bytes(arrays)})


def _as_trainer_files(own: Mapping[str, bytes]) -> dict[str, bytes]:
    return {_FILES.trainer_file(name): bytes(data) for name, data in own.items()}


def _npz_bytes(arrays: Mapping[str, npt.NDArray[Any]]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()
