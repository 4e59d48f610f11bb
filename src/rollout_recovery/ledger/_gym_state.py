"""The Gym lineage's schema-3 sidecar, checked the way its own reader checks it.

NeMo-RL's Gym checkpoint line (PR #4085 and its stack) writes a ``rollout_recovery.pt``
that shares the uuid lineage's schema number and most field names but names an attempt by
a numeric ``attempt_index`` and gates it with the capture key ``<logical>`` (attempt 0) or
``<logical>-a<N>``. The rules here are that line's, as read in its source
(``docs/nemo-rl-lineages.md`` lists the files and commits): every level refuses unknown
fields; attempt indices count 0, 1, 2, ... per sibling; attempt UUIDs are 16 bytes and
unique in the file; a sealed receipt names its attempt's capture key; a completion receipt
names its sibling and attempt; pending acknowledgements are unique per execution.

This package never restores this lineage (its attempts are not the ledger's), so nothing
here builds ledger storage: the result is the validated state, for the readers that
``inspect``, ``validate`` and ``convert`` use. Every fault is an
:class:`~rollout_recovery.errors.InvalidStateError` (or ``InvalidStateTypeError`` where
the upstream reader raises ``TypeError``) whose ``path`` names the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, NoReturn, TypeAlias

from .._messages import join_path
from ..errors import InvalidStateError, InvalidStateTypeError
from ._decode import reject_unknown_fields, typed_prompt_ref
from ._enums import PromptGroupPhase, PromptGroupStatus, RecoveryGranularity, RolloutAttemptStatus
from ._lineage import SidecarLineage, is_uuid_gate_id, mismatch_error
from ._receipts import receipt_staging_keys
from ._sidecar import validate_batch_shortfall

__all__ = [
    "GYM_SIDECAR_FIELDS",
    "SUPPORTED_GYM_SCHEMA_VERSIONS",
    "GymSidecar",
    "SchemaError",
    "gym_capture_key",
    "gym_sidecar_problems",
    "parse_gym_sidecar",
]

SUPPORTED_GYM_SCHEMA_VERSIONS: Final = frozenset({3})
_ACKS: Final = "pending_completed_execution_acknowledgements"
GYM_SIDECAR_FIELDS: Final = frozenset(
    {"schema_version", "groups", _ACKS, "batch_shortfall", "sampler_stamps_target_steps"}
)
_GROUP_FIELDS: Final = frozenset(
    {
        "group_id",
        "admission_id",
        "prompt_id",
        "prompt_ref",
        "task_source",
        "resolved_agent_name",
        "recovery_granularity",
        "expected_generations",
        "target_step",
        "start_weight_version",
        "status",
        "phase",
        "siblings",
    }
)
_SIBLING_FIELDS: Final = frozenset({"generation_index", "attempts"})
_ATTEMPT_FIELDS: Final = frozenset(
    {
        "attempt_index",
        "attempt_uuid",
        "status",
        "receipt",
        "completion_receipt",
        "reward",
        "mask_sample",
        "staging_keys",
    }
)
# A completion receipt as Gym issues it; an acknowledgement carries the same coordinates
# (less the attempt-scoped names) plus the agent it is owed to.
_COMPLETION_FIELDS: Final = frozenset(
    {
        "rollout_id",
        "attempt_index",
        "execution_generation",
        "result_identity",
        "result_digest",
        "manifest_capture_key",
        "terminal_model_call_id",
    }
)
_ACK_FIELDS: Final = _COMPLETION_FIELDS | {"agent_name"}
_COMPLETION_REQUIRED: Final = _COMPLETION_FIELDS - {
    "manifest_capture_key",
    "terminal_model_call_id",
}
# Gym's identity pattern for rollout ids and capture keys: a URL path segment and a file name.
_IDENTITY: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")
_MAX_RESULT_IDENTITY: Final = 512

_STATUS = {member.value: member for member in RolloutAttemptStatus}
_GROUP_STATUS = {member.value: member for member in PromptGroupStatus}
_PHASES = frozenset(member.value for member in PromptGroupPhase)
_GRANULARITIES = frozenset(member.value for member in RecoveryGranularity)
_SEALED = RolloutAttemptStatus.SEALED
# What a check raises: ``InvalidStateTypeError`` where the upstream reader raises TypeError.
SchemaError: TypeAlias = InvalidStateError | InvalidStateTypeError


def gym_capture_key(logical_rollout_id: str, attempt_index: int) -> str:
    """The Gym lineage's gate id of an attempt: ``<logical>`` for 0, ``<logical>-a<N>`` after."""
    return logical_rollout_id if attempt_index == 0 else f"{logical_rollout_id}-a{attempt_index}"


@dataclass(frozen=True, slots=True)
class GymSidecar:
    """A Gym-lineage sidecar that passed every check, as read (nothing is copied)."""

    schema_version: int
    groups: list[dict[str, Any]]
    pending_acknowledgements: list[dict[str, Any]]
    batch_shortfall: dict[int, int]
    sampler_stamps_target_steps: bool | None

    def expected_staging_keys(self) -> set[str]:
        """The staged rows a restore of this sidecar would keep: sealed current attempts'."""
        return {
            key
            for group in self.groups
            for sibling in group["siblings"]
            if sibling["attempts"][-1]["status"] == _SEALED
            for key in sibling["attempts"][-1]["staging_keys"]
        }


def parse_gym_sidecar(state: object) -> GymSidecar:
    """Check a decoded Gym-lineage sidecar; raise its first fault (in document order)."""
    problems = gym_sidecar_problems(state)
    if problems:
        raise problems[0]
    assert isinstance(state, dict)  # no problem means a mapping
    return GymSidecar(
        schema_version=state["schema_version"],
        groups=state["groups"],
        pending_acknowledgements=state[_ACKS],
        batch_shortfall=dict(state.get("batch_shortfall", {})),
        sampler_stamps_target_steps=state.get("sampler_stamps_target_steps"),
    )


def gym_sidecar_problems(state: object) -> list[SchemaError]:
    """Every fault of a Gym-lineage sidecar, in document order; empty when it is valid.

    Each top-level field, each group and each acknowledgement is checked on its own (one
    fault each at most); the rules that span them (unique group ids, attempt UUIDs and
    acknowledgements, agreeing admissions) run over the parts that passed.
    """
    if not isinstance(state, dict):
        return [
            InvalidStateTypeError(
                f"rollout recovery sidecar must contain a dictionary, got {type(state).__name__}",
                path="$",
            )
        ]
    problems: list[SchemaError] = []
    unknown = sorted(set(state) - GYM_SIDECAR_FIELDS, key=repr)
    if unknown:
        problems.append(
            InvalidStateError(
                f"Gym-lineage rollout recovery sidecar contains unknown fields: {unknown!r}",
                path="$",
            )
        )
    _collect(problems, _check_schema_version, state.get("schema_version"))
    _collect(problems, _check_flag, state.get("sampler_stamps_target_steps"))
    _collect(problems, validate_batch_shortfall, state.get("batch_shortfall", {}))
    evidence = _evidence(state)
    groups = state.get("groups")
    good_groups: list[tuple[int, dict[str, Any]]] = []
    if not isinstance(groups, list):
        problems.append(
            InvalidStateTypeError(
                f"rollout recovery groups must be a list, got {type(groups).__name__}",
                path="$.groups",
            )
        )
    else:
        for position, group in enumerate(groups):
            if _collect(problems, _check_group, group, f"$.groups[{position}]", evidence):
                good_groups.append((position, group))
        problems.extend(_cross_group_problems(good_groups))
    acks = state.get(_ACKS)
    if not isinstance(acks, list):
        problems.append(
            InvalidStateTypeError(
                f"rollout recovery {_ACKS} must be a list, got {type(acks).__name__}",
                path=f"$.{_ACKS}",
            )
        )
    else:
        identities: dict[tuple[str, int], int] = {}
        for position, ack in enumerate(acks):
            path = f"$.{_ACKS}[{position}]"
            if not _collect(problems, _check_acknowledgement, ack, path):
                continue
            first = identities.setdefault((ack["rollout_id"], ack["attempt_index"]), position)
            if first != position:
                problems.append(
                    InvalidStateError(
                        "duplicate completed execution acknowledgement identity="
                        f"{(ack['rollout_id'], ack['attempt_index'])!r} (first at "
                        f"$.{_ACKS}[{first}])",
                        path=path,
                    )
                )
    return problems


def _evidence(state: dict[Any, Any]) -> str:
    return f"its field {_ACKS!r}" if _ACKS in state else "its first attempt has attempt_index"


def _collect(problems: list[SchemaError], check: Callable[..., object], *args: Any) -> bool:
    """Run one independent check; record its fault. True when it passed."""
    try:
        check(*args)
    except (InvalidStateError, InvalidStateTypeError) as error:
        problems.append(error)
        return False
    return True


def _fail(message: str, path: str) -> NoReturn:
    raise InvalidStateError(message, path=path)


def _is_int(value: object) -> bool:
    # The upstream reader's test: bool is an int there, except where it says otherwise.
    return isinstance(value, int)


def _is_strict_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_schema_version(version: object) -> None:
    if not _is_strict_int(version) or version not in SUPPORTED_GYM_SCHEMA_VERSIONS:
        _fail(
            f"Unsupported rollout-recovery schema version: {version!r}; the Gym lineage's "
            f"reader supports only {sorted(SUPPORTED_GYM_SCHEMA_VERSIONS)}",
            "$.schema_version",
        )


def _check_flag(value: object) -> None:
    if value is not None and not isinstance(value, bool):
        raise InvalidStateTypeError(
            "rollout recovery sampler_stamps_target_steps must be a boolean, got "
            f"{type(value).__name__}",
            path="$.sampler_stamps_target_steps",
        )


def _check_group(group: object, path: str, evidence: str) -> None:
    if not isinstance(group, dict):
        _fail(f"rollout-recovery group must be a mapping, got {type(group).__name__}", path)
    reject_unknown_fields(
        group, expected=_GROUP_FIELDS, context="rollout-recovery group", path=path
    )
    for name in ("group_id", "admission_id", "prompt_id"):
        value = group.get(name)
        if not isinstance(value, str) or not value:
            _fail(f"{name} must be a non-empty string, got {value!r}", f"{path}.{name}")
    group_id = group["group_id"]
    if _IDENTITY.fullmatch(group_id) is None:
        # Its siblings' capture keys are URL path segments and file names in Gym.
        _fail(
            f"group_id {group_id!r} cannot name Gym capture keys: they must match "
            f"{_IDENTITY.pattern}",
            f"{path}.group_id",
        )
    task_source = group.get("task_source")
    if task_source is not None and not isinstance(task_source, str):
        _fail(f"task_source must be a string or None, got {task_source!r}", f"{path}.task_source")
    agent = group.get("resolved_agent_name")
    if agent is not None and (not isinstance(agent, str) or not agent):
        _fail(
            f"resolved_agent_name must be a non-empty string or None, got {agent!r}",
            f"{path}.resolved_agent_name",
        )
    granularity = group.get("recovery_granularity")
    if not isinstance(granularity, str) or granularity not in _GRANULARITIES:
        _fail(f"invalid recovery_granularity={granularity!r}", f"{path}.recovery_granularity")
    expected = group.get("expected_generations")
    if not isinstance(expected, int) or expected < 1:
        _fail(
            f"expected_generations must be a positive integer, got {expected!r}",
            f"{path}.expected_generations",
        )
    siblings = group.get("siblings")
    if not isinstance(siblings, list) or len(siblings) != expected:
        _fail(f"recovery group {group_id!r} must contain {expected} siblings", f"{path}.siblings")
    raw_status = group.get("status")
    status = _GROUP_STATUS.get(raw_status) if isinstance(raw_status, str) else None
    if status is None:
        _fail(f"invalid prompt group status={raw_status!r}", f"{path}.status")
    phase = group.get("phase")
    if not isinstance(phase, str) or phase not in _PHASES:
        _fail(f"invalid prompt group phase={phase!r}", f"{path}.phase")
    for index, sibling in enumerate(siblings):
        _check_sibling(sibling, index, group_id, f"{path}.siblings[{index}]", evidence)
    _check_prompt_ref(group.get("prompt_ref"), group["prompt_id"], f"{path}.prompt_ref")
    target_step = group.get("target_step")
    if target_step is not None and not _is_int(target_step):
        _fail(f"target_step must be an integer or None, got {target_step!r}", f"{path}.target_step")
    start_weight = group.get("start_weight_version")
    if not _is_int(start_weight):
        _fail(
            f"start_weight_version must be an integer, got {start_weight!r}",
            f"{path}.start_weight_version",
        )
    currents = [sibling["attempts"][-1]["status"] for sibling in siblings]
    all_sealed = all(current == _SEALED for current in currents)
    assert status is not None
    if status is PromptGroupStatus.GENERATING and all_sealed:
        _fail("generating group must retain an unfinished sibling", f"{path}.status")
    if status.requires_all_sealed() and not all_sealed:
        _fail(f"group state {status.value!r} requires every sibling to be sealed", f"{path}.status")
    if all_sealed and agent is None:
        _fail("sealed recovery groups require resolved_agent_name", f"{path}.resolved_agent_name")
    if agent is not None and not any(current == _SEALED for current in currents):
        _fail(
            "resolved_agent_name requires at least one sealed sibling",
            f"{path}.resolved_agent_name",
        )


def _check_prompt_ref(prompt_ref: object, prompt_id: str, path: str) -> None:
    # The same record as the uuid lineage's (G's _PROMPT_REF_STATE_FIELDS and checks).
    sample_id = typed_prompt_ref(prompt_ref, path).sample_id
    if sample_id != prompt_id:
        _fail(
            f"prompt_ref sample_id must match prompt_id: {sample_id!r} != {prompt_id!r}",
            f"{path}.sample_id",
        )


def _check_sibling(sibling: object, index: int, group_id: str, path: str, evidence: str) -> None:
    if not isinstance(sibling, dict):
        _fail(f"rollout-recovery sibling must be a mapping, got {type(sibling).__name__}", path)
    reject_unknown_fields(
        sibling, expected=_SIBLING_FIELDS, context="rollout-recovery sibling", path=path
    )
    generation_index = sibling.get("generation_index")
    if not _is_int(generation_index) or generation_index != index:
        _fail(
            f"generation indices must be contiguous: expected {index}, got {generation_index!r}",
            f"{path}.generation_index",
        )
    logical = f"{group_id}_g{index}"
    attempts = sibling.get("attempts")
    if not isinstance(attempts, list) or not attempts:
        _fail(f"logical rollout {logical!r} has no attempts", f"{path}.attempts")
    for position, attempt in enumerate(attempts):
        _check_attempt(attempt, position, logical, f"{path}.attempts[{position}]", evidence)


def _check_attempt(attempt: object, position: int, logical: str, path: str, evidence: str) -> None:
    if not isinstance(attempt, dict):
        _fail(f"rollout-recovery attempt must be a mapping, got {type(attempt).__name__}", path)
    if "attempt_index" not in attempt:
        _fail(mismatch_error(SidecarLineage.GYM, evidence), f"{path}.attempt_index")
    reject_unknown_fields(
        attempt, expected=_ATTEMPT_FIELDS, context="rollout-recovery attempt", path=path
    )
    attempt_index = attempt["attempt_index"]
    if not _is_strict_int(attempt_index) or attempt_index != position:
        _fail(
            "attempt indices must be contiguous non-negative integers counted from 0: expected "
            f"{position}, got {attempt_index!r}",
            f"{path}.attempt_index",
        )
    uuid_bytes = attempt.get("attempt_uuid")
    if not isinstance(uuid_bytes, bytes) or len(uuid_bytes) != 16:
        _fail(
            f"attempt_uuid must contain exactly 16 bytes, got {uuid_bytes!r}",
            f"{path}.attempt_uuid",
        )
    raw_status = attempt.get("status")
    status = _STATUS.get(raw_status) if isinstance(raw_status, str) else None
    if status is None:
        _fail(f"invalid rollout attempt status={raw_status!r}", f"{path}.status")
    receipt = attempt.get("receipt")
    completion = attempt.get("completion_receipt")
    reward = attempt.get("reward")
    mask_sample = attempt.get("mask_sample")
    staging_keys = attempt.get("staging_keys")
    if not isinstance(staging_keys, list) or not all(isinstance(k, str) for k in staging_keys):
        _fail(
            f"staging_keys must be a list of strings, got {staging_keys!r}", f"{path}.staging_keys"
        )
    if status is not _SEALED:
        if any(value is not None for value in (receipt, completion, reward, mask_sample)) or (
            staging_keys
        ):
            _fail(f"only sealed attempts may retain receipt data; status is {raw_status!r}", path)
        return
    if not isinstance(reward, int | float) or isinstance(reward, bool):
        _fail(f"sealed attempts require a reward, got {reward!r}", f"{path}.reward")
    if not isinstance(mask_sample, bool):
        _fail(
            f"sealed attempts require a boolean mask_sample, got {mask_sample!r}",
            f"{path}.mask_sample",
        )
    capture_key = gym_capture_key(logical, attempt_index)
    if receipt is None:
        if staging_keys:
            _fail("sealed missing-receipt attempt cannot own staging keys", f"{path}.staging_keys")
    elif not isinstance(receipt, dict):
        _fail(
            f"sealed attempt receipt must be a mapping or None, got {type(receipt).__name__}",
            f"{path}.receipt",
        )
    else:
        found = receipt.get("rollout_id")
        if found != capture_key:
            hint = (
                f": {found!r} is a uuid-lineage gate id (<logical>_a<uuid hex>), and an "
                "attempt of one lineage is never read as an attempt of the other"
                if is_uuid_gate_id(found, logical)
                else ""
            )
            _fail(
                f"sealed receipt identity mismatch: receipt={found!r}, expected capture key "
                f"{capture_key!r}{hint}",
                f"{path}.receipt.rollout_id",
            )
        try:
            keys = receipt_staging_keys(receipt)
        except InvalidStateError as error:
            _fail(error.message, join_path(path, error.path))
        if keys != staging_keys:
            _fail("sealed receipt staging manifest mismatch", f"{path}.staging_keys")
    if completion is not None:
        where = f"{path}.completion_receipt"
        _check_completion(completion, where, "Gym completion receipt", _COMPLETION_FIELDS)
        if (completion["rollout_id"], completion["attempt_index"]) != (logical, attempt_index):
            _fail(
                "sealed Gym completion receipt identity mismatch: receipt="
                f"{(completion['rollout_id'], completion['attempt_index'])!r}, expected="
                f"{(logical, attempt_index)!r}",
                where,
            )


def _check_completion(receipt: object, path: str, what: str, fields: frozenset[str]) -> None:
    """A completion receipt's coordinates (an acknowledgement's too, with ``agent_name``)."""
    if not isinstance(receipt, dict):
        _fail(f"{what} must be a mapping, got {type(receipt).__name__}", path)
    reject_unknown_fields(receipt, expected=fields, context=what, path=path)
    missing = sorted(_COMPLETION_REQUIRED - receipt.keys())
    if missing:
        _fail(f"{what} is missing {missing}", path)
    rollout_id = receipt["rollout_id"]
    if not isinstance(rollout_id, str) or _IDENTITY.fullmatch(rollout_id) is None:
        _fail(
            f"{what} rollout_id must match {_IDENTITY.pattern}, got {rollout_id!r}",
            f"{path}.rollout_id",
        )
    attempt_index = receipt["attempt_index"]
    if not _is_strict_int(attempt_index) or attempt_index < 0:
        _fail(
            f"{what} attempt_index must be a non-negative integer, got {attempt_index!r}",
            f"{path}.attempt_index",
        )
    generation = receipt["execution_generation"]
    if not _is_strict_int(generation) or generation < 1:
        _fail(
            f"{what} execution_generation must be a positive integer, got {generation!r}",
            f"{path}.execution_generation",
        )
    identity = receipt["result_identity"]
    if not isinstance(identity, str) or not 1 <= len(identity) <= _MAX_RESULT_IDENTITY:
        _fail(
            f"{what} result_identity must be a string of 1 to {_MAX_RESULT_IDENTITY} "
            f"characters, got {identity!r}",
            f"{path}.result_identity",
        )
    digest = receipt["result_digest"]
    if not isinstance(digest, str) or _SHA256_HEX.fullmatch(digest) is None:
        _fail(
            f"{what} result_digest must be 64 lowercase hex digits, got {digest!r}",
            f"{path}.result_digest",
        )
    capture_key = receipt.get("manifest_capture_key")
    if capture_key is not None and (
        not isinstance(capture_key, str) or _IDENTITY.fullmatch(capture_key) is None
    ):
        _fail(
            f"{what} manifest_capture_key must match {_IDENTITY.pattern} or be None, got "
            f"{capture_key!r}",
            f"{path}.manifest_capture_key",
        )
    call_id = receipt.get("terminal_model_call_id")
    if call_id is not None and (not isinstance(call_id, str) or not call_id):
        _fail(
            f"{what} terminal_model_call_id must be a non-empty string or None, got {call_id!r}",
            f"{path}.terminal_model_call_id",
        )
    if (capture_key is None) != (call_id is None):
        _fail(
            f"{what} model-lineage capture key and terminal call id must be supplied together",
            path,
        )


def _check_acknowledgement(ack: object, path: str) -> None:
    if not isinstance(ack, dict):
        _fail(
            f"completed execution acknowledgement must be a mapping, got {type(ack).__name__}", path
        )
    agent = ack.get("agent_name")
    if not isinstance(agent, str) or not agent:
        _fail(f"acknowledgement agent_name must not be empty, got {agent!r}", f"{path}.agent_name")
    _check_completion(ack, path, "completed execution acknowledgement", _ACK_FIELDS)


def _cross_group_problems(groups: list[tuple[int, dict[str, Any]]]) -> Iterator[InvalidStateError]:
    """Unique group ids and attempt UUIDs; one admission batch agreeing on its admission."""
    first_by_id: dict[str, int] = {}
    first_by_uuid: dict[bytes, str] = {}
    admissions: dict[str, tuple[int, Any, Any]] = {}
    for position, group in groups:
        prefix = f"$.groups[{position}]"
        first = first_by_id.setdefault(group["group_id"], position)
        if first != position:
            yield InvalidStateError(
                f"duplicate recovery group_id={group['group_id']!r} (first at $.groups[{first}])",
                path=f"{prefix}.group_id",
            )
        for s, sibling in enumerate(group["siblings"]):
            for a, attempt in enumerate(sibling["attempts"]):
                where = f"{prefix}.siblings[{s}].attempts[{a}].attempt_uuid"
                seen = first_by_uuid.setdefault(attempt["attempt_uuid"], where)
                if seen != where:
                    yield InvalidStateError(
                        f"duplicate rollout attempt identity {attempt['attempt_uuid'].hex()} "
                        f"(first at {seen})",
                        path=where,
                    )
        signature = (group["phase"], group.get("target_step"))
        other = admissions.setdefault(group["admission_id"], (position, *signature))
        if other[1:] != signature:
            yield InvalidStateError(
                f"rollout recovery groups sharing admission_id={group['admission_id']!r} "
                f"disagree on phase or target_step (with $.groups[{other[0]}])",
                path=f"{prefix}.admission_id",
            )
