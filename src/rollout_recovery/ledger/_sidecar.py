"""The checkpoint sidecar: ledger state plus the controller state restored with it.

``build_rollout_recovery_state`` and ``parse_rollout_recovery_state`` share one validation
seam, so a sidecar that could not be read back is never written. Parsed values are
defensive copies: mutating the input afterwards does not change them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Required, TypedDict, Unpack

from .._bounds import INT64_MAX
from .._checks import is_utf8_text, refuse_bare_string
from .._gc import paused_gc
from .._messages import join_path
from ..errors import InvalidArgumentTypeError, InvalidStateError, InvalidStateTypeError
from ..rewards import CaptureRewardSettings, FinalizedReward
from ._constants import (
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    SIDECAR_STATE_FIELDS,
    RolloutRecoveryState,
)
from ._decode import check_admission_batches, check_envelope
from ._ledger import RolloutRecoveryLedger
from ._storage import GroupState, groups_to_builtins

__all__ = [
    "ParsedRolloutRecoveryState",
    "SidecarFields",
    "build_rollout_recovery_state",
    "check_sampler_stamps_flag",
    "checkpoint_parts",
    "parse_rollout_recovery_state",
    "validate_batch_shortfall",
]


@dataclass(frozen=True)
class ParsedRolloutRecoveryState:
    """A validated sidecar split by runtime owner."""

    ledger_state: RolloutRecoveryState
    batch_shortfall: dict[int, int]
    sampler_stamps_target_steps: bool | None
    finalizer_metrics_by_group: dict[str, dict[str, float]]
    finalizer_rewards_by_group: dict[str, list[FinalizedReward]]
    reward_settings: CaptureRewardSettings | None


# Both sidecar formats carry 64-bit integers; larger ones are refused when built.
_INT64_MAX = INT64_MAX


def validate_batch_shortfall(value: object) -> dict[int, int]:
    """Copy the per-target-step count of groups that will never arrive (the seed's checks)."""
    if not isinstance(value, dict):
        raise InvalidStateTypeError(
            f"rollout recovery batch_shortfall must be a dictionary, got {type(value).__name__}",
            path="$.batch_shortfall",
        )
    shortfall: dict[int, int] = {}
    for step, count in value.items():
        if type(step) is not int or step < 0 or type(count) is not int or count < 0:
            raise InvalidStateError(
                "rollout recovery batch_shortfall entries must contain non-negative integer "
                f"steps and counts, got {step!r}: {count!r}",
                path=f"$.batch_shortfall[{step!r}]",
            )
        shortfall[step] = count
    return shortfall


def _check_shortfall_bounds(shortfall: dict[int, int]) -> None:
    """Stricter than the seed, and checked after it: both sidecar formats hold 64 bits."""
    for step, count in shortfall.items():
        if step > _INT64_MAX or count > _INT64_MAX:
            raise InvalidStateError(
                "rollout recovery batch_shortfall entries must fit in 64 bits, got "
                f"{step!r}: {count!r}",
                path=f"$.batch_shortfall[{step!r}]",
            )


def _validate_finalizer_metrics(value: object) -> dict[str, dict[str, float]]:
    """Copy per-group finalizer metrics of canonical, not yet trained groups."""
    if not isinstance(value, dict):
        raise InvalidStateError(
            f"finalizer_metrics_by_group must be a mapping, got {type(value).__name__}",
            path="$.finalizer_metrics_by_group",
        )
    result: dict[str, dict[str, float]] = {}
    for group_id, metrics in value.items():
        path = f"$.finalizer_metrics_by_group[{group_id!r}]"
        if not isinstance(group_id, str) or not isinstance(metrics, dict):
            raise InvalidStateError(
                f"invalid finalizer metrics group {group_id!r}: expected a str id and a mapping",
                path=path,
            )
        copied: dict[str, float] = {}
        for name, number in metrics.items():
            # type() rather than isinstance(): a bool is not a metric value.
            if not isinstance(name, str) or type(number) not in (int, float):
                raise InvalidStateError(
                    f"invalid finalizer metric name or value {name!r}: {number!r}",
                    path=f"{path}[{name!r}]",
                )
            try:
                copied[name] = float(number)
            except OverflowError:
                raise InvalidStateError(
                    f"invalid finalizer metric value {name!r}: an integer no float can hold",
                    path=f"{path}[{name!r}]",
                ) from None
        result[group_id] = copied
    return result


def _validate_finalizer_rewards(
    value: object, deferred: list[InvalidStateError]
) -> dict[str, list[FinalizedReward]]:
    """Parse per-group final-reward observations, keeping no alias of the input.

    A row that fails only because a string holds a lone surrogate (the seed takes any
    ``str``; no sidecar can write one) adds its error to ``deferred``, for the caller to
    raise after every check the seed makes.
    """
    if not isinstance(value, dict):
        raise InvalidStateError(
            f"finalizer_rewards_by_group must be a mapping, got {type(value).__name__}",
            path="$.finalizer_rewards_by_group",
        )
    result: dict[str, list[FinalizedReward]] = {}
    for group_id, rows in value.items():
        path = f"$.finalizer_rewards_by_group[{group_id!r}]"
        if not isinstance(group_id, str) or not isinstance(rows, list):
            raise InvalidStateError(
                f"invalid finalized reward group {group_id!r}: expected a str id and a list",
                path=path,
            )
        observations: list[FinalizedReward] = []
        for position, row in enumerate(rows):
            where = f"{path}[{position}]"
            try:
                observations.append(_finalized_reward(row, where, deferred))
            except InvalidStateError as error:
                raise InvalidStateError(error.message, path=join_path(where, error.path)) from error
        if len({row.sample_id for row in observations}) != len(observations):
            raise InvalidStateError(
                f"duplicate finalized reward sample in group {group_id!r}", path=path
            )
        result[group_id] = observations
    return result


def _finalized_reward(
    row: object, where: str, deferred: list[InvalidStateError]
) -> FinalizedReward:
    """One observation; a lone surrogate in it is refused after the seed's checks."""
    if not _holds_lone_surrogate(row):
        return FinalizedReward.from_state_dict(row)
    # The seed's checks run on a copy whose surrogates are escaped (same emptiness, same
    # JSON validity); the real row gives the error the caller raises last.
    observation = FinalizedReward.from_state_dict(_escape_surrogates(row))
    try:
        FinalizedReward.from_state_dict(row)
    except InvalidStateError as error:
        deferred.append(InvalidStateError(error.message, path=join_path(where, error.path)))
    return observation


def _holds_lone_surrogate(value: object) -> bool:
    if isinstance(value, str):
        return not is_utf8_text(value)
    if isinstance(value, dict):
        return any(_holds_lone_surrogate(item) for item in value.values())
    return False


def _escape_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {key: _escape_surrogates(item) for key, item in value.items()}
    return value


def _reward_row_state(group_id: str, row: object) -> dict[str, Any]:
    if not isinstance(row, FinalizedReward):
        raise InvalidStateTypeError(
            f"finalizer_rewards_by_group[{group_id!r}] must hold FinalizedReward values, got "
            f"{type(row).__name__}",
            path=f"$.finalizer_rewards_by_group[{group_id!r}]",
        )
    return row.state_dict()


def check_sampler_stamps_flag(value: object) -> None:
    """The sidecar builder's first check, in the seed's order."""
    if not isinstance(value, bool):
        raise InvalidStateTypeError(
            "rollout recovery sampler_stamps_target_steps must be a boolean, got "
            f"{type(value).__name__}",
            path="$.sampler_stamps_target_steps",
        )


def build_rollout_recovery_state(
    ledger: RolloutRecoveryLedger,
    *,
    batch_shortfall: dict[int, int],
    sampler_stamps_target_steps: bool,
    finalizer_metrics_by_group: dict[str, dict[str, float]] | None = None,
    finalizer_rewards_by_group: dict[str, list[FinalizedReward]] | None = None,
    reward_settings: CaptureRewardSettings | None = None,
    canonical_group_ids: set[str] | None = None,
) -> RolloutRecoveryState:
    """Build the complete versioned sidecar from ledger and controller state.

    With ``canonical_group_ids``, groups the replay index already owns leave the ledger
    part, and finalizer observations are kept only for those canonical groups (the others'
    observations would be orphans after a restore).
    """
    groups, controller = checkpoint_parts(
        ledger,
        operation="build_rollout_recovery_state",
        batch_shortfall=batch_shortfall,
        sampler_stamps_target_steps=sampler_stamps_target_steps,
        finalizer_metrics_by_group=finalizer_metrics_by_group,
        finalizer_rewards_by_group=finalizer_rewards_by_group,
        reward_settings=reward_settings,
        canonical_group_ids=canonical_group_ids,
    )
    with paused_gc():
        state: RolloutRecoveryState = {
            "schema_version": ROLLOUT_RECOVERY_SCHEMA_VERSION,
            "groups": groups_to_builtins(groups),
        }
    # checkpoint_parts already ran the reader's validation seam on every field added here;
    # the groups come from the ledger's storage, whose checks are the loader's.
    state.update(controller)
    return state


class SidecarFields(TypedDict, total=False):
    """The controller's part of a sidecar, as the encoders take it (keyword arguments)."""

    batch_shortfall: Required[dict[int, int]]
    sampler_stamps_target_steps: Required[bool]
    finalizer_metrics_by_group: dict[str, dict[str, float]] | None
    finalizer_rewards_by_group: dict[str, list[FinalizedReward]] | None
    reward_settings: CaptureRewardSettings | None
    canonical_group_ids: set[str] | None


def checkpoint_parts(
    ledger: RolloutRecoveryLedger, *, operation: str, **fields: Unpack[SidecarFields]
) -> tuple[list[GroupState], dict[str, Any]]:
    """A sidecar's two parts: the ledger groups it writes and the controller fields.

    Every encoder goes through here (:func:`build_rollout_recovery_state` and the native
    encoder that works from ledger storage), so the same bad input raises the same error
    in the seed's order: the flag's type, then the ledger's checks, then the controller
    fields, which pass the reader's own validation seam. Ours, stricter, come last, so
    whenever the seed refuses a sidecar it is refused with the seed's error type.
    """
    unexpected = sorted(set(fields) - SidecarFields.__annotations__.keys())
    missing = sorted(SidecarFields.__required_keys__ - set(fields))
    if unexpected or missing:
        raise InvalidArgumentTypeError(
            f"{operation}() got unexpected keyword arguments {unexpected} or lacks the "
            f"required {missing}"
        )
    batch_shortfall = fields["batch_shortfall"]
    sampler_stamps_target_steps = fields["sampler_stamps_target_steps"]
    finalizer_metrics_by_group = fields.get("finalizer_metrics_by_group")
    finalizer_rewards_by_group = fields.get("finalizer_rewards_by_group")
    reward_settings = fields.get("reward_settings")
    canonical_group_ids = fields.get("canonical_group_ids")
    # The seed's order: the flag, the ledger's state_dict checks, each controller field,
    # the canonical filter, then the reader's validation seam.
    check_sampler_stamps_flag(sampler_stamps_target_steps)
    groups = ledger.writable_groups()
    shortfall = validate_batch_shortfall(batch_shortfall)
    controller: dict[str, Any] = {
        "batch_shortfall": shortfall,
        "sampler_stamps_target_steps": sampler_stamps_target_steps,
        "finalizer_metrics_by_group": _validate_finalizer_metrics(finalizer_metrics_by_group or {}),
        "reward_settings": reward_settings.state_dict() if reward_settings is not None else None,
        "finalizer_rewards_by_group": {
            group_id: [_reward_row_state(group_id, row) for row in rows]
            for group_id, rows in (finalizer_rewards_by_group or {}).items()
        },
    }
    if canonical_group_ids is not None:
        try:
            groups = [group for group in groups if group.group_id not in canonical_group_ids]
            for key in ("finalizer_metrics_by_group", "finalizer_rewards_by_group"):
                controller[key] = {
                    group_id: value
                    for group_id, value in controller[key].items()
                    if group_id in canonical_group_ids
                }
        except TypeError as error:  # where the seed's ``in`` raises it
            refuse_bare_string(canonical_group_ids, what="canonical_group_ids", operation=operation)
            raise InvalidArgumentTypeError(
                f"{operation}: canonical_group_ids must be a collection of group ids, got "
                f"{type(canonical_group_ids).__name__} ({error})"
            ) from None
    parse_rollout_recovery_state(
        {"schema_version": ROLLOUT_RECOVERY_SCHEMA_VERSION, "groups": [], **controller}
    )
    # Stricter than the seed, after all of its checks: no bare string of ids, and a sidecar
    # its own restore would refuse (two groups of one admission batch that disagree) is
    # never written.
    refuse_bare_string(canonical_group_ids, what="canonical_group_ids", operation=operation)
    check_admission_batches(groups)
    return groups, controller


def parse_rollout_recovery_state(state: object) -> ParsedRolloutRecoveryState:
    """Validate a complete sidecar and split it by runtime owner.

    Group contents are validated by the ledger when it loads ``ledger_state``.
    """
    state = check_envelope(
        state,
        context="rollout recovery sidecar",
        fields=SIDECAR_STATE_FIELDS,
        type_message="rollout recovery sidecar must contain a dictionary, got {type}",
        version_message="unsupported rollout recovery schema_version={version!r}",
    )
    version = state["schema_version"]
    groups = state.get("groups")
    if not isinstance(groups, list):
        raise InvalidStateTypeError(
            f"rollout recovery groups must be a list, got {type(groups).__name__}",
            path="$.groups",
        )
    stamps = state.get("sampler_stamps_target_steps")
    if stamps is not None and not isinstance(stamps, bool):
        raise InvalidStateTypeError(
            "rollout recovery sampler_stamps_target_steps must be a boolean, got "
            f"{type(stamps).__name__}",
            path="$.sampler_stamps_target_steps",
        )
    for key in ("reward_settings", "finalizer_metrics_by_group", "finalizer_rewards_by_group"):
        if key not in state:
            raise InvalidStateError(f"rollout recovery sidecar is missing {key!r}", path=f"$.{key}")
    raw_settings: Any = state["reward_settings"]
    reward_settings = (
        CaptureRewardSettings.from_state_dict(raw_settings) if raw_settings is not None else None
    )
    metrics = _validate_finalizer_metrics(state["finalizer_metrics_by_group"])
    deferred: list[InvalidStateError] = []
    rewards = _validate_finalizer_rewards(state["finalizer_rewards_by_group"], deferred)
    orphans = sorted(set(rewards) - set(metrics))
    if orphans:
        raise InvalidStateError(
            "finalized reward observations require matching group metrics; missing for "
            f"{orphans[:10]!r}",
            path="$.finalizer_rewards_by_group",
        )
    shortfall = validate_batch_shortfall(state.get("batch_shortfall", {}))
    # Stricter than the seed, after all of its checks.
    if deferred:
        raise deferred[0]
    _check_shortfall_bounds(shortfall)
    return ParsedRolloutRecoveryState(
        ledger_state={"schema_version": version, "groups": groups},
        batch_shortfall=shortfall,
        sampler_stamps_target_steps=stamps,
        finalizer_metrics_by_group=metrics,
        finalizer_rewards_by_group=rewards,
        reward_settings=reward_settings,
    )
