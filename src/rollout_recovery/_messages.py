"""Pieces of error messages: bounded key lists and rooted JSON-style paths.

Below ``errors`` (which formats its keys with them); every module that words an error or
locates it in a nested value uses these, so messages read the same everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MAX_LISTED_KEYS", "format_keys", "join_path", "split_validation_path"]

# Messages list at most this many ids: enough to debug, bounded for a 10^5-key inventory.
MAX_LISTED_KEYS = 10


def split_validation_path(message: str) -> tuple[str, str | None]:
    """Split msgspec's ``"... - at `$.a[0].b`"`` into the message and its JSON path.

    The path is ``None`` when the message names none.
    """
    head, marker, tail = message.rpartition(" - at `")
    if not marker or not tail.endswith("`"):
        return message, None
    # A bad mapping key reads "- at `key` in `$.path`": the path is the mapping's.
    tail = tail.removeprefix("key` in `")
    if tail.startswith("$"):
        return head, tail[:-1]
    return message, None


def join_path(prefix: str, child: str | None) -> str:
    """``$.groups[3]`` + ``$.status`` -> ``$.groups[3].status``: a rooted path inside another.

    ``child`` is rooted at the value ``prefix`` names; ``None`` (no location) gives ``prefix``.
    """
    if child is None or child == "$":
        return prefix
    return prefix + child.removeprefix("$")


def format_keys(keys: Sequence[str]) -> str:
    """``['a', 'b'] (total=2)``: the first few keys of a list, for error messages."""
    shown = sorted(keys)[:MAX_LISTED_KEYS]
    return f"{shown!r} (total={len(keys)})"
