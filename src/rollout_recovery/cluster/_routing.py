"""Which shard holds a row: every row of one prompt group on the same shard.

Staging keys are ``{group}_g{i}_a{hex}/{call}`` and canonical keys ``{group}_g{i}``; both
route by ``{group}``. So a group's publication (its N canonical rows, then the clear of its
staged rows) touches one shard, and each of those calls is one SQLite transaction there:
the controller's puts stay all or nothing without a cross-shard protocol. A key of any
other shape routes by itself. The hash is SHA-256, stable across processes and runs (the
built-in ``hash`` of a str is salted per process).
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["group_of", "shard_of"]

_GROUPED = re.compile(r"^(?P<group>.+?)_g\d+(?:_a[0-9A-Za-z]+/.+)?$")


def group_of(key: str) -> str:
    """The prompt group a row key belongs to (the key itself when it names none)."""
    match = _GROUPED.match(key)
    return match.group("group") if match else key


def shard_of(key: str, shards: int) -> int:
    digest = hashlib.sha256(group_of(key).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards
