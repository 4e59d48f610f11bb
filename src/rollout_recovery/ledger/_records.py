"""Public ledger records: the values callers read and pass in.

Records returned by the ledger are fresh copies: mutating them never changes the ledger.
The runtime prompt payload is the one exception, shared by reference because it may hold a
131k-token prompt; it is never copied and never serialized.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ..errors import InvalidOperationError, InvalidStateError
from ..rewards import RewardChecks, RewardLogContext
from ._enums import (
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)

__all__ = [
    "PromptGroupRecoveryRecord",
    "PromptPayload",
    "PromptRef",
    "RolloutAttemptRecord",
    "RolloutSiblingRecord",
    "SiblingSealResult",
    "gate_rollout_id_for",
    "logical_rollout_id_for",
]

# The dataloader's sample (NeMo-RL's ``DatumSpec``): a mapping with an integer ``idx`` and an
# optional ``task_name``; everything else is opaque to the ledger.
PromptPayload: TypeAlias = Mapping[str, Any]


def logical_rollout_id_for(group_id: str, generation_index: int) -> str:
    """Stable sibling id, also the canonical row key: ``{group_id}_g{i}``."""
    return f"{group_id}_g{generation_index}"


def gate_rollout_id_for(group_id: str, generation_index: int, attempt_hex: str) -> str:
    """Physical attempt id handed to the generator: ``{group_id}_g{i}_a{uuid.hex}``."""
    return f"{group_id}_g{generation_index}_a{attempt_hex}"


@dataclass(frozen=True, slots=True)
class PromptRef:
    """Small durable locator of a prompt owned by the input dataset.

    The full prompt is runtime-only; after a restart it is rebound from the dataset by this
    reference (``bind_runtime_prompt``), which checks the identity.
    """

    sample_id: str
    task_name: str | None = None

    def __post_init__(self) -> None:
        if not self.sample_id:
            raise InvalidStateError(
                f"prompt sample_id must not be empty, got {self.sample_id!r}", path="$.sample_id"
            )


@dataclass(slots=True)
class RolloutAttemptRecord:
    """One physical attempt of a stable logical sibling."""

    attempt_uuid: uuid.UUID
    status: RolloutAttemptStatus
    receipt: dict[str, Any] | None = None
    reward: float | None = None
    mask_sample: bool | None = None
    reward_checks: RewardChecks | None = None
    reward_log_context: RewardLogContext | None = None
    staging_keys: list[str] = field(default_factory=list)

    @property
    def attempt_id(self) -> str:
        """The compact external form of the attempt UUID (32 hex digits)."""
        return self.attempt_uuid.hex


@dataclass(slots=True)
class RolloutSiblingRecord:
    """One stable GRPO generation slot and its physical attempts, oldest first."""

    generation_index: int
    attempts: list[RolloutAttemptRecord]

    @property
    def current_attempt(self) -> RolloutAttemptRecord:
        if not self.attempts:
            raise InvalidOperationError(f"generation index {self.generation_index} has no attempts")
        return self.attempts[-1]


@dataclass(slots=True)
class PromptGroupRecoveryRecord:
    """Lineage and ownership of one logical prompt group."""

    group_id: str
    admission_id: str
    prompt_id: str
    prompt_ref: PromptRef
    task_source: str | None
    recovery_granularity: RecoveryGranularity
    runtime_prompt_payload: PromptPayload | None
    expected_generations: int
    target_step: int | None
    start_weight_version: int
    siblings: list[RolloutSiblingRecord]
    phase: PromptGroupPhase
    status: PromptGroupStatus = PromptGroupStatus.GENERATING

    @property
    def prompt_payload(self) -> PromptPayload:
        """The runtime prompt, required to redispatch unfinished work."""
        if self.runtime_prompt_payload is None:
            raise InvalidOperationError(
                f"recovery group {self.group_id!r} has not rehydrated prompt "
                f"sample_id={self.prompt_ref.sample_id!r}"
            )
        return self.runtime_prompt_payload

    @property
    def logical_rollout_ids(self) -> list[str]:
        return [self.logical_rollout_id(s.generation_index) for s in self.siblings]

    @property
    def gate_rollout_ids(self) -> list[str]:
        return [self.gate_rollout_id(s.generation_index) for s in self.siblings]

    def logical_rollout_id(self, generation_index: int) -> str:
        """Derived, never stored: ``{group_id}_g{generation_index}``."""
        return logical_rollout_id_for(self.group_id, generation_index)

    def gate_rollout_id(self, generation_index: int) -> str:
        """Derived from the sibling's current attempt: ``{group_id}_g{i}_a{uuid.hex}``."""
        attempt = self.siblings[generation_index].current_attempt
        return gate_rollout_id_for(self.group_id, generation_index, attempt.attempt_id)

    @property
    def sealed_generation_indices(self) -> list[int]:
        return [
            s.generation_index
            for s in self.siblings
            if s.current_attempt.status is RolloutAttemptStatus.SEALED
        ]


@dataclass(frozen=True)
class SiblingSealResult:
    """One terminal sibling result waiting for an atomic prompt-group seal."""

    gate_rollout_id: str
    # None is an explicit terminal capture failure; the finalizer turns it into a masked
    # placeholder row, so the group still publishes exactly N rows.
    receipt: dict[str, Any] | None
    reward: float
    mask_sample: bool
    reward_checks: RewardChecks | None = None
    reward_log_context: RewardLogContext | None = None
