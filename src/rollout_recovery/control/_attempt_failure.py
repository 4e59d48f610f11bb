"""The value an attempt that ended without a seal becomes in the controller.

Backends raise ``GenerationError(reason)``; the controller's ``_attempt`` turns that (or a
deadline, or a drain) into an :class:`AttemptFailure`, in one place, and abandons the
attempt with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..rollout import FailureReason

__all__ = ["AttemptFailure"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptFailure:
    """An attempt that ended without a seal: which one, why, and what the backend saw."""

    rollout_id: str
    generation_index: int
    reason: FailureReason
    detail: str = ""
