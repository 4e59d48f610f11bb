"""The bounds every layer shares, each defined once.

A value inside these bounds can be held by every store and file format the library
writes (MessagePack, NeMo-RL's ``.pt``, the SQLite data plane); each way in refuses
values outside them rather than failing at the next write.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "IDENTIFIER_PATTERN",
    "INT32_MAX",
    "INT64_MAX",
    "MAX_PLAIN_DEPTH",
    "PLAIN_INT_MAX",
    "PLAIN_INT_MIN",
    "RECEIPT_DEPTH_IN_SIDECAR",
    "UINT64_LIMIT",
]

# Token ids: rows store int32.
INT32_MAX: Final = 2**31 - 1
# Counts, steps and versions: a signed 64-bit integer (SQLite, the replay index, msgspec).
INT64_MAX: Final = 2**63 - 1
# Digest inputs that are unsigned 64-bit words: [0, UINT64_LIMIT).
UINT64_LIMIT: Final = 2**64
# Integers inside free-form plain data (receipts): MessagePack's range.
PLAIN_INT_MIN: Final = -(2**63)
PLAIN_INT_MAX: Final = 2**64 - 1
# The one nesting bound for free-form plain data (receipts, row metadata): a seal, both
# sidecar loaders and the data plane all refuse deeper data.
MAX_PLAIN_DEPTH: Final = 64
# A receipt sits this many containers below a sidecar's root
# ($ > groups > group > siblings > sibling > attempts > attempt), so a whole-file bound of
# MAX_PLAIN_DEPTH + RECEIPT_DEPTH_IN_SIDECAR admits exactly the receipts a seal admits.
RECEIPT_DEPTH_IN_SIDECAR: Final = 7
# Rollout ids and model call ids (the two halves of a staging key).
IDENTIFIER_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
