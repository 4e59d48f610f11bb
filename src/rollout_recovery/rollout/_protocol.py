"""The generation seam: a backend runs one attempt of one sibling and returns its receipt.

A backend stages every model call through the ``CaptureWriter`` it is given *before* the
episode goes on, then returns the assembled receipt. It raises
:class:`~rollout_recovery.errors.GenerationError` for a failed attempt (the controller
abandons it and retries within budget); the controller also cancels an attempt at its
deadline, so a backend needs no timeout of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..capture import CaptureWriter
from ..rewards import RewardChecks

__all__ = [
    "AttemptRequest",
    "AttemptResult",
    "BackendStartup",
    "BackendTelemetry",
    "GenerationBackend",
]


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
    """A finished attempt: the token-free receipt the ledger seals, and its reward."""

    rollout_id: str
    receipt: dict[str, Any]
    reward: float
    mask_sample: bool
    reward_checks: RewardChecks | None
    generated_tokens: int


class GenerationBackend(Protocol):
    """Runs attempts; the controller owns retries, deadlines and the ledger."""

    def update_weights(self, version: int, weights: object) -> None: ...

    async def run_attempt(
        self, request: AttemptRequest, capture: CaptureWriter
    ) -> AttemptResult: ...

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
