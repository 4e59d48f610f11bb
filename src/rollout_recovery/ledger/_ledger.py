"""``RolloutRecoveryLedger``: the controller-owned source of truth for unfinished groups.

Pure state machine: no I/O, no asyncio. Every mutator first checks that the caller's
barrier cut is live, then validates everything, then mutates; a refused call raises before
it changes anything. Returned records are copies; the runtime prompt payload is shared by
reference and never copied or serialized.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar, NoReturn, Self

from .._bounds import INT64_MAX
from .._checks import is_utf8_text, refuse_bare_string
from .._cut import MutationCut
from .._gc import paused_gc
from ..errors import (
    CheckpointUnsafeError,
    InvalidArgumentTypeError,
    InvalidOperationError,
    InvalidStateError,
    InvalidTransitionError,
    UnknownGroupError,
)
from ..rewards import RewardChecks, RewardLogContext
from ._constants import (
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS,
    RolloutRecoveryState,
)
from ._decode import check_admission_batches, check_decoded_groups, decode_ledger_state
from ._enums import (
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)
from ._plain import validated_plain_copy
from ._receipts import receipt_staging_keys
from ._records import PromptGroupRecoveryRecord, PromptPayload, PromptRef, SiblingSealResult
from ._storage import (
    AttemptState,
    GroupState,
    PromptRefState,
    RewardLogContextState,
    SiblingState,
    context_state,
    groups_to_builtins,
    prompt_ref_state,
)

__all__ = ["RolloutRecoveryLedger", "validate_prompt_identity"]


_SealStates = tuple[dict[str, Any] | None, RewardChecks | None, RewardLogContextState | None]


def _reward_states(
    checks: object, context: object
) -> tuple[RewardChecks | None, RewardLogContextState | None]:
    """Storage forms of a seal's reward records, refusing anything but the public types."""
    if checks is not None and not isinstance(checks, RewardChecks):
        raise InvalidArgumentTypeError(
            f"reward_checks must be a RewardChecks or None, got {type(checks).__name__}"
        )
    if context is not None and not isinstance(context, RewardLogContext):
        raise InvalidArgumentTypeError(
            f"reward_log_context must be a RewardLogContext or None, got {type(context).__name__}"
        )
    return checks, context_state(context)


def _public_context(context: RewardLogContextState | None) -> RewardLogContext | None:
    return None if context is None else context.to_public()


def _own_receipt(receipt: dict[str, Any]) -> dict[str, Any]:
    """A private deep copy of a caller's receipt; refuses what a sidecar cannot hold."""
    try:
        owned: dict[str, Any] = validated_plain_copy(receipt)
    except InvalidStateError as error:
        raise InvalidStateError(
            f"sealed rollout receipt must hold plain data only: {error.message}", path=error.path
        ) from None
    return owned


# Both sidecar formats carry 64-bit integers; a larger scheduling value could never be
# checkpointed.
_INT64_MAX = INT64_MAX


def _reward_value(reward: object, logical_id: str) -> float:
    """``float(reward)``, where the seed converts it, with the builtin type ``float`` raises.

    The seed converts after every other check of a seal; so does the caller. Ours is
    stricter afterwards (:func:`_check_reward_number`).
    """
    try:
        return float(reward)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentTypeError(
            f"reward for {logical_id!r} must be a number, got {type(reward).__name__} {reward!r}"
        ) from None
    except ValueError:
        raise InvalidTransitionError(
            f"reward for {logical_id!r} must be a number, got {type(reward).__name__} {reward!r}"
        ) from None
    except OverflowError:
        raise InvalidTransitionError(
            f"reward for {logical_id!r} must be a number a float can hold, got {reward!r}"
        ) from None


def _check_reward_number(reward: object, logical_id: str) -> None:
    """Stricter than the seed: a number (bools pass, as in the seed's loader); a string that
    ``float`` would parse is refused, not parsed."""
    if not isinstance(reward, int | float):
        raise InvalidTransitionError(
            f"reward for {logical_id!r} must be a number, got {type(reward).__name__} {reward!r}"
        )


def _same_receipt(stored: dict[str, Any] | None, receipt: object) -> bool:
    """The seed's duplicate test of a receipt, against the plain copy ours stored.

    A receipt that is not plain data never equals a stored one; a tuple equals the list
    it was stored as, as it equals the tuple the seed stored.
    """
    if receipt is None or stored is None:
        return receipt is None and stored is None
    try:
        return bool(stored == validated_plain_copy(receipt))
    except InvalidStateError:
        return False


def _same_reward(stored: float | None, incoming: float) -> bool:
    """Equality for duplicate seals, where a redelivered NaN equals the NaN it repeats."""
    return stored == incoming or (
        stored is not None and math.isnan(stored) and math.isnan(incoming)
    )


def _check_scheduling(target_step: object, start_weight_version: object) -> None:
    """Stricter than the seed on purpose: a value the checkpoint loader or the replay
    index would refuse later is refused now, while the call can still change nothing."""
    if target_step is not None and (
        type(target_step) is not int or not 0 <= target_step <= _INT64_MAX
    ):
        raise InvalidArgumentTypeError(
            f"target_step must be a non-negative int or None, got {target_step!r}"
        )
    if type(start_weight_version) is not int or not 0 <= start_weight_version <= _INT64_MAX:
        raise InvalidArgumentTypeError(
            f"start_weight_version must be a non-negative int, got {start_weight_version!r}"
        )


def _check_text(name: str, value: object, *, optional: bool, non_empty: bool) -> None:
    """Refuse, at the call, a string field the checkpoint loader would refuse later.

    The loader wants a ``str`` (never an int or a bool), UTF-8 encodable, and for ids
    non-empty; the seed took anything and wrote a checkpoint that could not be restored.
    """
    if value is None and optional:
        return
    if not isinstance(value, str):
        expected = "a string or None" if optional else "a string"
        raise InvalidTransitionError(
            f"{name} must be {expected}, got {type(value).__name__} {value!r}"
        )
    if non_empty and not value:
        raise InvalidTransitionError(f"{name} must be a non-empty string, got {value!r}")
    if not is_utf8_text(value):
        raise InvalidTransitionError(
            f"{name} must be UTF-8 encodable (it holds a lone surrogate), got {value!r}"
        )


def _check_generation_count(expected_generations: object) -> None:
    """The seed's one test of the count, ``expected_generations < 1``, with its error types.

    A value ``<`` cannot compare is the ``TypeError`` the seed's comparison raises.
    """
    try:
        too_few = expected_generations < 1  # type: ignore[operator]
    except TypeError:
        raise InvalidArgumentTypeError(
            f"expected_generations must be an int, got {type(expected_generations).__name__} "
            f"{expected_generations!r}"
        ) from None
    if too_few:
        raise InvalidTransitionError(
            f"expected_generations must be at least one, got {expected_generations!r}"
        )


def _refuse_prompt_ref(prompt_ref: object) -> NoReturn:
    raise InvalidTransitionError(
        f"prompt_ref must be a PromptRef or None, got {type(prompt_ref).__name__}"
    )


def _check_reservation(
    *,
    prompt_id: object,
    expected_generations: object,
    group_id: object,
    admission_id: object,
    task_source: object,
    prompt_ref: object,
    recovery_granularity: object,
) -> None:
    """Stricter than the seed, and run after all of its checks: the fields of
    ``reserve_group`` as strictly as the checkpoint loader reads them."""
    _check_text("prompt_id", prompt_id, optional=False, non_empty=True)
    # An empty group_id or admission_id asks for a generated one, as in the seed.
    _check_text("group_id", group_id or None, optional=True, non_empty=True)
    _check_text("admission_id", admission_id or None, optional=True, non_empty=True)
    _check_text("task_source", task_source, optional=True, non_empty=False)
    # A bool passes the seed's checks as 0 or 1 (a float does not: see reserve_group).
    if type(expected_generations) is not int:
        raise InvalidTransitionError(
            f"expected_generations must be an int (not a bool), got "
            f"{type(expected_generations).__name__} {expected_generations!r}"
        )
    if expected_generations > _INT64_MAX:
        raise InvalidTransitionError(
            f"expected_generations must fit in 64 bits, got {expected_generations!r}"
        )
    if not isinstance(prompt_ref, PromptRef):
        _refuse_prompt_ref(prompt_ref)
    _check_text("prompt_ref.task_name", prompt_ref.task_name, optional=True, non_empty=False)
    # The seed stores any value and compares it by identity, so a plain string would act as
    # neither granularity and fail at the next checkpoint.
    if not isinstance(recovery_granularity, RecoveryGranularity):
        raise InvalidArgumentTypeError(
            "recovery_granularity must be a RecoveryGranularity, got "
            f"{type(recovery_granularity).__name__} {recovery_granularity!r}"
        )


_RESERVED = RolloutAttemptStatus.RESERVED
_DISPATCHED = RolloutAttemptStatus.DISPATCHED
_SEALED = RolloutAttemptStatus.SEALED
_GENERATING = PromptGroupStatus.GENERATING
_READY = PromptGroupStatus.READY_TO_FINALIZE
_SIBLING = RecoveryGranularity.SIBLING
_PROMPT_GROUP = RecoveryGranularity.PROMPT_GROUP


def _task_name_of(prompt_payload: PromptPayload) -> str | None:
    task_name = prompt_payload.get("task_name")
    if task_name is not None and not isinstance(task_name, str):
        raise InvalidArgumentTypeError(
            f"prompt task_name must be a string or None, got {type(task_name).__name__}"
        )
    return task_name


def validate_prompt_identity(
    prompt_ref: PromptRef | PromptRefState, prompt_payload: PromptPayload, *, group_id: str
) -> None:
    """Require a runtime prompt to resolve to the ledger's durable dataset key."""
    sample_id = prompt_payload.get("idx")
    if isinstance(sample_id, bool) or not isinstance(sample_id, int):
        raise InvalidTransitionError(
            f"recovery group {group_id!r} prompt payload must contain an integer idx, "
            f"got {sample_id!r}",
            group_id=group_id,
        )
    if str(sample_id) != prompt_ref.sample_id:
        raise InvalidTransitionError(
            f"recovery group {group_id!r} resolved sample_id={sample_id!r}; "
            f"expected {prompt_ref.sample_id!r}",
            group_id=group_id,
        )
    task_name = _task_name_of(prompt_payload)
    if task_name != prompt_ref.task_name:
        raise InvalidTransitionError(
            f"recovery group {group_id!r} resolved task_name={task_name!r}; "
            f"expected {prompt_ref.task_name!r}",
            group_id=group_id,
        )


class RolloutRecoveryLedger:
    """In-memory lineage of every unfinished GRPO prompt group.

    Controller-owned mutations require a live data-plane cut, so lineage never changes
    outside the checkpoint barrier's consistent snapshot boundary. Group order is
    reservation order and survives serialization.
    """

    #: The sidecar schema versions a load accepts, and the type of a schema-3 state (the
    #: package root re-exports both under their seed names).
    SUPPORTED_SCHEMA_VERSIONS: ClassVar[frozenset[int]] = SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS
    State: ClassVar[type[RolloutRecoveryState]] = RolloutRecoveryState

    def __init__(self) -> None:
        self._groups: dict[str, GroupState] = {}
        # Runtime prompts live beside storage, not in it: they are never serialized, and a
        # restored group has none until bind_runtime_prompt.
        self._payloads: dict[str, PromptPayload] = {}

    # ------------------------------------------------------------------ reads

    def groups(self) -> list[PromptGroupRecoveryRecord]:
        payloads = self._payloads
        return [group.to_record(payloads.get(gid)) for gid, group in self._groups.items()]

    def get_group(self, group_id: str) -> PromptGroupRecoveryRecord:
        return self._require_group(group_id).to_record(self._payloads.get(group_id))

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, group_id: object) -> bool:
        return isinstance(group_id, str) and group_id in self._groups

    def expected_staging_keys(self) -> set[str]:
        """Staged token rows still owned by sealed current attempts (history excluded)."""
        keys: set[str] = set()
        for group in self._groups.values():
            keys.update(group.sealed_staging_keys())
        return keys

    def dispatched_attempt_count(self) -> int:
        """Current attempts running on a worker right now (DISPATCHED)."""
        return sum(
            sibling.attempts[-1].status is _DISPATCHED
            for group in self._groups.values()
            for sibling in group.siblings
        )

    def assert_checkpoint_safe(self) -> None:
        """Refuse states whose canonical publication outcome is ambiguous."""
        unsafe = [g.group_id for g in self._groups.values() if not g.status.is_checkpoint_safe()]
        if unsafe:
            raise CheckpointUnsafeError(
                f"rollout recovery contains checkpoint-unsafe group states: groups={unsafe!r}",
                group_ids=unsafe,
            )

    # ------------------------------------------------------- reserve / admit

    def reserve_group(
        self,
        cut: MutationCut,
        *,
        prompt_id: str,
        prompt_payload: PromptPayload,
        expected_generations: int,
        target_step: int | None,
        start_weight_version: int,
        task_source: str | None = None,
        recovery_granularity: RecoveryGranularity = RecoveryGranularity.SIBLING,
        admitted: bool = True,
        group_id: str | None = None,
        admission_id: str | None = None,
        prompt_ref: PromptRef | None = None,
        attempt_uuids: Sequence[uuid.UUID] | None = None,
    ) -> PromptGroupRecoveryRecord:
        """Create one logical group and a fresh RESERVED attempt for each sibling.

        The seed's checks come first, in its order (the arguments, then the duplicate id);
        ours, stricter, follow, so a call the seed refuses is refused with the seed's error.
        ``attempt_uuids`` (one per sibling) names the attempts instead of minting new ids:
        a journal replay re-creates exactly the attempts it recorded.
        """
        cut.require_live()
        if not prompt_id:
            raise InvalidTransitionError(f"prompt_id must not be empty, got {prompt_id!r}")
        if prompt_ref is None:
            prompt_ref = PromptRef(sample_id=prompt_id, task_name=_task_name_of(prompt_payload))
        if not hasattr(prompt_ref, "sample_id"):  # where the seed fails to read it
            _refuse_prompt_ref(prompt_ref)
        if prompt_ref.sample_id != prompt_id:
            raise InvalidTransitionError(
                "dataset prompt reference must match prompt_id: "
                f"{prompt_ref.sample_id!r} != {prompt_id!r}"
            )
        _check_generation_count(expected_generations)
        group_id = group_id or str(uuid.uuid4())
        if group_id in self._groups:
            raise InvalidTransitionError(
                f"duplicate recovery group_id={group_id!r}", group_id=group_id
            )
        admission_id = admission_id or group_id
        if not isinstance(expected_generations, int):  # where the seed's range() refuses it
            raise InvalidArgumentTypeError(
                "expected_generations must be an int, got "
                f"{type(expected_generations).__name__} {expected_generations!r}"
            )
        _check_reservation(
            prompt_id=prompt_id,
            expected_generations=expected_generations,
            group_id=group_id,
            admission_id=admission_id,
            task_source=task_source,
            prompt_ref=prompt_ref,
            recovery_granularity=recovery_granularity,
        )
        _check_scheduling(target_step, start_weight_version)
        if attempt_uuids is not None and len(attempt_uuids) != expected_generations:
            raise InvalidTransitionError(
                f"attempt_uuids names {len(attempt_uuids)} attempts for "
                f"{expected_generations} siblings"
            )
        group = GroupState(
            group_id=group_id,
            admission_id=admission_id,
            prompt_id=prompt_id,
            prompt_ref=prompt_ref_state(prompt_ref),
            task_source=task_source,
            recovery_granularity=recovery_granularity,
            expected_generations=expected_generations,
            target_step=target_step,
            start_weight_version=start_weight_version,
            status=_GENERATING,
            phase=PromptGroupPhase.ADMITTED if admitted else PromptGroupPhase.RESERVED,
            siblings=[
                SiblingState(
                    generation_index=index,
                    attempts=[
                        AttemptState.fresh(None if attempt_uuids is None else attempt_uuids[index])
                    ],
                )
                for index in range(expected_generations)
            ],
        )
        self._groups[group_id] = group
        # Kept by reference: the dataloader sample may be a 131k-token prompt. It is never
        # serialized and is released with the group.
        self._payloads[group_id] = prompt_payload
        return group.to_record(prompt_payload)

    def mark_group_admitted(
        self,
        cut: MutationCut,
        group_id: str,
        *,
        target_step: int | None,
        start_weight_version: int,
    ) -> None:
        """Commit the sampler's admission; sibling lineage is untouched."""
        cut.require_live()
        group = self._require_group(group_id)
        if group.phase is not PromptGroupPhase.RESERVED:
            raise InvalidTransitionError(
                f"recovery group {group_id!r} is already {group.phase.value}", group_id=group_id
            )
        _check_scheduling(target_step, start_weight_version)
        group.target_step = target_step
        group.start_weight_version = start_weight_version
        group.phase = PromptGroupPhase.ADMITTED

    def bind_runtime_prompt(
        self, cut: MutationCut, group_id: str, prompt_payload: PromptPayload
    ) -> None:
        """Attach a prompt rebuilt from the dataset after a restore, checking its identity.

        The content may differ from the original; only ``idx`` and ``task_name`` must match.
        """
        cut.require_live()
        group = self._require_group(group_id)
        validate_prompt_identity(group.prompt_ref, prompt_payload, group_id=group_id)
        self._payloads[group_id] = prompt_payload

    # --------------------------------------------------------------- dispatch

    def mark_group_dispatched(
        self,
        cut: MutationCut,
        group_id: str,
        *,
        generation_indices: Iterable[int] | None = None,
    ) -> None:
        """Move the selected current attempts (default: all) from RESERVED to DISPATCHED."""
        cut.require_live()
        group = self._require_group(group_id)
        if group.phase is not PromptGroupPhase.ADMITTED:
            raise InvalidTransitionError(
                f"cannot dispatch unadmitted recovery group {group_id!r}", group_id=group_id
            )
        if group.status is not _GENERATING:
            raise InvalidTransitionError(
                f"cannot dispatch group {group_id!r} from {group.status.value!r}",
                group_id=group_id,
            )
        indices = (
            range(group.expected_generations)
            if generation_indices is None
            else list(generation_indices)
        )
        attempts = [self._require_sibling(group, index).attempts[-1] for index in indices]
        not_reserved = [a for a in attempts if a.status is not _RESERVED]
        if not_reserved:
            raise InvalidTransitionError(
                "only reserved rollout attempts may be dispatched; group "
                f"{group_id!r} has {[a.status.value for a in not_reserved]!r}",
                group_id=group_id,
            )
        for attempt in attempts:
            attempt.status = _DISPATCHED

    # ------------------------------------------------------------------ seals

    def mark_sibling_sealed(
        self,
        cut: MutationCut,
        group_id: str,
        *,
        generation_index: int,
        gate_rollout_id: str,
        receipt: dict[str, Any] | None,
        reward: float,
        mask_sample: bool,
        reward_checks: RewardChecks | None = None,
        reward_log_context: RewardLogContext | None = None,
    ) -> None:
        """Record one streamed sibling result as soon as it arrives (sibling granularity).

        An exact duplicate of an existing seal is a no-op, so a redelivered result is safe.
        """
        cut.require_live()
        group = self._require_group(group_id)
        if group.recovery_granularity is _PROMPT_GROUP:
            raise InvalidTransitionError(
                "prompt-group recovery must seal every sibling atomically; group "
                f"{group_id!r} uses mark_group_sealed",
                group_id=group_id,
            )
        attempt = self._require_sibling(group, generation_index).attempts[-1]
        logical_id = group.logical_id(generation_index)
        # The seed's check order: manifest, mask type, identities, a duplicate (its receipt,
        # then its reward, then the rest), the status, then the reward's conversion.
        staging_keys = receipt_staging_keys(receipt)
        self._check_mask(group, generation_index, mask_sample)
        self._check_identity(
            group, generation_index, gate_rollout_id=gate_rollout_id, receipt=receipt
        )
        if attempt.status is _SEALED:
            if (
                _same_receipt(attempt.receipt, receipt)
                and _same_reward(attempt.reward, _reward_value(reward, logical_id))
                and attempt.mask_sample is mask_sample
                and attempt.reward_checks == reward_checks
                and _public_context(attempt.reward_log_context) == reward_log_context
                and attempt.staging_keys == staging_keys
            ):
                return
            raise InvalidTransitionError(
                f"conflicting duplicate seal for {logical_id!r}", group_id=group_id
            )
        if attempt.status is not _DISPATCHED:
            raise InvalidTransitionError(
                f"cannot seal logical rollout {logical_id!r} from status {attempt.status.value!r}",
                group_id=group_id,
            )
        reward_value = _reward_value(reward, logical_id)
        # Stricter than the seed, after all of its checks.
        _check_reward_number(reward, logical_id)
        owned_receipt = None if receipt is None else _own_receipt(receipt)
        checks, context = _reward_states(reward_checks, reward_log_context)
        attempt.seal(
            receipt=owned_receipt,
            reward=reward_value,
            mask_sample=mask_sample,
            reward_checks=checks,
            reward_log_context=context,
            staging_keys=staging_keys,
        )
        if group.all_current_sealed():
            group.status = _READY

    def mark_group_sealed(
        self,
        cut: MutationCut,
        group_id: str,
        results: dict[int, SiblingSealResult],
    ) -> None:
        """Seal a whole prompt-group cohort at once: every sibling or none."""
        cut.require_live()
        group = self._require_group(group_id)
        if group.recovery_granularity is not _PROMPT_GROUP:
            raise InvalidTransitionError(
                "atomic group sealing requires prompt-group recovery granularity; group "
                f"{group_id!r} is {group.recovery_granularity.value!r}",
                group_id=group_id,
            )
        if group.status is not _GENERATING:
            raise InvalidTransitionError(
                f"cannot seal group {group_id!r} from status {group.status.value!r}",
                group_id=group_id,
            )
        expected = set(range(group.expected_generations))
        if set(results) != expected:
            raise InvalidTransitionError(
                "prompt-group seal requires every logical sibling exactly once: "
                f"expected={sorted(expected)}, actual={sorted(results, key=repr)}",
                group_id=group_id,
            )
        # Validate the whole cohort before touching any sibling, so a checkpoint observes
        # either no sealed sibling or the complete group. The seed's order: each sibling's
        # status, identities, mask and manifest; then every reward's conversion (the seed
        # converts while it commits, and so stores part of the cohort before it fails).
        validated: list[tuple[AttemptState, SiblingSealResult, list[str]]] = []
        for index in range(group.expected_generations):
            result = results[index]
            attempt = group.current(index)
            if attempt.status is not _DISPATCHED:
                raise InvalidTransitionError(
                    f"cannot seal logical rollout {group.logical_id(index)!r} "
                    f"from status {attempt.status.value!r}",
                    group_id=group_id,
                )
            self._check_identity(
                group, index, gate_rollout_id=result.gate_rollout_id, receipt=result.receipt
            )
            self._check_mask(group, index, result.mask_sample)
            validated.append((attempt, result, receipt_staging_keys(result.receipt)))
        rewards = [
            _reward_value(result.reward, group.logical_id(index))
            for index, (_, result, _) in enumerate(validated)
        ]
        # Stricter than the seed, after all of its checks.
        states: list[_SealStates] = []
        for index, (_, result, _) in enumerate(validated):
            _check_reward_number(result.reward, group.logical_id(index))
            owned = None if result.receipt is None else _own_receipt(result.receipt)
            states.append((owned, *_reward_states(result.reward_checks, result.reward_log_context)))
        for (attempt, result, keys), reward, (owned, checks, context) in zip(
            validated, rewards, states, strict=True
        ):
            attempt.seal(
                receipt=owned,
                reward=reward,
                mask_sample=result.mask_sample,
                reward_checks=checks,
                reward_log_context=context,
                staging_keys=keys,
            )
        group.status = _READY

    @staticmethod
    def _check_mask(group: GroupState, generation_index: int, mask_sample: object) -> None:
        if not isinstance(mask_sample, bool):
            raise InvalidArgumentTypeError(
                f"mask_sample must be a bool, got {type(mask_sample).__name__} "
                f"for {group.logical_id(generation_index)!r}"
            )

    @staticmethod
    def _check_identity(
        group: GroupState,
        generation_index: int,
        *,
        gate_rollout_id: str,
        receipt: dict[str, Any] | None,
    ) -> None:
        """The result must come from the sibling's current attempt, receipt included."""
        expected = group.gate_id(generation_index)
        if gate_rollout_id != expected:
            raise InvalidTransitionError(
                "streamed rollout identity mismatch: "
                f"result={gate_rollout_id!r}, expected={expected!r}",
                group_id=group.group_id,
            )
        if receipt is not None and receipt.get("rollout_id") != gate_rollout_id:
            raise InvalidTransitionError(
                "receipt rollout identity mismatch: "
                f"receipt={receipt.get('rollout_id')!r}, expected={gate_rollout_id!r}",
                group_id=group.group_id,
            )

    # --------------------------------------------------- failure and retries

    def abandon_unsealed(self, cut: MutationCut, group_id: str) -> None:
        """Abandon unfinished work at the group's persisted recovery granularity."""
        cut.require_live()
        group = self._require_group(group_id)
        if group.status is not _GENERATING and group.status is not _READY:
            raise InvalidTransitionError(
                f"cannot abandon group {group_id!r} from {group.status.value!r}",
                group_id=group_id,
            )
        if group.recovery_granularity is _PROMPT_GROUP and group.status is _GENERATING:
            self._abandon_entire_group(group)
            return
        for attempt in group.currents():
            if attempt.status is not _SEALED:
                attempt.abandon(drop_results=False)
        group.status = _READY if group.all_current_sealed() else _GENERATING

    @staticmethod
    def _abandon_entire_group(group: GroupState) -> None:
        """Drop every current sibling of an atomic group, sealed ones included.

        Their staging rows become unreferenced; the restore inventory pass deletes them.
        """
        for attempt in group.currents():
            attempt.abandon(drop_results=True)
        group.status = _GENERATING

    def prepare_incomplete_retry(
        self,
        cut: MutationCut,
        group_id: str,
        *,
        attempt_uuids: Mapping[int, uuid.UUID] | None = None,
    ) -> PromptGroupRecoveryRecord:
        """Mint fresh attempts for abandoned or failed siblings, per the group's granularity.

        Sealed siblings are kept at sibling granularity; RESERVED ones are left alone, so a
        fresh group is a no-op. ``attempt_uuids`` (generation index -> id, exactly the
        siblings this retry renews) names the new attempts instead of minting ids, for a
        journal replay.
        """
        cut.require_live()
        group = self._require_group(group_id)
        if group.status is not _GENERATING:
            raise InvalidTransitionError(
                f"cannot retry group {group_id!r} from status {group.status.value!r}",
                group_id=group_id,
            )
        currents = group.currents()
        if (
            group.recovery_granularity is _PROMPT_GROUP
            and any(a.status.is_retryable() for a in currents)
            and not all(a.status.is_retryable() for a in currents)
        ):
            raise InvalidTransitionError(
                "prompt-group retry requires every sibling attempt to be abandoned or "
                f"failed together; group {group_id!r} has "
                f"{[a.status.value for a in currents]!r}",
                group_id=group_id,
            )
        to_retry: list[int] = []
        for index, attempt in enumerate(currents):
            if group.recovery_granularity is _SIBLING and attempt.status is _SEALED:
                continue
            if attempt.status is _RESERVED:
                continue
            if not attempt.status.is_retryable():
                raise InvalidTransitionError(
                    f"cannot retry logical rollout {group.logical_id(index)!r} "
                    f"from status {attempt.status.value!r}",
                    group_id=group_id,
                )
            to_retry.append(index)
        if attempt_uuids is not None and sorted(attempt_uuids) != to_retry:
            raise InvalidTransitionError(
                f"retry of group {group_id!r} renews siblings {to_retry}, but attempt_uuids "
                f"names {sorted(attempt_uuids)}",
                group_id=group_id,
            )
        for index in to_retry:
            named = None if attempt_uuids is None else attempt_uuids[index]
            group.siblings[index].attempts.append(AttemptState.fresh(named))
        return group.to_record(self._payloads.get(group_id))

    def prepare_for_restart(self, cut: MutationCut) -> None:
        """Apply each group's persisted restore policy to attempts a crash interrupted."""
        cut.require_live()
        self.assert_checkpoint_safe()
        for group in self._groups.values():
            if group.status is not _GENERATING:
                continue
            if group.recovery_granularity is _PROMPT_GROUP:
                self._abandon_entire_group(group)
            else:
                self.abandon_unsealed(cut, group.group_id)

    # ------------------------------------------------------------ finalization

    def mark_finalization_started(self, cut: MutationCut, group_id: str) -> None:
        cut.require_live()
        group = self._require_group(group_id)
        self._require_status(group, _READY, transition="start finalization")
        group.status = PromptGroupStatus.FINALIZING

    def mark_finalization_unknown(self, cut: MutationCut, group_id: str) -> None:
        """Record that publication may or may not have happened: fatal, never checkpointed."""
        cut.require_live()
        group = self._require_group(group_id)
        self._require_status(
            group, PromptGroupStatus.FINALIZING, transition="mark finalization unknown"
        )
        group.status = PromptGroupStatus.FINALIZATION_UNKNOWN

    def discard_group(self, cut: MutationCut, group_id: str) -> None:
        """Drop a group once its canonical rows (or its drop) took over ownership."""
        cut.require_live()
        self._require_group(group_id)
        del self._groups[group_id]
        self._payloads.pop(group_id, None)

    def discard_canonical_groups(self, cut: MutationCut, group_ids: Iterable[str]) -> int:
        """Drop groups the replay index already owns; ids the ledger lacks are ignored."""
        cut.require_live()
        refuse_bare_string(group_ids, what="group_ids", operation="discard_canonical_groups")
        try:
            wanted = set(group_ids)
        except TypeError:
            raise InvalidArgumentTypeError(
                "discard_canonical_groups: group_ids must be a collection of hashable ids, got "
                f"{type(group_ids).__name__}"
            ) from None
        owned = [group_id for group_id in wanted if group_id in self._groups]
        for group_id in owned:
            del self._groups[group_id]
            self._payloads.pop(group_id, None)
        return len(owned)

    # ----------------------------------------------------------- persistence

    def state_dict(self) -> dict[str, Any]:
        """The versioned schema-3 metadata persisted in the checkpoint sidecar.

        Attempt UUIDs are 16 raw bytes; no derived id and no prompt payload is stored.
        """
        groups = self.checkpoint_groups()
        with paused_gc():
            state = groups_to_builtins(groups)
        return {"schema_version": ROLLOUT_RECOVERY_SCHEMA_VERSION, "groups": state}

    def checkpoint_groups(self, *, exclude: Collection[str] = ()) -> list[GroupState]:
        """The live storage of every group not in ``exclude``, after ``state_dict``'s checks.

        For codecs that encode a checkpoint straight from storage inside the checkpoint cut
        (storage is shaped exactly like the state dict), skipping the dicts. The objects are
        the ledger's own: encode them at once; never keep or change them.
        """
        refuse_bare_string(exclude, what="exclude", operation="checkpoint_groups")
        groups = [group for group in self.writable_groups() if group.group_id not in exclude]
        check_admission_batches(groups)
        return groups

    def writable_groups(self) -> list[GroupState]:
        """Every group's live storage after the seed's ``state_dict`` checks, in its order.

        Checkpoint safety, then each group's runtime prompt. Not the cross-group admission
        rule: :meth:`checkpoint_groups` adds it, and ``checkpoint_parts`` runs it after the
        controller fields, where it cannot pre-empt an error the seed would raise.
        """
        self.assert_checkpoint_safe()
        for group_id, group in self._groups.items():
            self._require_prompt(group_id, group)
        return list(self._groups.values())

    def writable_group(self, group_id: str) -> GroupState:
        """One group's live storage after :meth:`writable_groups`' checks of that group.

        For an encoder that re-encodes only the groups that changed since its last
        checkpoint (the snapshot builder's); a refusal may differ from the one
        :meth:`writable_groups` raises first, so such an encoder falls back to the whole
        check on any. The object is the ledger's own: encode it at once; never keep or
        change it.
        """
        group = self._require_group(group_id)
        if not group.status.is_checkpoint_safe():
            raise CheckpointUnsafeError(
                f"rollout recovery contains checkpoint-unsafe group states: groups={[group_id]!r}",
                group_ids=[group_id],
            )
        self._require_prompt(group_id, group)
        return group

    def _require_prompt(self, group_id: str, group: GroupState) -> None:
        payload = self._payloads.get(group_id)
        if payload is None:
            raise InvalidOperationError(
                f"cannot checkpoint recovery group {group_id!r} before its prompt is rehydrated"
            )
        validate_prompt_identity(group.prompt_ref, payload, group_id=group_id)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Self:
        """Build a ledger from a validated state; restored groups have no prompt yet."""
        ledger = cls()
        with paused_gc():
            ledger._groups = decode_ledger_state(state)
        return ledger

    @classmethod
    def from_decoded_groups(cls, groups: list[GroupState]) -> Self:
        """Build a throwaway ledger from groups a codec decoded into the storage schema.

        For readers (``load_sidecar``): like :meth:`from_state_dict`, it takes no cut,
        because a ledger it is building has no barrier and no other holder yet. A typed
        decode of file bytes into ``GroupState`` already did the type checks, so only the
        cross-field invariants run, and the freshly decoded receipts are taken over rather
        than copied. The groups must not be used after. To restore into a live ledger,
        use :meth:`load_decoded_groups`, which takes the cut.
        """
        ledger = cls()
        with paused_gc():
            ledger._groups = check_decoded_groups(groups)
        return ledger

    def load_state_dict(self, cut: MutationCut, state: dict[str, Any]) -> None:
        """Replace this empty ledger's content with a validated checkpoint state."""
        self._require_restorable(cut)
        with paused_gc():
            self._groups = decode_ledger_state(state)
        self._payloads = {}

    def load_decoded_groups(self, cut: MutationCut, groups: list[GroupState]) -> None:
        """:meth:`load_state_dict` for groups a codec decoded into the storage schema.

        The fast restore path: only the cross-field invariants run (see
        :meth:`from_decoded_groups`); the groups must not be used after.
        """
        self._require_restorable(cut)
        with paused_gc():
            self._groups = check_decoded_groups(groups)
        self._payloads = {}

    def _require_restorable(self, cut: MutationCut) -> None:
        cut.require_live()
        if self._groups:
            raise InvalidOperationError(
                "cannot restore into a non-empty rollout recovery ledger "
                f"(it holds {len(self._groups)} groups)"
            )

    # ------------------------------------------------------------------ helpers

    def _require_group(self, group_id: str) -> GroupState:
        try:
            return self._groups[group_id]
        except KeyError:
            raise UnknownGroupError(
                f"unknown recovery group_id={group_id!r}", group_id=str(group_id)
            ) from None

    @staticmethod
    def _require_sibling(group: GroupState, generation_index: int) -> SiblingState:
        if not isinstance(generation_index, int):
            raise InvalidArgumentTypeError(
                f"generation_index must be an int, got {type(generation_index).__name__} "
                f"for group {group.group_id!r}"
            )
        if not 0 <= generation_index < len(group.siblings):
            raise InvalidTransitionError(
                f"generation_index={generation_index} is outside group {group.group_id!r}",
                group_id=group.group_id,
            )
        return group.siblings[generation_index]

    @staticmethod
    def _require_status(group: GroupState, allowed: PromptGroupStatus, *, transition: str) -> None:
        if group.status is not allowed:
            raise InvalidTransitionError(
                f"cannot {transition} group {group.group_id!r} from {group.status.value!r}",
                group_id=group.group_id,
            )
