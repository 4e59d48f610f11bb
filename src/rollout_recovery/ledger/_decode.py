"""Strict decoding of a schema-3 ledger state dict into storage.

Checks run in the seed's order with the seed's messages (each message starts with the
seed's text, then adds the offending value); every error carries the JSON path of the field
at fault, for example ``$.groups[3].siblings[0].attempts[1].status``. A state that fails
any check produces no ledger at all: there is no partial load.

Deliberately kept from the seed: a missing optional key reads as ``None``; bools pass the
integer checks of ``expected_generations``, ``target_step``, ``start_weight_version`` and
``reward`` (Python ``isinstance``); FINALIZING groups load (``prepare_for_restart`` and
``state_dict`` refuse them later).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from ..errors import InvalidStateError, InvalidStateTypeError
from ..rewards import RewardChecks, RewardLogContext, parse_reward_log_context
from ._constants import (
    ATTEMPT_STATE_FIELDS,
    GROUP_STATE_FIELDS,
    LEDGER_STATE_FIELDS,
    PROMPT_REF_STATE_FIELDS,
    REWARD_CHECKS_FIELDS,
    SIBLING_STATE_FIELDS,
    SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS,
)
from ._enums import (
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)
from ._receipts import freeze_receipt, receipt_staging_keys
from ._records import PromptRef
from ._storage import AttemptState, GroupState

__all__ = ["decode_ledger_state", "reject_unknown_fields"]

# Dict lookups instead of Enum(value) calls: about ten times cheaper per attempt.
_ATTEMPT_STATUS = {member.value: member for member in RolloutAttemptStatus}
_GROUP_STATUS = {member.value: member for member in PromptGroupStatus}
_PHASE = {member.value: member for member in PromptGroupPhase}
_GRANULARITY = {member.value: member for member in RecoveryGranularity}
_SEALED = RolloutAttemptStatus.SEALED


def _fail(message: str, path: str) -> NoReturn:
    raise InvalidStateError(f"{message} (at {path})", path=path)


def reject_unknown_fields(
    mapping: Mapping[Any, Any], *, expected: frozenset[str], context: str, path: str
) -> None:
    """Refuse keys outside the versioned schema instead of silently dropping them."""
    if mapping.keys() <= expected:
        return
    unknown = sorted(set(mapping) - expected, key=repr)
    _fail(f"{context} contains unknown fields: {unknown!r}", path)


def decode_ledger_state(state: object) -> dict[str, GroupState]:
    """Validate a ``{"schema_version", "groups"}`` state and build storage for it."""
    if not isinstance(state, dict):
        raise InvalidStateTypeError(
            f"rollout recovery state must be a dictionary, got {type(state).__name__}",
            path="$",
        )
    reject_unknown_fields(
        state, expected=LEDGER_STATE_FIELDS, context="rollout recovery state", path="$"
    )
    version = state.get("schema_version")
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or version not in SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS
    ):
        _fail(
            f"Unsupported rollout-recovery schema version: {version!r}; supported versions "
            f"are {sorted(SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS)}",
            "$.schema_version",
        )
    raw_groups = state.get("groups")
    if not isinstance(raw_groups, list):
        _fail("rollout-recovery state must contain a groups list", "$.groups")

    groups: dict[str, GroupState] = {}
    seen_uuids: set[bytes] = set()
    for position, raw_group in enumerate(raw_groups):
        path = f"$.groups[{position}]"
        group = _decode_group(raw_group, path=path, seen_uuids=seen_uuids)
        if group.group_id in groups:
            _fail(f"duplicate recovery group_id={group.group_id!r}", f"{path}.group_id")
        groups[group.group_id] = group

    admissions: dict[str, tuple[PromptGroupPhase, int | None]] = {}
    for group in groups.values():
        signature = (group.phase, group.target_step)
        if admissions.setdefault(group.admission_id, signature) != signature:
            _fail(
                "rollout recovery groups sharing admission_id="
                f"{group.admission_id!r} disagree on phase or target_step",
                f"$.groups[{list(groups).index(group.group_id)}].admission_id",
            )
    return groups


def _required_str(raw: dict[str, Any], name: str, path: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str) or not value:
        _fail(f"{name} must be a non-empty string, got {value!r}", f"{path}.{name}")
    return value


def _decode_group(raw: object, *, path: str, seen_uuids: set[bytes]) -> GroupState:
    if not isinstance(raw, dict):
        _fail(f"rollout-recovery group must be a mapping, got {type(raw).__name__}", path)
    reject_unknown_fields(
        raw, expected=GROUP_STATE_FIELDS, context="rollout-recovery group", path=path
    )
    group_id = _required_str(raw, "group_id", path)
    admission_id = _required_str(raw, "admission_id", path)
    prompt_id = _required_str(raw, "prompt_id", path)
    task_source = raw.get("task_source")
    if task_source is not None and not isinstance(task_source, str):
        _fail(f"task_source must be a string or None, got {task_source!r}", f"{path}.task_source")
    raw_granularity = raw.get("recovery_granularity")
    if not isinstance(raw_granularity, str):
        _fail(
            f"recovery_granularity must be a string, got {raw_granularity!r}",
            f"{path}.recovery_granularity",
        )
    granularity = _GRANULARITY.get(raw_granularity)
    if granularity is None:
        _fail(f"invalid recovery_granularity={raw_granularity!r}", f"{path}.recovery_granularity")
    expected = raw.get("expected_generations")
    if not isinstance(expected, int) or expected < 1:
        _fail(
            f"expected_generations must be a positive integer, got {expected!r}",
            f"{path}.expected_generations",
        )
    raw_siblings = raw.get("siblings")
    if not isinstance(raw_siblings, list) or len(raw_siblings) != expected:
        _fail(f"recovery group {group_id!r} must contain {expected} siblings", f"{path}.siblings")
    raw_status = raw.get("status")
    status = _GROUP_STATUS.get(raw_status) if isinstance(raw_status, str) else None
    if status is None:
        _fail(f"invalid prompt group status={raw_status!r}", f"{path}.status")
    raw_phase = raw.get("phase")
    phase = _PHASE.get(raw_phase) if isinstance(raw_phase, str) else None
    if phase is None:
        _fail(f"invalid prompt group phase={raw_phase!r}", f"{path}.phase")

    siblings = [
        _decode_sibling(
            raw_sibling,
            group_id=group_id,
            generation_index=index,
            path=f"{path}.siblings[{index}]",
            seen_uuids=seen_uuids,
        )
        for index, raw_sibling in enumerate(raw_siblings)
    ]
    prompt_ref = _decode_prompt_ref(raw.get("prompt_ref"), prompt_id, f"{path}.prompt_ref")
    target_step = raw.get("target_step")
    if target_step is not None and not isinstance(target_step, int):
        _fail(f"target_step must be an integer or None, got {target_step!r}", f"{path}.target_step")
    start_weight = raw.get("start_weight_version")
    if not isinstance(start_weight, int):
        _fail(
            f"start_weight_version must be an integer, got {start_weight!r}",
            f"{path}.start_weight_version",
        )
    all_sealed = all(attempts[-1].status is _SEALED for attempts in siblings)
    if status is PromptGroupStatus.GENERATING and all_sealed:
        _fail("generating group must retain an unfinished sibling", f"{path}.status")
    if status.requires_all_sealed() and not all_sealed:
        _fail(f"group state {status.value!r} requires every sibling to be sealed", f"{path}.status")
    return GroupState(
        group_id=group_id,
        admission_id=admission_id,
        prompt_id=prompt_id,
        prompt_ref=prompt_ref,
        task_source=task_source,
        recovery_granularity=granularity,
        payload=None,
        expected_generations=expected,
        target_step=target_step,
        start_weight_version=start_weight,
        siblings=siblings,
        phase=phase,
        status=status,
    )


def _decode_prompt_ref(raw: object, prompt_id: str, path: str) -> PromptRef:
    if not isinstance(raw, dict):
        _fail(f"prompt_ref must be a mapping, got {type(raw).__name__}", path)
    reject_unknown_fields(
        raw, expected=PROMPT_REF_STATE_FIELDS, context="rollout-recovery prompt_ref", path=path
    )
    sample_id = raw.get("sample_id")
    task_name = raw.get("task_name")
    if not isinstance(sample_id, str) or not sample_id:
        _fail(f"prompt_ref sample_id must be a non-empty string, got {sample_id!r}", path)
    if task_name is not None and not isinstance(task_name, str):
        _fail(f"prompt_ref task_name must be a string or None, got {task_name!r}", path)
    if sample_id != prompt_id:
        _fail(
            f"prompt_ref sample_id must match prompt_id: {sample_id!r} != {prompt_id!r}",
            f"{path}.sample_id",
        )
    return PromptRef(sample_id=sample_id, task_name=task_name)


def _decode_sibling(
    raw: object,
    *,
    group_id: str,
    generation_index: int,
    path: str,
    seen_uuids: set[bytes],
) -> list[AttemptState]:
    if not isinstance(raw, dict):
        _fail(f"rollout-recovery sibling must be a mapping, got {type(raw).__name__}", path)
    reject_unknown_fields(
        raw, expected=SIBLING_STATE_FIELDS, context="rollout-recovery sibling", path=path
    )
    if raw.get("generation_index") != generation_index:
        _fail(
            f"generation indices must be contiguous: expected {generation_index}, got "
            f"{raw.get('generation_index')!r}",
            f"{path}.generation_index",
        )
    raw_attempts = raw.get("attempts")
    if not isinstance(raw_attempts, list) or not raw_attempts:
        _fail(
            f"logical rollout '{group_id}_g{generation_index}' has no attempts", f"{path}.attempts"
        )
    gate_prefix = f"{group_id}_g{generation_index}_a"
    return [
        _decode_attempt(
            raw_attempt,
            gate_prefix=gate_prefix,
            path=f"{path}.attempts[{position}]",
            seen_uuids=seen_uuids,
        )
        for position, raw_attempt in enumerate(raw_attempts)
    ]


def _decode_attempt(
    raw: object, *, gate_prefix: str, path: str, seen_uuids: set[bytes]
) -> AttemptState:
    if not isinstance(raw, dict):
        _fail(f"rollout-recovery attempt must be a mapping, got {type(raw).__name__}", path)
    reject_unknown_fields(
        raw, expected=ATTEMPT_STATE_FIELDS, context="rollout-recovery attempt", path=path
    )
    uuid_bytes = raw.get("attempt_uuid")
    if not isinstance(uuid_bytes, bytes) or len(uuid_bytes) != 16:
        _fail(
            f"attempt_uuid must contain exactly 16 bytes, got {uuid_bytes!r}",
            f"{path}.attempt_uuid",
        )
    if uuid_bytes in seen_uuids:
        _fail(f"duplicate rollout attempt identity {uuid_bytes.hex()}", f"{path}.attempt_uuid")
    seen_uuids.add(uuid_bytes)
    raw_status = raw.get("status")
    status = _ATTEMPT_STATUS.get(raw_status) if isinstance(raw_status, str) else None
    if status is None:
        _fail(f"invalid rollout attempt status={raw_status!r}", f"{path}.status")
    checks = _decode_reward_checks(raw.get("reward_checks"), f"{path}.reward_checks")
    context = _decode_log_context(raw.get("reward_log_context"), f"{path}.reward_log_context")
    staging_keys = raw.get("staging_keys")
    if not isinstance(staging_keys, list) or not all(type(k) is str for k in staging_keys):
        _fail(
            f"staging_keys must be a list of strings, got {staging_keys!r}", f"{path}.staging_keys"
        )
    receipt = raw.get("receipt")
    reward = raw.get("reward")
    mask_sample = raw.get("mask_sample")
    attempt = AttemptState(bytes(uuid_bytes), status)
    if status is not _SEALED:
        if (
            receipt is not None
            or reward is not None
            or mask_sample is not None
            or checks is not None
            or context is not None
            or staging_keys
        ):
            _fail(f"only sealed attempts may retain receipt data; status is {status.value!r}", path)
        return attempt
    if not isinstance(reward, int | float):
        _fail(f"sealed attempts require a reward, got {reward!r}", f"{path}.reward")
    if not isinstance(mask_sample, bool):
        _fail(
            f"sealed attempts require a boolean mask_sample, got {mask_sample!r}",
            f"{path}.mask_sample",
        )
    if receipt is None:
        if staging_keys:
            _fail("sealed missing-receipt attempt cannot own staging keys", f"{path}.staging_keys")
    elif isinstance(receipt, dict):
        gate_id = gate_prefix + uuid_bytes.hex()
        if receipt.get("rollout_id") != gate_id:
            _fail(
                f"sealed receipt identity mismatch: receipt={receipt.get('rollout_id')!r}, "
                f"expected={gate_id!r}",
                f"{path}.receipt.rollout_id",
            )
        try:
            manifest_keys = receipt_staging_keys(receipt)
        except InvalidStateError as error:
            _fail(str(error), f"{path}.{error.path}")
        if manifest_keys != staging_keys:
            _fail("sealed receipt staging manifest mismatch", f"{path}.staging_keys")
    else:
        _fail(
            f"sealed attempt receipt must be a mapping or None, got {type(receipt).__name__}",
            f"{path}.receipt",
        )
    try:
        blob = freeze_receipt(receipt)
    except InvalidStateError as error:
        _fail(str(error), f"{path}.receipt")
    attempt.seal(
        receipt_blob=blob,
        reward=float(reward),
        mask_sample=mask_sample,
        reward_checks=checks,
        reward_log_context=context,
        staging_keys=tuple(staging_keys),
    )
    return attempt


def _decode_reward_checks(raw: object, path: str) -> RewardChecks | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.keys() != REWARD_CHECKS_FIELDS:
        _fail(f"invalid reward_checks record: {raw!r}", path)
    try:
        return RewardChecks(**raw)
    except InvalidStateError as error:
        _fail(str(error), f"{path}.{error.path}")


def _decode_log_context(raw: object, path: str) -> RewardLogContext | None:
    try:
        return parse_reward_log_context(raw)
    except InvalidStateError as error:
        _fail(str(error), path if error.path is None else f"{path}.{error.path}")
