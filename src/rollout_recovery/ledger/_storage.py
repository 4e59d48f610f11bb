"""The ledger's private, compact storage of groups and attempts.

Kept apart from the public records on purpose: storage is slotted, holds frozen receipts and
raw UUID bytes, and is never handed out. Callers receive records built by ``to_record``
(fresh copies) or plain dicts built by ``to_state`` (the schema-3 layout).
"""

from __future__ import annotations

import uuid
from typing import Any

from ..rewards import RewardChecks, RewardLogContext
from ._enums import (
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)
from ._receipts import thaw_receipt
from ._records import (
    PromptGroupRecoveryRecord,
    PromptPayload,
    PromptRef,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
    gate_rollout_id_for,
    logical_rollout_id_for,
)

__all__ = ["AttemptState", "GroupState"]

_SEALED = RolloutAttemptStatus.SEALED


class AttemptState:
    """One physical attempt as stored: UUID bytes, status and, once sealed, its results."""

    __slots__ = (
        "_uuid",
        "mask_sample",
        "receipt_blob",
        "reward",
        "reward_checks",
        "reward_log_context",
        "staging_keys",
        "status",
        "uuid_bytes",
    )

    def __init__(
        self,
        uuid_bytes: bytes,
        status: RolloutAttemptStatus = RolloutAttemptStatus.RESERVED,
        *,
        attempt_uuid: uuid.UUID | None = None,
    ) -> None:
        self.uuid_bytes = uuid_bytes
        # The UUID object is built lazily: a restore creates ~10^5 attempts and only the
        # ones a caller looks at need one.
        self._uuid = attempt_uuid
        self.status = status
        self.receipt_blob: bytes | None = None
        self.reward: float | None = None
        self.mask_sample: bool | None = None
        self.reward_checks: RewardChecks | None = None
        self.reward_log_context: RewardLogContext | None = None
        self.staging_keys: tuple[str, ...] = ()

    @classmethod
    def fresh(cls) -> AttemptState:
        attempt_uuid = uuid.uuid4()
        return cls(attempt_uuid.bytes, attempt_uuid=attempt_uuid)

    @property
    def attempt_uuid(self) -> uuid.UUID:
        if self._uuid is None:
            self._uuid = uuid.UUID(bytes=self.uuid_bytes)
        return self._uuid

    def seal(
        self,
        *,
        receipt_blob: bytes | None,
        reward: float,
        mask_sample: bool,
        reward_checks: RewardChecks | None,
        reward_log_context: RewardLogContext | None,
        staging_keys: tuple[str, ...],
    ) -> None:
        self.receipt_blob = receipt_blob
        self.reward = reward
        self.mask_sample = mask_sample
        self.reward_checks = reward_checks
        self.reward_log_context = reward_log_context
        self.staging_keys = staging_keys
        self.status = _SEALED

    def abandon(self, *, drop_results: bool) -> None:
        """Mark abandoned; ``drop_results`` also forgets a seal (prompt-group restarts)."""
        self.status = RolloutAttemptStatus.ABANDONED
        if drop_results:
            self.receipt_blob = None
            self.reward = None
            self.mask_sample = None
            self.reward_checks = None
            self.reward_log_context = None
            self.staging_keys = ()

    def to_record(self) -> RolloutAttemptRecord:
        return RolloutAttemptRecord(
            attempt_uuid=self.attempt_uuid,
            status=self.status,
            receipt=thaw_receipt(self.receipt_blob),
            reward=self.reward,
            mask_sample=self.mask_sample,
            # Both are frozen values, so sharing them is a safe copy.
            reward_checks=self.reward_checks,
            reward_log_context=self.reward_log_context,
            staging_keys=list(self.staging_keys),
        )

    def to_state(self) -> dict[str, Any]:
        checks = self.reward_checks
        context = self.reward_log_context
        return {
            "attempt_uuid": self.uuid_bytes,
            "status": self.status.value,
            "receipt": thaw_receipt(self.receipt_blob),
            "reward": self.reward,
            "mask_sample": self.mask_sample,
            "reward_checks": None
            if checks is None
            else {
                "duplicated_reasoning": checks.duplicated_reasoning,
                "empty_final_answer": checks.empty_final_answer,
                "low_effort": checks.low_effort,
            },
            "reward_log_context": None
            if context is None
            else {
                "agent_name": context.agent_name,
                "full_result_json": context.full_result_json,
            },
            "staging_keys": list(self.staging_keys),
        }


class GroupState:
    """One prompt group as stored; ``siblings[i]`` is sibling ``i``'s attempts, oldest first."""

    __slots__ = (
        "admission_id",
        "expected_generations",
        "group_id",
        "payload",
        "phase",
        "prompt_id",
        "prompt_ref",
        "recovery_granularity",
        "siblings",
        "start_weight_version",
        "status",
        "target_step",
        "task_source",
    )

    def __init__(
        self,
        *,
        group_id: str,
        admission_id: str,
        prompt_id: str,
        prompt_ref: PromptRef,
        task_source: str | None,
        recovery_granularity: RecoveryGranularity,
        payload: PromptPayload | None,
        expected_generations: int,
        target_step: int | None,
        start_weight_version: int,
        siblings: list[list[AttemptState]],
        phase: PromptGroupPhase,
        status: PromptGroupStatus,
    ) -> None:
        self.group_id = group_id
        self.admission_id = admission_id
        self.prompt_id = prompt_id
        self.prompt_ref = prompt_ref
        self.task_source = task_source
        self.recovery_granularity = recovery_granularity
        self.payload = payload
        self.expected_generations = expected_generations
        self.target_step = target_step
        self.start_weight_version = start_weight_version
        self.siblings = siblings
        self.phase = phase
        self.status = status

    def current(self, generation_index: int) -> AttemptState:
        return self.siblings[generation_index][-1]

    def currents(self) -> list[AttemptState]:
        return [attempts[-1] for attempts in self.siblings]

    def all_current_sealed(self) -> bool:
        return all(attempts[-1].status is _SEALED for attempts in self.siblings)

    def logical_id(self, generation_index: int) -> str:
        return logical_rollout_id_for(self.group_id, generation_index)

    def gate_id(self, generation_index: int) -> str:
        attempt = self.siblings[generation_index][-1]
        return gate_rollout_id_for(self.group_id, generation_index, attempt.uuid_bytes.hex())

    def to_record(self) -> PromptGroupRecoveryRecord:
        return PromptGroupRecoveryRecord(
            group_id=self.group_id,
            admission_id=self.admission_id,
            prompt_id=self.prompt_id,
            prompt_ref=self.prompt_ref,
            task_source=self.task_source,
            recovery_granularity=self.recovery_granularity,
            # Shared by reference on purpose: the payload can be a 131k-token prompt.
            runtime_prompt_payload=self.payload,
            expected_generations=self.expected_generations,
            target_step=self.target_step,
            start_weight_version=self.start_weight_version,
            siblings=[
                RolloutSiblingRecord(
                    generation_index=index,
                    attempts=[attempt.to_record() for attempt in attempts],
                )
                for index, attempts in enumerate(self.siblings)
            ],
            phase=self.phase,
            status=self.status,
        )

    def to_state(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "admission_id": self.admission_id,
            "prompt_id": self.prompt_id,
            "prompt_ref": {
                "sample_id": self.prompt_ref.sample_id,
                "task_name": self.prompt_ref.task_name,
            },
            "task_source": self.task_source,
            "recovery_granularity": self.recovery_granularity.value,
            "expected_generations": self.expected_generations,
            "target_step": self.target_step,
            "start_weight_version": self.start_weight_version,
            "status": self.status.value,
            "phase": self.phase.value,
            "siblings": [
                {
                    "generation_index": index,
                    "attempts": [attempt.to_state() for attempt in attempts],
                }
                for index, attempts in enumerate(self.siblings)
            ],
        }
