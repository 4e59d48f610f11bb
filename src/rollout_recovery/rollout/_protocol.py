"""The generation seam: a backend runs one attempt of one sibling and returns its outcome.

A backend stages every model call through the ``CaptureWriter`` it is given *before* the
episode goes on, then returns either the assembled receipt (:class:`AttemptResult`) or,
for an expected failure (a crashed worker, no live server, a dead actor, the episode's own
error), an :class:`AttemptFailure` with its :class:`FailureReason`: the controller
abandons it and retries within budget. A backend raises only for a bug or bad state, and
that stops the run. The controller also cancels an attempt at its deadline, so a backend
needs no timeout of its own.

Deep inside an attempt (a model client several frames down) raising is the natural way
out, so there a failure is a :class:`~rollout_recovery.errors.GenerationError`, and
:meth:`AttemptFailure.from_error` is the one conversion into the value, at the backend's
boundary (:func:`~rollout_recovery.rollout.run_episode` does it for every client).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from .._outcomes import FailureReason
from ..capture import CaptureWriter, Receipt, StagedPrefix
from ..errors import GenerationError
from ..rewards import RewardChecks

__all__ = [
    "AttemptFailure",
    "AttemptRequest",
    "AttemptResult",
    "BackendStartup",
    "BackendTelemetry",
    "GenerationBackend",
]

# The weights a backend loads. Contravariant: a backend that takes any object (it ignores
# them) takes a trainer's snapshots too, and one that takes ``PolicySnapshot`` refuses
# ``TorchWeights`` at type-check time.
Weights_contra = TypeVar("Weights_contra", contravariant=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRequest:
    """One physical attempt: sibling ``generation_index`` of ``group_id`` as ``rollout_id``.

    ``weight_version`` is the policy version current at dispatch (the client-side stamp).
    """

    group_id: str
    generation_index: int
    rollout_id: str
    prompt: Mapping[str, Any]
    weight_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptResult:
    """A finished attempt: the token-free receipt the ledger seals, and its reward.

    ``receipt`` stays typed on its way to the seal; the controller turns it into the
    ledger's plain dict once, when it writes the seal (the seed's ledger contract takes and
    stores a dict).

    ``generated_tokens`` counts the generated tokens of every call the receipt holds;
    ``inherited_calls`` of those calls (``inherited_tokens`` of those tokens) were an
    earlier attempt's, continued rather than generated again (``run_attempt``'s ``prefix``);
    ``resume_refused`` says why a prefix the attempt was handed was not used.
    """

    rollout_id: str
    receipt: Receipt
    reward: float
    mask_sample: bool
    reward_checks: RewardChecks | None
    generated_tokens: int
    inherited_calls: int = 0
    inherited_tokens: int = 0
    resume_refused: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptFailure:
    """An attempt that ended without a seal: which one, why, where, and what was seen.

    ``worker`` names the server, worker or actor when the backend knows it.
    """

    rollout_id: str
    generation_index: int
    reason: FailureReason
    detail: str = ""
    worker: str | None = None

    @classmethod
    def from_error(cls, request: AttemptRequest, error: GenerationError) -> AttemptFailure:
        """The failure value of ``error``, raised inside ``request``'s attempt."""
        return cls(
            rollout_id=request.rollout_id,
            generation_index=request.generation_index,
            reason=error.reason,
            detail=str(error).removeprefix(f"{error.reason}: "),
            worker=error.worker,
        )

    @classmethod
    def closed(cls, request: AttemptRequest, backend: str) -> AttemptFailure:
        """The failure of an attempt handed to a closed backend."""
        return cls(
            rollout_id=request.rollout_id,
            generation_index=request.generation_index,
            reason=FailureReason.BACKEND_CLOSED,
            detail=f"the {backend} backend is closed",
        )


class GenerationBackend(Protocol[Weights_contra]):
    """Runs attempts; the controller owns retries, deadlines and the ledger.

    ``update_weights`` takes what the trainer's ``weights()`` returns (the type
    parameter): the controller calls it after every step and after a restore.

    ``run_attempt`` is the one way in, fresh or continued. When a sibling's attempt was
    lost (its worker died, the run was killed), the controller reads the calls that
    attempt staged, verifies them (the same sibling, rows that hash to their digests, one
    chain from the root, weights the reuse policy keeps) and hands them to the sibling's
    next attempt as ``prefix``. The backend stages them again under
    ``request.rollout_id`` (so the receipt covers every call, inherited and new) and
    generates only what follows; a prefix it cannot use is ignored, the episode starts
    over and ``AttemptResult.resume_refused`` says why.
    :func:`~rollout_recovery.rollout.run_episode` does all of that for a backend built on
    a model client.
    """

    def update_weights(self, version: int, weights: Weights_contra) -> None: ...

    async def run_attempt(
        self,
        request: AttemptRequest,
        capture: CaptureWriter,
        prefix: StagedPrefix | None = None,
    ) -> AttemptResult | AttemptFailure: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class BackendTelemetry(Protocol):
    """Optional: a backend with parts that live and die on their own (servers, actors).

    The controller writes ``drain_events()`` (``{"event": kind, ...}`` dicts: a server
    died, rejoined, a call was redispatched) to ``events.jsonl`` and ``telemetry()``
    (cumulative per-part counts, JSON-like) into each step's ``metrics.jsonl`` line and the
    run summary.
    """

    def telemetry(self) -> dict[str, Any]: ...

    def drain_events(self) -> list[dict[str, Any]]: ...


@runtime_checkable
class BackendStartup(Protocol):
    """Optional: a backend whose parts take long to come up (Ray actors start processes and
    load weights; on a real cluster, minutes).

    The controller awaits ``start()`` once, before it dispatches anything and outside every
    attempt deadline: a slow start must not count as hung attempts, burn their retry
    rounds and drop prompts. ``start()`` bounds its own wait and raises when nothing came
    up; calling it again is a no-op.
    """

    async def start(self) -> None: ...
