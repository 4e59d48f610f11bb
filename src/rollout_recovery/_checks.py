"""Input checks shared by the stores and the ledger, refused with a project error."""

from __future__ import annotations

from .errors import BareStringError

__all__ = ["is_utf8_text", "refuse_bare_string"]


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
