"""Receipts as the ledger keeps them: validated once, stored frozen, copied out on read.

A sealed attempt's receipt is stored as one MessagePack blob rather than a nested dict.
Encoding is the deep copy the contract asks for (a caller can never alias ledger state),
decoding gives every reader a fresh dict, and the blob is a fraction of a dict tree's size.
The price: a receipt must be plain data (str-keyed mappings, lists, str, int, float, bool,
None, bytes); tuples come back as lists. That is what a sidecar can hold anyway.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..errors import InvalidStateError

__all__ = [
    "freeze_receipt",
    "receipt_staging_keys",
    "thaw_receipt",
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def receipt_staging_keys(receipt: dict[str, Any] | None) -> list[str]:
    """Validate a terminal receipt's manifest and return its staging keys in order."""
    if receipt is None:
        return []
    if not isinstance(receipt, dict):
        raise InvalidStateError(
            f"sealed attempt receipt must be a mapping or None, got {type(receipt).__name__}",
            path="receipt",
        )
    manifest = receipt.get("manifest")
    if not isinstance(manifest, list):
        raise InvalidStateError(
            f"sealed rollout receipt must contain a manifest list, got {type(manifest).__name__}",
            path="receipt.manifest",
        )
    staging_keys: list[str] = []
    for position, entry in enumerate(manifest):
        key = entry.get("staging_key") if isinstance(entry, dict) else None
        if not isinstance(key, str):
            raise InvalidStateError(
                "sealed rollout receipt manifest entries must contain string staging_key "
                f"values; entry {position} is {entry!r}",
                path=f"receipt.manifest[{position}].staging_key",
            )
        staging_keys.append(key)
    return staging_keys


def freeze_receipt(receipt: dict[str, Any] | None) -> bytes | None:
    """Deep-copy a receipt into the ledger's frozen form."""
    if receipt is None:
        return None
    try:
        return _encoder.encode(receipt)
    except (TypeError, ValueError, OverflowError) as error:
        raise InvalidStateError(
            f"sealed rollout receipt must hold plain data only: {error}", path="receipt"
        ) from error


def thaw_receipt(blob: bytes | None) -> dict[str, Any] | None:
    """Return a fresh, caller-owned copy of a frozen receipt."""
    if blob is None:
        return None
    receipt: dict[str, Any] = _decoder.decode(blob)
    return receipt
