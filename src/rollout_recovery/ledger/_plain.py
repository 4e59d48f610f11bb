"""Strict copies of plain data: what a receipt may hold so that every sidecar can carry it.

A receipt is sealed once and checkpointed many times. Anything a sidecar format cannot
hold, or would read back differently, is refused when it is sealed, naming where it sits,
rather than failing every later checkpoint or restore: a set, a datetime, a custom object,
an integer outside 64 bits, a string with lone surrogates, a mapping key that is not a
string (receipts are JSON-like, and the native format types them so). Tuples become lists:
that is what any sidecar round trip gives back anyway.
"""

from __future__ import annotations

from typing import Any

from .._bounds import MAX_PLAIN_DEPTH, PLAIN_INT_MAX, PLAIN_INT_MIN
from .._checks import is_utf8_text
from ..errors import InvalidStateError

__all__ = ["any_nested_deeper_than", "nested_deeper_than", "validated_plain_copy"]

_CONTAINERS = frozenset({dict, list})
_LEAF_TYPES = frozenset({float, bool, bytes, type(None)})
# MessagePack integers: the native format's range, narrower than the .pt codec's.
_INT_MIN = PLAIN_INT_MIN
_INT_MAX = PLAIN_INT_MAX


class _NotPlain(Exception):
    def __init__(self, message: str, where: list[str]) -> None:
        super().__init__(message)
        self.message = message
        self.where = where


def validated_plain_copy(value: Any, *, name: str = "receipt") -> Any:
    """A deep copy of ``value`` made of dicts, lists and primitive leaves only.

    Validates as it copies (compare ``unchecked_plain_copy`` in ``_storage``, which trusts
    its input). Raises :class:`InvalidStateError` whose ``path`` (``$.{name}...``) names
    the first offending value.
    """
    try:
        return _copy(value, 0)
    except _NotPlain as error:
        path = f"$.{name}" + "".join(reversed(error.where))
        raise InvalidStateError(error.message, path=path) from None


def _copy(value: Any, depth: int) -> Any:
    kind = type(value)
    if kind in _LEAF_TYPES:
        return value
    if kind is str:
        if not is_utf8_text(value):
            raise _NotPlain("a string with lone surrogates, which UTF-8 cannot carry", [])
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
            if type(key) is not str or not is_utf8_text(key):
                raise _NotPlain(
                    f"mapping key {key!r}: receipt keys must be UTF-8 encodable strings", []
                )
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


def any_nested_deeper_than(roots: list[Any], limit: int = MAX_PLAIN_DEPTH) -> bool:
    """:func:`nested_deeper_than` for many values at once, level by level.

    One comprehension per level instead of a call per container: for the 10^5 receipts of
    a large ledger this is what keeps the depth rule off the restore's critical path. A
    True only says that some value is too deep; the caller finds which (rare, the error
    path) with :func:`nested_deeper_than`.
    """
    level = [root for root in roots if type(root) is dict or type(root) is list]
    for _ in range(limit):
        level = [
            item
            for container in level
            for item in (container.values() if type(container) is dict else container)
            if type(item) is dict or type(item) is list
        ]
        if not level:
            return False
    return True


def nested_deeper_than(value: dict[Any, Any] | list[Any], limit: int = MAX_PLAIN_DEPTH) -> bool:
    """Whether a dict or list holds containers more than ``limit`` levels deep (itself is 1).

    For data a typed decoder already proved acyclic; only containers are visited, and a
    container of leaves is cleared in C.
    """
    items = value.values() if type(value) is dict else value
    if _CONTAINERS.isdisjoint(map(type, items)):
        return False
    if limit <= 1:
        return True
    for item in items:
        kind = type(item)
        if (kind is dict or kind is list) and nested_deeper_than(item, limit - 1):
            return True
    return False
