"""Reward records that travel with a sealed attempt and a finalized row.

These are the small, frozen values the ledger persists per sealed attempt
(``RewardLogContext``; ``RewardChecks`` lives with its checks, ``_checks.py``) and the
sidecar persists per finalized canonical row (``FinalizedReward``). They validate on
construction so an invalid value can never reach a checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .._checks import is_utf8_text
from ..errors import InvalidStateError

__all__ = [
    "FinalizedReward",
    "RewardLogContext",
    "parse_reward_log_context",
]

_REWARD_LOG_CONTEXT_FIELDS = frozenset({"agent_name", "full_result_json"})
_FINALIZED_REWARD_FIELDS = frozenset({"sample_id", "rollout_id", "reward", "log_context"})


@dataclass(frozen=True, slots=True)
class RewardLogContext:
    """Which agent produced a rollout and, optionally, its full result as a JSON object."""

    agent_name: str
    full_result_json: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.agent_name, str) or not self.agent_name:
            raise InvalidStateError(
                f"reward log agent_name must be a nonempty string, got {self.agent_name!r}",
                path="$.agent_name",
            )
        _require_utf8("reward log agent_name", self.agent_name, "agent_name")
        if self.full_result_json is None:
            return
        if not isinstance(self.full_result_json, str):
            raise InvalidStateError(
                "reward log full_result_json must encode an object, got "
                f"{type(self.full_result_json).__name__}",
                path="$.full_result_json",
            )
        _require_utf8("reward log full_result_json", self.full_result_json, "full_result_json")
        try:
            decoded = json.loads(self.full_result_json)
        except (ValueError, RecursionError) as error:  # RecursionError: hostile nesting
            raise InvalidStateError(
                f"reward log full_result_json must encode an object: {error}",
                path="$.full_result_json",
            ) from error
        if not isinstance(decoded, dict):
            raise InvalidStateError(
                "reward log full_result_json must encode an object, got JSON "
                f"{type(decoded).__name__}",
                path="$.full_result_json",
            )


def _require_utf8(what: str, text: str, path: str) -> None:
    """Every sidecar holds UTF-8: a lone surrogate could be held but never written."""
    if not is_utf8_text(text):
        raise InvalidStateError(
            f"{what} must be UTF-8 encodable (it holds a lone surrogate), got {text!r}",
            path=f"$.{path}",
        )


def parse_reward_log_context(value: object) -> RewardLogContext | None:
    """Parse the persisted form of a :class:`RewardLogContext` (``None`` stays ``None``)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != _REWARD_LOG_CONTEXT_FIELDS:
        raise InvalidStateError(
            "invalid reward log context: expected a mapping with exactly "
            f"{sorted(_REWARD_LOG_CONTEXT_FIELDS)}, got {describe_keys(value)}"
        )
    return RewardLogContext(
        agent_name=value["agent_name"], full_result_json=value["full_result_json"]
    )


@dataclass(frozen=True, slots=True)
class FinalizedReward:
    """The final (shaped, then penalized) reward of one valid canonical row."""

    sample_id: str
    rollout_id: str
    reward: float
    log_context: RewardLogContext | None = None

    def __post_init__(self) -> None:
        for name in ("sample_id", "rollout_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidStateError(
                    f"finalized reward identifiers must be nonempty strings; {name}={value!r}",
                    path=f"$.{name}",
                )
            _require_utf8("finalized reward identifiers", value, name)
        if self.log_context is not None and not isinstance(self.log_context, RewardLogContext):
            # Without this, a raw dict slips in and only fails later, inside state_dict().
            raise InvalidStateError(
                "finalized reward log_context must be a RewardLogContext or None, got "
                f"{type(self.log_context).__name__}",
                path="$.log_context",
            )
        if type(self.reward) not in (int, float):
            raise InvalidStateError(
                f"finalized reward must be numeric, got {type(self.reward).__name__} "
                f"{self.reward!r}",
                path="$.reward",
            )

    def state_dict(self) -> dict[str, Any]:
        """Return the persisted form (what ``dataclasses.asdict`` gives, without its cost)."""
        context = self.log_context
        return {
            "sample_id": self.sample_id,
            "rollout_id": self.rollout_id,
            "reward": self.reward,
            "log_context": None
            if context is None
            else {"agent_name": context.agent_name, "full_result_json": context.full_result_json},
        }

    @classmethod
    def from_state_dict(cls, value: object) -> FinalizedReward:
        """Parse the persisted form, rejecting missing or unknown fields."""
        if not isinstance(value, dict) or set(value) != _FINALIZED_REWARD_FIELDS:
            raise InvalidStateError(
                "invalid finalized reward observation: expected a mapping with exactly "
                f"{sorted(_FINALIZED_REWARD_FIELDS)}, got {describe_keys(value)}"
            )
        return cls(
            sample_id=value["sample_id"],
            rollout_id=value["rollout_id"],
            reward=value["reward"],
            log_context=parse_reward_log_context(value["log_context"]),
        )


def describe_keys(value: object) -> str:
    """``keys ['a', 'b']`` for a mapping, else the type's name: for "expected exactly" errors."""
    if isinstance(value, dict):
        return f"keys {sorted(map(str, value))}"
    return type(value).__name__
