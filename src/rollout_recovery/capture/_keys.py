"""Staging keys: ``{rollout_id}/{model_call_id}``, the name of one staged token delta.

Both parts use the identifier alphabet of the contract (``^[A-Za-z0-9][A-Za-z0-9._-]*$``):
no ``/`` inside a part, so a key splits back into exactly one pair, and no leading dot, so
a part is also safe as a file name.
"""

from __future__ import annotations

import re
import uuid

from .._bounds import IDENTIFIER_PATTERN
from ..errors import InvalidArgumentError, InvalidStateError

__all__ = [
    "IDENTIFIER_PATTERN",
    "STAGING_KEY_PATTERN",
    "is_identifier",
    "new_model_call_id",
    "parse_staging_key",
    "staging_key",
]

STAGING_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"

# fullmatch, not match: ``$`` alone would accept a trailing newline.
_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def is_identifier(value: object) -> bool:
    """True when ``value`` is a str usable as a rollout id or a model call id."""
    return isinstance(value, str) and _IDENTIFIER.fullmatch(value) is not None


def _require_identifier(
    value: object, name: str, error: type[InvalidArgumentError | InvalidStateError]
) -> str:
    if not is_identifier(value):
        raise error(
            f"{name} must be a non-empty identifier matching {IDENTIFIER_PATTERN}, got {value!r}",
            path=f"$.{name}",
        )
    assert isinstance(value, str)
    return value


def staging_key(rollout_id: str, model_call_id: str) -> str:
    """The staging key of one model call; raises ``InvalidArgumentError`` for a bad part."""
    return (
        f"{_require_identifier(rollout_id, 'rollout_id', InvalidArgumentError)}/"
        f"{_require_identifier(model_call_id, 'model_call_id', InvalidArgumentError)}"
    )


def parse_staging_key(key: str) -> tuple[str, str]:
    """Split a staging key into ``(rollout_id, model_call_id)``, validating both parts."""
    if not isinstance(key, str) or key.count("/") != 1:
        raise InvalidStateError(
            f"staging key must be '<rollout_id>/<model_call_id>', got {key!r}", path="$.staging_key"
        )
    rollout_id, model_call_id = key.split("/")
    return (
        _require_identifier(rollout_id, "rollout_id", InvalidStateError),
        _require_identifier(model_call_id, "model_call_id", InvalidStateError),
    )


def new_model_call_id() -> str:
    """A fresh model call id; every physical request gets its own, retries included."""
    return uuid.uuid4().hex
