"""Strict decoding of a schema-3 ledger state dict into storage.

Two steps. Types: a well-formed state converts with one strict ``msgspec.convert`` (C
speed); anything it refuses goes through a Python pass that checks types in the seed's
order with the seed's messages, and accepts what the seed accepts (bools as integers,
missing optional keys). Values: one shared pass checks every cross-field invariant of the
seed (non-empty ids, sibling counts, unique attempt identities, sealed-attempt rules,
prompt references, status consistency, shared admissions).

Every error starts with the seed's message and carries the JSON path of the field at
fault, for example ``$.groups[3].siblings[0].attempts[1].status``. A state that fails any
check yields no ledger: there is no partial load. With several faults in one state, the
one reported may differ from the seed's first (types are checked before values).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import msgspec

from .._bounds import MAX_PLAIN_DEPTH
from .._messages import join_path
from ..errors import InvalidStateError, InvalidStateTypeError
from ..rewards import RewardChecks, parse_reward_log_context
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
from ._lineage import (
    GYM_ONLY_SIDECAR_FIELDS,
    SidecarLineage,
    gym_state_refusal,
    is_gym_capture_key,
    mismatch_error,
)
from ._plain import any_nested_deeper_than, nested_deeper_than
from ._receipts import receipt_staging_keys
from ._storage import (
    AttemptState,
    GroupState,
    PromptRefState,
    RewardLogContextState,
    SiblingState,
    context_state,
    unchecked_plain_copy,
)

__all__ = [
    "check_admission_batches",
    "check_decoded_groups",
    "check_envelope",
    "decode_ledger_state",
    "reject_unknown_fields",
    "typed_prompt_ref",
]

# Dict lookups instead of Enum(value) calls: about ten times cheaper per attempt.
_ATTEMPT_STATUS = {member.value: member for member in RolloutAttemptStatus}
_GROUP_STATUS = {member.value: member for member in PromptGroupStatus}
_PHASE = {member.value: member for member in PromptGroupPhase}
_GRANULARITY = {member.value: member for member in RecoveryGranularity}
_SEALED = RolloutAttemptStatus.SEALED
_GENERATING = PromptGroupStatus.GENERATING


def _fail(message: str, path: str) -> NoReturn:
    raise InvalidStateError(message, path=path)


def reject_unknown_fields(
    mapping: Mapping[Any, Any], *, expected: frozenset[str], context: str, path: str
) -> None:
    """Refuse keys outside the versioned schema instead of silently dropping them."""
    if mapping.keys() <= expected:
        return
    unknown = sorted(set(mapping) - expected, key=repr)
    _fail(f"{context} contains unknown fields: {unknown!r}", path)


def check_envelope(
    state: object,
    *,
    context: str,
    fields: frozenset[str],
    type_message: str,
    version_message: str,
) -> dict[str, Any]:
    """The checks shared by the ledger state and the sidecar around it, in seed order.

    The seed words the two readers' messages differently, so they are passed in:
    ``type_message`` and ``version_message`` are the seed's texts, formatted with the
    offending ``type`` name or ``version``.
    """
    if not isinstance(state, dict):
        raise InvalidStateTypeError(type_message.format(type=type(state).__name__), path="$")
    if not GYM_ONLY_SIDECAR_FIELDS.isdisjoint(state):
        # Where the seed names an unknown field: the whole state is the other lineage's.
        marker = min(GYM_ONLY_SIDECAR_FIELDS & state.keys())
        _fail(gym_state_refusal(context), f"$.{marker}")
    reject_unknown_fields(state, expected=fields, context=context, path="$")
    version = state.get("schema_version")
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or version not in SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS
    ):
        _fail(
            f"{version_message.format(version=version)}; supported versions are "
            f"{sorted(SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS)}",
            "$.schema_version",
        )
    return state


def decode_ledger_state(state: object) -> dict[str, GroupState]:
    """Validate a ``{"schema_version", "groups"}`` state and build storage for it."""
    state = check_envelope(
        state,
        context="rollout recovery state",
        fields=LEDGER_STATE_FIELDS,
        type_message="rollout recovery state must be a dictionary, got {type}",
        version_message="Unsupported rollout-recovery schema version: {version!r}",
    )
    raw_groups = state.get("groups")
    if not isinstance(raw_groups, list):
        _fail("rollout-recovery state must contain a groups list", "$.groups")
    try:
        groups = msgspec.convert(raw_groups, list[GroupState], strict=True)
    except msgspec.ValidationError:
        groups = None
    if groups is None or not _converted_as_the_seed_reads(raw_groups):
        groups = [_typed_group(raw, f"$.groups[{i}]") for i, raw in enumerate(raw_groups)]
    return _check_values(groups, own_receipts=False)


def check_decoded_groups(groups: list[GroupState]) -> dict[str, GroupState]:
    """Value-check groups a codec decoded straight into storage (receipts it owns)."""
    return _check_values(groups, own_receipts=True)


def _converted_as_the_seed_reads(raw_groups: list[Any]) -> bool:
    """Whether a state msgspec converted is also one the seed's type checks accept.

    msgspec is laxer in one place: any array passes for a list, where the seed wants a
    list. A False sends the state through the seed-order path, which reports the seed's
    message. A walk over dict lookups, a fraction of the conversion's cost.
    """
    for group in raw_groups:
        siblings = group["siblings"]
        if type(siblings) is not list:
            return False
        for sibling in siblings:
            attempts = sibling["attempts"]
            if type(attempts) is not list:
                return False
            for attempt in attempts:
                if type(attempt["staging_keys"]) is not list:
                    return False
    return True


# ----------------------------------------------------------------------------- types


def _typed_group(raw: object, path: str) -> GroupState:
    """Seed-order type checks of one group; values are checked later, for both paths."""
    if not isinstance(raw, dict):
        _fail(f"rollout-recovery group must be a mapping, got {type(raw).__name__}", path)
    reject_unknown_fields(
        raw, expected=GROUP_STATE_FIELDS, context="rollout-recovery group", path=path
    )
    for name in ("group_id", "admission_id", "prompt_id"):
        if not isinstance(raw.get(name), str):
            _fail(f"{name} must be a non-empty string, got {raw.get(name)!r}", f"{path}.{name}")
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
    if not isinstance(expected, int):
        _fail(
            f"expected_generations must be a positive integer, got {expected!r}",
            f"{path}.expected_generations",
        )
    raw_siblings = raw.get("siblings")
    if not isinstance(raw_siblings, list):
        _fail(
            f"recovery group {raw['group_id']!r} must contain {expected} siblings",
            f"{path}.siblings",
        )
    raw_status = raw.get("status")
    status = _GROUP_STATUS.get(raw_status) if isinstance(raw_status, str) else None
    if status is None:
        _fail(f"invalid prompt group status={raw_status!r}", f"{path}.status")
    raw_phase = raw.get("phase")
    phase = _PHASE.get(raw_phase) if isinstance(raw_phase, str) else None
    if phase is None:
        _fail(f"invalid prompt group phase={raw_phase!r}", f"{path}.phase")
    siblings = [
        _typed_sibling(raw_sibling, f"{path}.siblings[{index}]")
        for index, raw_sibling in enumerate(raw_siblings)
    ]
    prompt_ref = typed_prompt_ref(raw.get("prompt_ref"), f"{path}.prompt_ref")
    target_step = raw.get("target_step")
    if target_step is not None and not isinstance(target_step, int):
        _fail(f"target_step must be an integer or None, got {target_step!r}", f"{path}.target_step")
    start_weight = raw.get("start_weight_version")
    if not isinstance(start_weight, int):
        _fail(
            f"start_weight_version must be an integer, got {start_weight!r}",
            f"{path}.start_weight_version",
        )
    return GroupState(
        group_id=raw["group_id"],
        admission_id=raw["admission_id"],
        prompt_id=raw["prompt_id"],
        prompt_ref=prompt_ref,
        task_source=task_source,
        recovery_granularity=granularity,
        expected_generations=expected,
        target_step=target_step,
        start_weight_version=start_weight,
        status=status,
        phase=phase,
        siblings=siblings,
    )


def typed_prompt_ref(raw: object, path: str) -> PromptRefState:
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
    return PromptRefState(sample_id, task_name)


def _typed_sibling(raw: object, path: str) -> SiblingState:
    if not isinstance(raw, dict):
        _fail(f"rollout-recovery sibling must be a mapping, got {type(raw).__name__}", path)
    reject_unknown_fields(
        raw, expected=SIBLING_STATE_FIELDS, context="rollout-recovery sibling", path=path
    )
    raw_attempts = raw.get("attempts")
    attempts = (
        [_typed_attempt(a, f"{path}.attempts[{i}]") for i, a in enumerate(raw_attempts)]
        if isinstance(raw_attempts, list)
        else []
    )
    # generation_index and empty attempt lists are value checks, made for both paths.
    return SiblingState(generation_index=raw.get("generation_index"), attempts=attempts)  # type: ignore[arg-type]


def _typed_attempt(raw: object, path: str) -> AttemptState:
    if not isinstance(raw, dict):
        _fail(f"rollout-recovery attempt must be a mapping, got {type(raw).__name__}", path)
    if "attempt_index" in raw:
        # The seed calls it an unknown field; it is another lineage's attempt identity.
        _fail(mismatch_error(SidecarLineage.UUID), f"{path}.attempt_index")
    reject_unknown_fields(
        raw, expected=ATTEMPT_STATE_FIELDS, context="rollout-recovery attempt", path=path
    )
    uuid_bytes = raw.get("attempt_uuid")
    if not isinstance(uuid_bytes, bytes):
        _fail(
            f"attempt_uuid must contain exactly 16 bytes, got {uuid_bytes!r}",
            f"{path}.attempt_uuid",
        )
    raw_status = raw.get("status")
    status = _ATTEMPT_STATUS.get(raw_status) if isinstance(raw_status, str) else None
    if status is None:
        _fail(f"invalid rollout attempt status={raw_status!r}", f"{path}.status")
    checks = _typed_reward_checks(raw.get("reward_checks"), f"{path}.reward_checks")
    context = _typed_log_context(raw.get("reward_log_context"), f"{path}.reward_log_context")
    staging_keys = raw.get("staging_keys")
    if not isinstance(staging_keys, list) or not all(isinstance(k, str) for k in staging_keys):
        _fail(
            f"staging_keys must be a list of strings, got {staging_keys!r}",
            f"{path}.staging_keys",
        )
    # receipt, reward and mask_sample are checked by status in the value pass.
    return AttemptState(
        attempt_uuid=uuid_bytes,
        status=status,
        receipt=raw.get("receipt"),
        reward=raw.get("reward"),
        mask_sample=raw.get("mask_sample"),
        reward_checks=checks,
        reward_log_context=context,
        staging_keys=staging_keys,
    )


def _typed_reward_checks(raw: object, path: str) -> RewardChecks | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.keys() != REWARD_CHECKS_FIELDS:
        _fail(f"invalid reward_checks record: {raw!r}", path)
    try:
        return RewardChecks(**raw)
    except InvalidStateError as error:
        _fail(error.message, join_path(path, error.path))


def _typed_log_context(raw: object, path: str) -> RewardLogContextState | None:
    try:
        return context_state(parse_reward_log_context(raw))
    except InvalidStateError as error:
        _fail(error.message, join_path(path, error.path))


# ---------------------------------------------------------------------------- values


def _check_values(groups: list[GroupState], *, own_receipts: bool) -> dict[str, GroupState]:
    """Cross-field invariants, the same for every type path.

    ``own_receipts``: the receipts were decoded for the ledger alone (from file bytes), so
    no caller can alias them and the deep copy is skipped.
    """
    by_id: dict[str, GroupState] = {}
    seen_uuids: set[bytes] = set()
    # The receipt depth rule, for all receipts in one pass; only if one breaks it does
    # each attempt check its own (to name the one at fault).
    check_depth = any_nested_deeper_than(
        [a.receipt for g in groups for s in g.siblings for a in s.attempts if a.receipt]
    )
    for position, group in enumerate(groups):
        path = f"$.groups[{position}]"
        _check_group(group, path, seen_uuids, own_receipts, check_depth)
        if group.group_id in by_id:
            _fail(f"duplicate recovery group_id={group.group_id!r}", f"{path}.group_id")
        by_id[group.group_id] = group
    check_admission_batches(groups)
    return by_id


def check_admission_batches(groups: Sequence[GroupState]) -> None:
    """Groups of one admission batch must agree on phase and target step.

    The one cross-group rule, shared by the loader and every checkpoint writer
    (``RolloutRecoveryLedger.checkpoint_groups`` and ``checkpoint_parts``, which run it
    after every check the seed makes): a controller admits a batch one call at a time
    inside one cut, so the rule may break between calls, but a checkpoint that breaks it
    could never be restored. The error names both groups; ``path`` is the later one's.
    """
    admissions: dict[str, int] = {}
    for position, group in enumerate(groups):
        first = admissions.setdefault(group.admission_id, position)
        if first == position:
            continue
        other = groups[first]
        if other.phase is group.phase and other.target_step == group.target_step:
            continue
        _fail(
            "rollout recovery groups sharing admission_id="
            f"{group.admission_id!r} disagree on phase or target_step: group "
            f"{other.group_id!r} is {other.phase.value} with target_step={other.target_step!r}, "
            f"group {group.group_id!r} is {group.phase.value} with "
            f"target_step={group.target_step!r}",
            f"$.groups[{position}].admission_id",
        )


class _Fault(Exception):
    """A value fault inside one attempt; the caller adds the attempt's path.

    Paths are built only on failure: formatting one per attempt cost more than the checks.
    """

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def _check_group(
    group: GroupState, path: str, seen_uuids: set[bytes], own_receipts: bool, check_depth: bool
) -> None:
    for name in ("group_id", "admission_id", "prompt_id"):
        if not getattr(group, name):
            _fail(f"{name} must be a non-empty string, got ''", f"{path}.{name}")
    expected = group.expected_generations
    if expected < 1:
        _fail(
            f"expected_generations must be a positive integer, got {expected!r}",
            f"{path}.expected_generations",
        )
    if len(group.siblings) != expected:
        _fail(
            f"recovery group {group.group_id!r} must contain {expected} siblings",
            f"{path}.siblings",
        )
    index = position = 0
    try:
        for index, sibling in enumerate(group.siblings):
            if sibling.generation_index != index:
                raise _Fault(
                    f"generation indices must be contiguous: expected {index}, got "
                    f"{sibling.generation_index!r}",
                    ".generation_index",
                )
            if type(sibling.generation_index) is not int:
                # An equal False or 0.0 passes, as in the seed, which keeps the position.
                sibling.generation_index = index
            if not sibling.attempts:
                raise _Fault(
                    f"logical rollout '{group.group_id}_g{index}' has no attempts", ".attempts"
                )
            gate_prefix = f"{group.group_id}_g{index}_a"
            for position, attempt in enumerate(sibling.attempts):  # noqa: B007
                _check_attempt(attempt, gate_prefix, seen_uuids, own_receipts, check_depth)
    except _Fault as fault:
        where = f"{path}.siblings[{index}]"
        if not fault.field.startswith("."):
            where += f".attempts[{position}]"
        _fail(fault.message, where + fault.field.lstrip("@"))
    if not group.prompt_ref.sample_id:
        _fail("prompt_ref sample_id must be a non-empty string, got ''", f"{path}.prompt_ref")
    if group.prompt_ref.sample_id != group.prompt_id:
        _fail(
            "prompt_ref sample_id must match prompt_id: "
            f"{group.prompt_ref.sample_id!r} != {group.prompt_id!r}",
            f"{path}.prompt_ref.sample_id",
        )
    all_sealed = group.all_current_sealed()
    if group.status is _GENERATING and all_sealed:
        _fail("generating group must retain an unfinished sibling", f"{path}.status")
    if group.status.requires_all_sealed() and not all_sealed:
        _fail(
            f"group state {group.status.value!r} requires every sibling to be sealed",
            f"{path}.status",
        )


def _check_manifest(receipt: dict[str, Any], staging_keys: list[str]) -> None:
    """The manifest must name exactly the attempt's staging keys, in order.

    A fast comprehension covers well-formed receipts; on any doubt the seed's validator
    runs, so a malformed manifest gets its own message rather than a mismatch.
    """
    manifest = receipt.get("manifest")
    if type(manifest) is list:
        try:
            if [entry["staging_key"] for entry in manifest] == staging_keys:
                return
        except (KeyError, TypeError, IndexError):
            pass
    try:
        keys = receipt_staging_keys(receipt)
    except InvalidStateError as error:
        raise _Fault(error.message, join_path("@", error.path)) from error
    if keys != staging_keys:
        raise _Fault("sealed receipt staging manifest mismatch", "@.staging_keys")


def _check_attempt(
    attempt: AttemptState,
    gate_prefix: str,
    seen_uuids: set[bytes],
    own_receipts: bool,
    check_depth: bool,
) -> None:
    uuid_bytes = attempt.attempt_uuid
    if len(uuid_bytes) != 16:
        raise _Fault(
            f"attempt_uuid must contain exactly 16 bytes, got {uuid_bytes!r}", "@.attempt_uuid"
        )
    if uuid_bytes in seen_uuids:
        raise _Fault(f"duplicate rollout attempt identity {uuid_bytes.hex()}", "@.attempt_uuid")
    seen_uuids.add(uuid_bytes)
    if attempt.reward_log_context is not None:
        # The strict conversion checked its shape; the public type checks its values.
        try:
            attempt.reward_log_context.validate()
        except InvalidStateError as error:
            raise _Fault(error.message, join_path("@.reward_log_context", error.path)) from error
    receipt: Any = attempt.receipt
    reward: Any = attempt.reward
    mask_sample: Any = attempt.mask_sample
    if attempt.status is not _SEALED:
        if (
            receipt is not None
            or reward is not None
            or mask_sample is not None
            or attempt.reward_checks is not None
            or attempt.reward_log_context is not None
            or attempt.staging_keys
        ):
            raise _Fault(
                f"only sealed attempts may retain receipt data; status is {attempt.status.value!r}",
                "@",
            )
        return
    if not isinstance(reward, int | float):
        raise _Fault(f"sealed attempts require a reward, got {reward!r}", "@.reward")
    if not isinstance(mask_sample, bool):
        raise _Fault(
            f"sealed attempts require a boolean mask_sample, got {mask_sample!r}",
            "@.mask_sample",
        )
    if type(reward) is not float:
        try:
            attempt.reward = float(reward)
        except OverflowError:
            raise _Fault(
                f"sealed attempts require a reward a float can hold, got {reward!r}", "@.reward"
            ) from None
    if receipt is None:
        if attempt.staging_keys:
            raise _Fault("sealed missing-receipt attempt cannot own staging keys", "@.staging_keys")
        return
    if type(receipt) is not dict:
        raise _Fault(
            f"sealed attempt receipt must be a mapping or None, got {type(receipt).__name__}",
            "@.receipt",
        )
    gate_id = gate_prefix + uuid_bytes.hex()
    if receipt.get("rollout_id") != gate_id:
        found = receipt.get("rollout_id")
        hint = (
            f" ({found!r} is a Gym-lineage capture key, and an attempt of one lineage is "
            "never read as an attempt of the other)"
            if is_gym_capture_key(found, gate_prefix[:-2])
            else ""
        )
        raise _Fault(
            f"sealed receipt identity mismatch: receipt={found!r}, expected={gate_id!r}{hint}",
            "@.receipt.rollout_id",
        )
    _check_manifest(receipt, attempt.staging_keys)
    if check_depth and nested_deeper_than(receipt):
        # What a seal refuses; the .pt reader's whole-file bound is set to match.
        raise _Fault(f"receipt nested deeper than {MAX_PLAIN_DEPTH} levels", "@.receipt")
    if own_receipts:
        return
    # The ledger must not alias the caller's state: keep a private deep copy.
    try:
        attempt.receipt = unchecked_plain_copy(receipt)
    except (TypeError, ValueError) as error:
        raise _Fault(
            f"sealed rollout receipt must hold plain data only: {error}", "@.receipt"
        ) from error
