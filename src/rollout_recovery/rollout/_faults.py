"""Injected faults of the simulated environment: a decorator around a worker's model client.

The episode knows nothing of faults: :class:`FaultInjectingClient` wraps the model client
of one attempt on one simulated worker and acts on its calls. Which faults an attempt
suffers is drawn once, before its first call (:func:`draw_faults`: a fixed number of
uniform draws in a fixed order, so changing one rate never reshuffles the others, the
latencies or the sampled tokens). When several are drawn, the first in this list wins
among the ones that exclude each other:

- ``worker_crash``: at its second call the attempt crashes its worker. Every attempt in
  flight on that worker, itself included, fails at once (its client raises
  ``GenerationError("worker_crashed")``, which the episode returns as the attempt's
  ``AttemptFailure``); the worker is down for ``worker_restart_s``.
- ``attempt_failed``: at its second call the attempt fails with ``attempt_failed``,
  leaving its first call staged and referenced by no receipt (the next attempt of the
  sibling may continue it).
- ``hang``: at its second call the attempt waits forever (only its worker's crash or the
  controller's cancellation ends it).
- ``capture_failure``: the second call's reply is not captured: the attempt ends sealed as
  failed, its receipt poisoned (:data:`CAPTURE_FAILURE_REASON`).
- ``tamper``: after the episode, its last staged row is overwritten with altered tokens and
  identical metadata, so only the digest check at finalization can notice.
- ``straggler``: independent of the others; every call's reply comes ``straggler_factor``
  times later.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .._outcomes import FailureReason
from ..capture import CaptureWriter
from ..dataplane import DataPlane, Row
from ..errors import GenerationError
from ._config import FaultsConfig
from ._episode import CallFailed, Completion, ModelClient, Sampling
from ._protocol import AttemptResult

__all__ = [
    "CAPTURE_FAILURE_REASON",
    "FAULT_NAMES",
    "FaultInjectingClient",
    "WorkerClient",
    "draw_faults",
]

# The CaptureFailure reason of a reply that was not captured; it poisons the receipt.
CAPTURE_FAILURE_REASON = "staging_write_failed"

# Fault counters, in the order their uniform draws are taken from an attempt's generator.
FAULT_NAMES = (
    "straggler",
    "worker_crash",
    "attempt_failed",
    "hang",
    "capture_failure",
    "tamper",
)


def draw_faults(rng: np.random.Generator, faults: FaultsConfig) -> frozenset[str]:
    """The faults one attempt suffers: one uniform draw per fault, in :data:`FAULT_NAMES`
    order, whatever the rates."""
    uniforms = rng.random(len(FAULT_NAMES))
    rates = {
        "straggler": faults.straggler_rate,
        "worker_crash": faults.worker_crash_rate,
        "attempt_failed": faults.attempt_failure_rate,
        "hang": faults.hang_rate,
        "capture_failure": faults.capture_failure_rate,
        "tamper": faults.tamper_rate,
    }
    return frozenset(name for name, u in zip(FAULT_NAMES, uniforms, strict=True) if u < rates[name])


class WorkerClient(ModelClient, Protocol):
    """A model client running on a simulated worker: what the faults act on."""

    @property
    def worker(self) -> str: ...

    @property
    def last_latency_s(self) -> float:
        """How long the last call waited for its reply."""
        ...

    async def pause(self, seconds: float | None) -> None:
        """Wait on the worker (forever for None); raises once the worker crashes."""
        ...

    def crash(self) -> GenerationError:
        """Crash the worker (every attempt on it fails); the error to raise."""
        ...


class FaultInjectingClient:
    """A :class:`ModelClient` that injects one attempt's drawn ``faults`` into ``inner``.

    ``counts`` (fault name -> count) is incremented as faults fire.
    """

    def __init__(
        self,
        inner: WorkerClient,
        faults: frozenset[str],
        *,
        straggler_factor: float,
        counts: dict[str, int],
    ) -> None:
        self._inner = inner
        self._faults = faults
        self._factor = straggler_factor
        self._counts = counts
        self._calls = 0

    async def generate(
        self, prompt_ids: Sequence[int], *, call_id: str, sampling: Sampling
    ) -> Completion:
        faults, index = self._faults, self._calls
        self._calls += 1
        if index == 1:  # after the attempt's first call
            if "worker_crash" in faults:
                raise self._inner.crash()
            if "attempt_failed" in faults:
                self._counts["attempt_failed"] += 1
                raise GenerationError(
                    FailureReason.ATTEMPT_FAILED,
                    "simulated agent error after the first call",
                    worker=self._inner.worker,
                )
            if "hang" in faults:
                self._counts["hang"] += 1
                await self._inner.pause(None)
            if "capture_failure" in faults:
                self._counts["capture_failure"] += 1
                raise CallFailed(CAPTURE_FAILURE_REASON, f"call {call_id} was not captured")
        completion = await self._inner.generate(prompt_ids, call_id=call_id, sampling=sampling)
        if "straggler" in faults:
            await self._inner.pause(self._inner.last_latency_s * (self._factor - 1.0))
        return completion

    def after_episode(
        self, result: AttemptResult, capture: CaptureWriter, data_plane: DataPlane
    ) -> None:
        """The tamper fault: overwrite the episode's last staged row behind the writer."""
        manifest = result.receipt.manifest
        if "tamper" not in self._faults or result.receipt.capture_poisoned or not manifest:
            return
        self._counts["tamper"] += 1
        _tamper(data_plane, capture.partition, manifest[-1].staging_key)


def _tamper(data_plane: DataPlane, partition: str, key: str) -> None:
    (row,) = data_plane.get(partition, [key])
    token_ids = np.array(row.token_ids, dtype=np.int32)
    # Swap the first generated token for a neighbour id (its low bit flipped), a plausible
    # one in the synthetic task's vocabulary (a digit stays a digit, a thought a thought):
    # unchanged metadata, so only the digest check can notice.
    position = int(np.flatnonzero(row.token_mask == 1.0)[0])
    token_ids[position] ^= 1
    altered = Row(
        token_ids=token_ids,
        token_mask=row.token_mask,
        logprobs=row.logprobs,
        metadata=row.metadata,
    )
    data_plane.put(partition, {key: altered})
