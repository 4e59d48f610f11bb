"""The ledger's four state enums, serialized by value (schema 3)."""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "PromptGroupPhase",
    "PromptGroupStatus",
    "RecoveryGranularity",
    "RolloutAttemptStatus",
]


class PromptGroupPhase(StrEnum):
    """Durable sampler-admission phase of an unfinished prompt group; it never goes back."""

    RESERVED = "reserved"
    ADMITTED = "admitted"


class RecoveryGranularity(StrEnum):
    """Unit of finished work reused after a live failure or a restart."""

    SIBLING = "sibling"
    PROMPT_GROUP = "prompt_group"


class RolloutAttemptStatus(StrEnum):
    """Lifecycle of one physical execution attempt of a sibling.

    ``FAILED`` is persisted and retryable but no ledger method produces it (as upstream).
    """

    RESERVED = "reserved"
    DISPATCHED = "dispatched"
    SEALED = "sealed"
    FAILED = "failed"
    ABANDONED = "abandoned"

    def is_retryable(self) -> bool:
        """True for attempts that ``prepare_incomplete_retry`` replaces with a fresh one."""
        return self is RolloutAttemptStatus.ABANDONED or self is RolloutAttemptStatus.FAILED


class PromptGroupStatus(StrEnum):
    """Ownership lifecycle of one logical prompt group."""

    GENERATING = "generating"
    READY_TO_FINALIZE = "ready_to_finalize"
    FINALIZING = "finalizing"
    FINALIZATION_UNKNOWN = "finalization_unknown"

    def is_checkpoint_safe(self) -> bool:
        """False while the canonical publication outcome is in flight or unknown."""
        return self is PromptGroupStatus.GENERATING or self is PromptGroupStatus.READY_TO_FINALIZE

    def requires_all_sealed(self) -> bool:
        """True for the states that exist only after every sibling sealed."""
        return self is not PromptGroupStatus.GENERATING
