"""Run-scoped reward settings: which penalties are on and how low-effort prompts are shaped.

Sealed attempts store the *raw* reward; the final reward is computed later, at finalization,
possibly after a restart. The settings that turn a raw reward into a final one are therefore
part of the checkpoint, and a resumed run must use the same ones. To make "the same" mean
"the same semantics", settings are normalized: inactive options and config extras are dropped,
token ids are sorted and de-duplicated, so two configs that behave identically compare equal.

Config input is plain mappings shaped like NeMo-RL's ``RewardPenaltyConfig`` and
``EffortLevelsConfig``; they are validated by hand here (no pydantic).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..errors import InvalidStateError, JobMismatchError
from ._checks import RewardChecks
from ._final_reward import CaptureRewardOutcome, LinkSpan, finalize_capture_reward
from ._metrics import group_reward_metrics
from ._penalties import CAPTURE_PENALTIES, CaptureOptionalPenalty, CapturePenalty
from ._records import describe_keys

__all__ = [
    "CAPTURE_PENALTIES",
    "CaptureOptionalPenalty",
    "CapturePenalty",
    "CaptureRewardSettings",
    "EffortRewardSettings",
    "effort_shaping_enabled",
]

_PENALTY_FLAGS: Final = tuple(penalty.flag for penalty in CAPTURE_PENALTIES)
_UNWANTED_FLAG: Final = "penalize_unwanted_tokens"
_UNSUPPORTED_FLAG: Final = "penalize_malformed_think_tag"
_STATE_VERSION: Final = 1
_VERSIONED_KEYS: Final = frozenset({"version", "penalties", "effort"})
_UNVERSIONED_KEYS: Final = frozenset({"penalties", "effort"})
_EFFORT_FIELDS: Final = ("low_weight", "low_penalty", "low_ub", "low_string")
_EFFORT_DEFAULTS: Final[Mapping[str, object]] = {
    "low_weight": 0.0,
    "low_penalty": 1.0,
    "low_ub": 64000,
    "low_string": "",
}


@dataclass(frozen=True, slots=True)
class EffortRewardSettings:
    """Active low-effort shaping parameters (an inactive config is represented by ``None``).

    ``low_weight`` scales the length term, ``low_penalty`` scales its negative part, ``low_ub``
    is the length at which the term reaches zero, ``low_string`` marks a low-effort prompt.
    """

    low_weight: float
    low_penalty: float
    low_ub: int
    low_string: str

    def __post_init__(self) -> None:
        for name in ("low_weight", "low_penalty"):
            # Stored as float so that 1 and 1.0 compare and persist identically.
            object.__setattr__(self, name, _finite_float(getattr(self, name), f"effort.{name}"))
        _require_int(self.low_ub, "effort.low_ub")
        if not isinstance(self.low_string, str):
            raise InvalidStateError(
                f"effort.low_string must be a string, got {_describe(self.low_string)}",
                path="$.effort.low_string",
            )
        if not _is_active(self.low_weight, self.low_string):
            raise InvalidStateError(
                "EffortRewardSettings describe active shaping: need low_weight > 0 and a "
                f"nonempty low_string, got low_weight={self.low_weight!r}, "
                f"low_string={self.low_string!r}; use None for inactive shaping",
                path="$.effort",
            )
        if self.low_ub <= 0:
            raise InvalidStateError(
                f"active effort shaping requires low_ub > 0, got low_ub={self.low_ub!r}",
                path="$.effort.low_ub",
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> EffortRewardSettings | None:
        """Validate an ``EffortLevelsConfig``-like mapping; ``None`` when shaping is inactive.

        Extra keys are ignored. ``low_ub <= 0`` is only an error when shaping is active,
        because an inactive config never divides by it.
        """
        if config is None:
            return None
        if not isinstance(config, Mapping):
            raise InvalidStateError(
                f"effort config must be a mapping, got {_describe(config)}", path="$.effort"
            )
        values = {name: config.get(name, _EFFORT_DEFAULTS[name]) for name in _EFFORT_FIELDS}
        low_weight = _finite_float(values["low_weight"], "effort.low_weight")
        _finite_float(values["low_penalty"], "effort.low_penalty")
        _require_int(values["low_ub"], "effort.low_ub")
        low_string = values["low_string"]
        if not isinstance(low_string, str):
            raise InvalidStateError(
                f"effort.low_string must be a string, got {_describe(low_string)}",
                path="$.effort.low_string",
            )
        if not _is_active(low_weight, low_string):
            return None
        return cls(**values)

    def state_dict(self) -> dict[str, Any]:
        """Return the persisted form (the four fields, as ``dataclasses.asdict`` would)."""
        return {name: getattr(self, name) for name in _EFFORT_FIELDS}


def effort_shaping_enabled(config: EffortRewardSettings | Mapping[str, Any] | None) -> bool:
    """Whether low-effort shaping is active: a config with ``low_weight > 0`` and a marker."""
    if isinstance(config, EffortRewardSettings):
        return True  # only active settings can be constructed
    return EffortRewardSettings.from_config(config) is not None


@dataclass(frozen=True, slots=True)
class CaptureRewardSettings:
    """The semantic identity of a run's reward settings, persisted in the checkpoint.

    ``enabled_penalties`` holds config flags in :data:`CAPTURE_PENALTIES` order;
    ``unwanted_tokens`` is sorted, unique and nonempty exactly when the unwanted-token penalty
    is on; ``effort`` is ``None`` unless shaping is active.
    """

    enabled_penalties: tuple[str, ...] = ()
    unwanted_tokens: tuple[int, ...] = ()
    effort: EffortRewardSettings | None = None

    def __post_init__(self) -> None:
        # Construction is the only way in, so normalization is an invariant, not a convention:
        # equality of two settings then means equality of their behaviour.
        flags = self.enabled_penalties
        if not isinstance(flags, tuple) or flags != tuple(f for f in _PENALTY_FLAGS if f in flags):
            raise InvalidStateError(
                "enabled_penalties must be a tuple of distinct flags in the order "
                f"{list(_PENALTY_FLAGS)}, got {flags!r}",
                path="$.enabled_penalties",
            )
        tokens = self.unwanted_tokens
        if not isinstance(tokens, tuple) or any(type(t) is not int for t in tokens):
            raise InvalidStateError(
                f"unwanted_tokens must be a tuple of ints, got {tokens!r}", path="$.unwanted_tokens"
            )
        if tokens != tuple(sorted(set(tokens))):
            raise InvalidStateError(
                f"unwanted_tokens must be sorted and unique, got {tokens!r}",
                path="$.unwanted_tokens",
            )
        if bool(tokens) != (_UNWANTED_FLAG in flags):
            raise InvalidStateError(
                f"unwanted_tokens must be nonempty exactly when {_UNWANTED_FLAG} is enabled; "
                f"got enabled_penalties={flags!r}, unwanted_tokens={tokens!r}",
                path="$.unwanted_tokens",
            )
        if self.effort is not None and not isinstance(self.effort, EffortRewardSettings):
            raise InvalidStateError(
                f"effort must be EffortRewardSettings or None, got {_describe(self.effort)}",
                path="$.effort",
            )

    def penalty_enabled(self, name: CaptureOptionalPenalty) -> bool:
        """Whether the penalty with count name ``name`` (e.g. ``"unwanted_token"``) is on."""
        return _PENALTIES_BY_NAME[name].flag in self.enabled_penalties

    @property
    def needs_reward_checks(self) -> bool:
        """Whether finalization reads :class:`RewardChecks` (shaping or a text penalty is on)."""
        return self.effort is not None or any(
            p.kind == "text" and p.flag in self.enabled_penalties for p in CAPTURE_PENALTIES
        )

    def finalize_reward(
        self,
        reward: float,
        *,
        checks: RewardChecks | None,
        token_ids: Sequence[int],
        link_spans: Sequence[LinkSpan],
    ) -> CaptureRewardOutcome:
        """Shape, then penalize, under these settings: the final reward of one verified row
        (``_final_reward.finalize_capture_reward``)."""
        return finalize_capture_reward(
            reward, settings=self, checks=checks, token_ids=token_ids, link_spans=link_spans
        )

    def group_metrics(self, outcomes: Sequence[CaptureRewardOutcome]) -> dict[str, float]:
        """One group's reward statistics under these settings (``_metrics``), from its valid
        rows' outcomes."""
        return group_reward_metrics(outcomes, settings=self)

    @classmethod
    def from_configs(
        cls,
        *,
        penalties: Mapping[str, Any] | None = None,
        effort: Mapping[str, Any] | None = None,
    ) -> CaptureRewardSettings:
        """Normalize a ``RewardPenaltyConfig``-like and an ``EffortLevelsConfig``-like mapping.

        ``None`` means "not configured". Extras are allowed and dropped; so are options that
        have no effect (token ids while the unwanted-token penalty is off, an inactive effort
        block). ``penalize_malformed_think_tag`` is refused: capture cannot check it.
        """
        enabled, unwanted = _parse_penalty_config({} if penalties is None else penalties)
        return cls(
            enabled_penalties=enabled,
            unwanted_tokens=unwanted,
            effort=EffortRewardSettings.from_config(effort),
        )

    def state_dict(self) -> dict[str, Any]:
        """Return the versioned persisted form (``version`` 1)."""
        penalties: dict[str, Any] = dict.fromkeys(self.enabled_penalties, True)
        if self.unwanted_tokens:
            penalties["token_ids"] = {"unwanted": list(self.unwanted_tokens)}
        return {
            "version": _STATE_VERSION,
            "penalties": penalties,
            "effort": None if self.effort is None else self.effort.state_dict(),
        }

    def to_state(self) -> dict[str, Any]:
        """Old spelling of :meth:`state_dict`; goes once ``cli/_inspect.py`` uses the new one."""
        return self.state_dict()

    @classmethod
    def from_state_dict(cls, value: object) -> CaptureRewardSettings:
        """Parse the persisted form: versioned ``{version, penalties, effort}`` or the older
        unversioned ``{penalties, effort}``; both are revalidated as configs and normalized."""
        if not isinstance(value, dict) or set(value) not in (_VERSIONED_KEYS, _UNVERSIONED_KEYS):
            raise InvalidStateError(
                "invalid capture reward_settings record: expected a mapping with keys "
                f"{sorted(_VERSIONED_KEYS)} or {sorted(_UNVERSIONED_KEYS)}, "
                f"got {describe_keys(value)}",
                path="$.reward_settings",
            )
        if "version" in value:
            version = value["version"]
            # ``type(...) is int`` on purpose: True == 1 must not pass as version 1.
            if type(version) is not int or version != _STATE_VERSION:
                raise InvalidStateError(
                    f"unsupported capture reward_settings version={version!r}; "
                    f"this build reads version {_STATE_VERSION}",
                    path="$.reward_settings.version",
                )
        penalties = value["penalties"]
        if not isinstance(penalties, Mapping):
            raise InvalidStateError(
                "invalid capture reward_settings record: penalties must be a mapping, got "
                f"{_describe(penalties)}",
                path="$.reward_settings.penalties",
            )
        effort = value["effort"]
        if effort is not None and not isinstance(effort, Mapping):
            raise InvalidStateError(
                "invalid capture reward_settings record: effort must be a mapping or null, got "
                f"{_describe(effort)}",
                path="$.reward_settings.effort",
            )
        return cls.from_configs(penalties=penalties, effort=effort)

    def differences(self, current: CaptureRewardSettings) -> list[str]:
        """Name every field in which ``current`` behaves differently from ``self``."""
        diffs = [
            f"penalties.{flag}"
            for flag in _PENALTY_FLAGS
            if (flag in self.enabled_penalties) != (flag in current.enabled_penalties)
        ]
        if self.unwanted_tokens != current.unwanted_tokens:
            diffs.append("penalties.token_ids.unwanted")
        if (self.effort is None) != (current.effort is None):
            diffs.append("effort.enabled")
        elif self.effort is not None and current.effort is not None:
            diffs.extend(
                f"effort.{name}"
                for name in _EFFORT_FIELDS
                if getattr(self.effort, name) != getattr(current.effort, name)
            )
        return diffs

    def require_compatible(
        self, current: CaptureRewardSettings, *, checkpoint: str = "the checkpoint"
    ) -> None:
        """Refuse to resume ``checkpoint``, written under these settings, under ``current``
        (``ControllerCheckpoints.verify`` calls it on every restore): rows finalized after
        the resume would be rewarded differently from the rows of the same run before it. A
        ``JobMismatchError`` naming each differing field: the job is another one, and no
        older checkpoint of the run and no rerun can change that."""
        diffs = self.differences(current)
        if diffs:
            raise JobMismatchError(
                f"capture reward settings differ from {checkpoint}: " + ", ".join(diffs),
                differences=diffs,
            )


_PENALTIES_BY_NAME: Final = {penalty.name: penalty for penalty in CAPTURE_PENALTIES}


def _parse_penalty_config(config: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if not isinstance(config, Mapping):
        raise InvalidStateError(
            f"penalty config must be a mapping, got {_describe(config)}", path="$.penalties"
        )
    for flag in (*_PENALTY_FLAGS, _UNSUPPORTED_FLAG):
        if flag in config and type(config[flag]) is not bool:
            raise InvalidStateError(
                f"penalties.{flag} must be a boolean, got {_describe(config[flag])}",
                path=f"$.penalties.{flag}",
            )
    if config.get(_UNSUPPORTED_FLAG, False):
        raise InvalidStateError(
            f"capture does not support {_UNSUPPORTED_FLAG}: the check needs the raw text "
            "at finalization, which capture does not keep; set it to false",
            path=f"$.penalties.{_UNSUPPORTED_FLAG}",
        )
    enabled = tuple(flag for flag in _PENALTY_FLAGS if config.get(flag, False))
    if _UNWANTED_FLAG not in enabled:
        return enabled, ()  # token ids of a disabled penalty have no effect: drop them
    unwanted = _unwanted_token_ids(config.get("token_ids"))
    if not unwanted:
        raise InvalidStateError(
            f"penalties.{_UNWANTED_FLAG} requires a nonempty token_ids.unwanted list",
            path="$.penalties.token_ids.unwanted",
        )
    return enabled, unwanted


def _unwanted_token_ids(token_ids: object) -> tuple[int, ...]:
    if token_ids is None:
        return ()
    if not isinstance(token_ids, Mapping):
        raise InvalidStateError(
            f"penalties.token_ids must be a mapping, got {_describe(token_ids)}",
            path="$.penalties.token_ids",
        )
    unwanted = token_ids.get("unwanted")
    if unwanted is None:
        return ()
    if not isinstance(unwanted, list | tuple):
        raise InvalidStateError(
            f"penalties.token_ids.unwanted must be a list of ints, got {_describe(unwanted)}",
            path="$.penalties.token_ids.unwanted",
        )
    for index, token in enumerate(unwanted):
        if type(token) is not int or token < 0:
            raise InvalidStateError(
                "penalties.token_ids.unwanted must hold nonnegative ints; "
                f"item {index} is {_describe(token)}",
                path=f"$.penalties.token_ids.unwanted[{index}]",
            )
    return tuple(sorted(set(unwanted)))


def _is_active(low_weight: float, low_string: str) -> bool:
    return low_weight > 0 and bool(low_string)


def _finite_float(value: object, path: str) -> float:
    # bool is an int subclass; a flag slipped into a weight is a config mistake, not 1.0.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidStateError(
            f"{path} must be a number, got {_describe(value)}", path=f"$.{path}"
        )
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer wider than any float
        finite = False
    if not finite:
        raise InvalidStateError(f"{path} must be finite, got {value!r}", path=f"$.{path}")
    return float(value)


def _require_int(value: object, path: str) -> None:
    if type(value) is not int:
        raise InvalidStateError(f"{path} must be an int, got {_describe(value)}", path=f"$.{path}")


def _describe(value: object) -> str:
    return f"{type(value).__name__} {value!r}"
