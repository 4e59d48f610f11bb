"""The ledger's private storage: msgspec Structs shaped exactly like the schema-3 state.

Why Structs: a checkpoint holds the barrier while the ledger is serialized, and a restore
validates ~10^5 attempts. With storage shaped like the state dict, ``state_dict`` is one
C-level ``msgspec.to_builtins`` call (it builds fresh containers and shares immutable
leaves), and a well-formed state converts back with one ``msgspec.convert`` call; only
the cross-field invariants run in Python. ``gc=False``: these objects never form cycles,
so the cyclic collector need not scan the 10^5 of them on every collection.

Storage never leaves the ledger: callers get records built by ``to_record`` or plain
dicts from ``to_builtins``. Field order is the state dict's key order.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from ..rewards import RewardChecks, RewardLogContext
from ._enums import (
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)
from ._records import (
    PromptGroupRecoveryRecord,
    PromptPayload,
    PromptRef,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
    gate_rollout_id_for,
    logical_rollout_id_for,
)

__all__ = [
    "AttemptState",
    "GroupState",
    "PromptRefState",
    "RewardLogContextState",
    "SiblingState",
    "context_state",
    "groups_to_builtins",
    "prompt_ref_state",
    "unchecked_plain_copy",
    "uuid_from_bytes",
]

_SEALED = RolloutAttemptStatus.SEALED
_T = TypeVar("_T")


def _uuid_from_bytes_fast(raw: bytes) -> uuid.UUID:
    # uuid.UUID(bytes=...) re-validates its arguments in Python; a record copy builds one
    # UUID per attempt, so build it directly from its two slots (about 2x cheaper).
    value = object.__new__(uuid.UUID)
    object.__setattr__(value, "int", int.from_bytes(raw, "big"))
    object.__setattr__(value, "is_safe", uuid.SafeUUID.unknown)
    return value


def _uuid_from_bytes_plain(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=raw)


def _pick_uuid_builder() -> Callable[[bytes], uuid.UUID]:
    """Use the fast builder only if it yields an identical UUID on this Python."""
    probe = uuid.uuid4()
    try:
        built = _uuid_from_bytes_fast(probe.bytes)
        if built == probe and hash(built) == hash(probe) and built.hex == probe.hex:
            return _uuid_from_bytes_fast
    except (AttributeError, TypeError):
        pass
    return _uuid_from_bytes_plain


uuid_from_bytes = _pick_uuid_builder()


def unchecked_plain_copy(value: Any) -> Any:
    """Deep-copy plain data (dicts, lists, scalars, bytes) at C speed, validating nothing.

    For data already checked (a sealed receipt, a decoded file); ``_plain``'s
    ``validated_plain_copy`` is the one that refuses what a sidecar cannot hold.

    Tuples come back as lists: receipts are JSON-like data, and this is the form a
    sidecar round trip gives them anyway.
    """
    return msgspec.to_builtins(value, builtin_types=(bytes,))


# The small records nested in the state are strict Structs rather than the public frozen
# dataclasses: msgspec silently drops unknown keys when it builds a dataclass, while a
# Struct with forbid_unknown_fields refuses them, so one typed decode of a file (or one
# conversion of a dict) is exactly as strict as the seed's checks. Records handed to
# callers carry the public types (``to_record``). ``RewardChecks`` is such a Struct itself
# (frozen, so records share the stored instance): it is stored as it is.


class PromptRefState(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    sample_id: str
    task_name: str | None

    def to_public(self) -> PromptRef:
        return _trusted(PromptRef, sample_id=self.sample_id, task_name=self.task_name)


class RewardLogContextState(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    agent_name: str
    full_result_json: str | None

    def to_public(self) -> RewardLogContext:
        return _trusted(
            RewardLogContext, agent_name=self.agent_name, full_result_json=self.full_result_json
        )

    def validate(self) -> None:
        """Run the public type's checks (non-empty agent, JSON object) on stored values."""
        RewardLogContext(agent_name=self.agent_name, full_result_json=self.full_result_json)


def _trusted(cls: type[_T], **values: Any) -> _T:
    """Build a frozen record from values storage already validated, skipping re-validation.

    A log context may hold a large JSON document; parsing it again on every record copy
    would make ``get_group`` as slow as the document is large.
    """
    record = object.__new__(cls)
    for name, value in values.items():
        object.__setattr__(record, name, value)
    return record


def prompt_ref_state(prompt_ref: PromptRef) -> PromptRefState:
    return PromptRefState(prompt_ref.sample_id, prompt_ref.task_name)


def context_state(context: RewardLogContext | None) -> RewardLogContextState | None:
    if context is None:
        return None
    return RewardLogContextState(context.agent_name, context.full_result_json)


class AttemptState(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    """One physical attempt; ``receipt`` is a private deep copy, never handed out."""

    # No defaults on purpose: a state missing a key must fail the strict conversion and
    # take the seed-order path, which decides what a missing key means.
    attempt_uuid: bytes
    status: RolloutAttemptStatus
    receipt: dict[str, Any] | None
    reward: float | None
    mask_sample: bool | None
    reward_checks: RewardChecks | None
    reward_log_context: RewardLogContextState | None
    staging_keys: list[str]

    @classmethod
    def fresh(cls, attempt_uuid: uuid.UUID | None = None) -> AttemptState:
        """A RESERVED attempt, with a new random id unless ``attempt_uuid`` names it (a
        replay re-creates the attempt the journal recorded, never a new one)."""
        minted = attempt_uuid if attempt_uuid is not None else uuid.uuid4()
        return cls(minted.bytes, RolloutAttemptStatus.RESERVED, None, None, None, None, None, [])

    def seal(
        self,
        *,
        receipt: dict[str, Any] | None,
        reward: float,
        mask_sample: bool,
        reward_checks: RewardChecks | None,
        reward_log_context: RewardLogContextState | None,
        staging_keys: list[str],
    ) -> None:
        self.receipt = receipt
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
            self.receipt = None
            self.reward = None
            self.mask_sample = None
            self.reward_checks = None
            self.reward_log_context = None
            self.staging_keys = []

    def to_record(self) -> RolloutAttemptRecord:
        receipt = self.receipt
        context = self.reward_log_context
        # Positional arguments in field order: the hot path of every record copy.
        return RolloutAttemptRecord(
            uuid_from_bytes(self.attempt_uuid),
            self.status,
            None if receipt is None else unchecked_plain_copy(receipt),
            self.reward,
            self.mask_sample,
            self.reward_checks,
            None if context is None else context.to_public(),
            list(self.staging_keys),
        )


class SiblingState(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    """One generation slot: its attempts, oldest first; the last one is current."""

    generation_index: int
    attempts: list[AttemptState]


class GroupState(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    """One prompt group. The runtime prompt payload is kept beside it, never in it."""

    group_id: str
    admission_id: str
    prompt_id: str
    prompt_ref: PromptRefState
    task_source: str | None
    recovery_granularity: RecoveryGranularity
    expected_generations: int
    target_step: int | None
    start_weight_version: int
    status: PromptGroupStatus
    phase: PromptGroupPhase
    siblings: list[SiblingState]

    def current(self, generation_index: int) -> AttemptState:
        return self.siblings[generation_index].attempts[-1]

    def currents(self) -> list[AttemptState]:
        return [sibling.attempts[-1] for sibling in self.siblings]

    def all_current_sealed(self) -> bool:
        return all(sibling.attempts[-1].status is _SEALED for sibling in self.siblings)

    def sealed_staging_keys(self) -> list[str]:
        """The staged rows its sealed current attempts own (history excluded)."""
        return [
            key
            for sibling in self.siblings
            if (current := sibling.attempts[-1]).status is _SEALED
            for key in current.staging_keys
        ]

    def logical_id(self, generation_index: int) -> str:
        return logical_rollout_id_for(self.group_id, generation_index)

    def gate_id(self, generation_index: int) -> str:
        attempt = self.siblings[generation_index].attempts[-1]
        return gate_rollout_id_for(self.group_id, generation_index, attempt.attempt_uuid.hex())

    def to_record(self, payload: PromptPayload | None) -> PromptGroupRecoveryRecord:
        return PromptGroupRecoveryRecord(
            group_id=self.group_id,
            admission_id=self.admission_id,
            prompt_id=self.prompt_id,
            prompt_ref=self.prompt_ref.to_public(),
            task_source=self.task_source,
            recovery_granularity=self.recovery_granularity,
            # Shared by reference on purpose: the payload can be a 131k-token prompt.
            runtime_prompt_payload=payload,
            expected_generations=self.expected_generations,
            target_step=self.target_step,
            start_weight_version=self.start_weight_version,
            siblings=[
                RolloutSiblingRecord(
                    sibling.generation_index, [attempt.to_record() for attempt in sibling.attempts]
                )
                for sibling in self.siblings
            ],
            phase=self.phase,
            status=self.status,
        )


def groups_to_builtins(groups: list[GroupState]) -> list[dict[str, Any]]:
    """The schema-3 ``groups`` list: fresh dicts and lists, UUIDs as 16 raw bytes."""
    result: list[dict[str, Any]] = unchecked_plain_copy(groups)
    return result
