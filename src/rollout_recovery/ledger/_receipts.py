"""The one thing the ledger reads inside a receipt: its manifest's staging keys."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidStateError

__all__ = ["receipt_staging_keys"]


def receipt_staging_keys(receipt: dict[str, Any] | None) -> list[str]:
    """Validate a terminal receipt's manifest and return its staging keys in order."""
    if receipt is None:
        return []
    if not isinstance(receipt, dict):
        raise InvalidStateError(
            f"sealed attempt receipt must be a mapping or None, got {type(receipt).__name__}",
            path="$.receipt",
        )
    manifest = receipt.get("manifest")
    if not isinstance(manifest, list):
        raise InvalidStateError(
            f"sealed rollout receipt must contain a manifest list, got {type(manifest).__name__}",
            path="$.receipt.manifest",
        )
    staging_keys: list[str] = []
    for position, entry in enumerate(manifest):
        key = entry.get("staging_key") if isinstance(entry, dict) else None
        if not isinstance(key, str):
            raise InvalidStateError(
                "sealed rollout receipt manifest entries must contain string staging_key "
                f"values; entry {position} is {entry!r}",
                path=f"$.receipt.manifest[{position}].staging_key",
            )
        staging_keys.append(key)
    return staging_keys
