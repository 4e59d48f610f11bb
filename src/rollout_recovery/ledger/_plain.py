"""Strict copies of plain data: what a receipt may hold so that every sidecar can carry it.

A receipt is sealed once and checkpointed many times. Anything a sidecar format cannot
hold (a set, a datetime, a custom object, a 2^70 integer) is refused when it is sealed,
naming where it sits, rather than failing every later checkpoint. Tuples become lists:
that is what any sidecar round trip gives back anyway.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidStateError

__all__ = ["MAX_PLAIN_DEPTH", "plain_copy"]

# Both sidecar codecs bound nesting at 64; a receipt deeper than that could never load.
MAX_PLAIN_DEPTH = 64
_LEAF_TYPES = frozenset({str, float, bool, bytes, type(None)})
# MessagePack integers: the native format's range, narrower than the .pt codec's.
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


class _NotPlain(Exception):
    def __init__(self, message: str, where: list[str]) -> None:
        super().__init__(message)
        self.message = message
        self.where = where


def plain_copy(value: Any, *, name: str = "receipt") -> Any:
    """A deep copy of ``value`` made of dicts, lists and primitive leaves only.

    Raises :class:`InvalidStateError` whose ``path`` (rooted at ``name``) names the first
    offending value.
    """
    try:
        return _copy(value, 0)
    except _NotPlain as error:
        path = name + "".join(reversed(error.where))
        raise InvalidStateError(f"{error.message} at {path}", path=path) from None


def _copy(value: Any, depth: int) -> Any:
    kind = type(value)
    if kind in _LEAF_TYPES:
        return value
    if kind is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise _NotPlain("integer outside the 64-bit range a sidecar can hold", [])
        return value
    if depth >= MAX_PLAIN_DEPTH:
        raise _NotPlain(f"plain data nested deeper than {MAX_PLAIN_DEPTH} levels", [])
    if kind is dict:
        copied: dict[Any, Any] = {}
        for key, item in value.items():
            if type(key) is not str and type(key) is not int:
                raise _NotPlain(f"mapping key {key!r} of type {type(key).__name__}", [])
            try:
                copied[key] = _copy(item, depth + 1)
            except _NotPlain as error:
                error.where.append(f"[{key!r}]")
                raise
        return copied
    if kind is list or kind is tuple:
        items: list[Any] = []
        for position, item in enumerate(value):
            try:
                items.append(_copy(item, depth + 1))
            except _NotPlain as error:
                error.where.append(f"[{position}]")
                raise
        return items
    raise _NotPlain(f"a {kind.__name__} value, which is not plain data", [])
