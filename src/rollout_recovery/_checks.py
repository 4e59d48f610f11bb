"""Input checks shared by the stores (and every wrapper around one) and the ledger, refused
with a project error."""

from __future__ import annotations

from collections.abc import Iterable

from .errors import BareStringError, InvalidRowError

__all__ = [
    "check_key",
    "check_keys_argument",
    "check_partition",
    "is_utf8_text",
    "refuse_bare_string",
]


def is_utf8_text(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (no lone surrogates).

    Every file and store the library writes holds UTF-8; a string that cannot be encoded is
    refused where it comes in rather than failing at the next write or use.
    """
    if text.isascii():  # the common case, checked in C without encoding
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def refuse_bare_string(value: object, *, what: str, operation: str) -> None:
    """Raise :class:`BareStringError` if ``value`` is a str or bytes, not a collection."""
    if isinstance(value, str | bytes | bytearray):
        raise BareStringError(
            f"{operation}: {what} must be a collection of str, got a single "
            f"{type(value).__name__} {value!r}; wrap it in a list"
        )


def _check_text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRowError(
            f"{what} must be a non-empty str, got {value!r} of type {type(value).__name__}",
            key=value if isinstance(value, str) else None,
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        # Both backends must accept the same keys; SQLite stores text as UTF-8.
        raise InvalidRowError(
            f"{what} {value!r} is not valid UTF-8 text: {exc}", key=value
        ) from None
    return value


def check_partition(partition: object) -> str:
    return _check_text(partition, "partition name")


def check_key(key: object) -> str:
    return _check_text(key, "row key")


def check_keys_argument(keys: Iterable[str], *, operation: str) -> list[str]:
    """Materialize a keys argument; a bare str is refused because iterating it would
    silently address one-character keys."""
    refuse_bare_string(keys, what="keys", operation=operation)
    return [check_key(key) for key in keys]
