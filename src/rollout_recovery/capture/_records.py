"""Token-free call records: the manifest entry of a receipt and the header of a staged row.

Both are frozen msgspec Structs (slotted, immutable) with the contract's field names
(§1.4, §1.7):

``CallRecord`` (one manifest entry, dict form stored in the ledger inside a receipt)::

    {"model_call_id": str, "parent_call_id": str | None, "mode": "text" | "token_in",
     "prev_len": int, "delta_len": int, "cum_len": int, "weight_version": int,
     "digest": hex64, "extras_digest": hex64, "chain_hash": hex64, "cumulative_hash": hex64,
     "schema_version": 2, "digest_version": 2, "extras_digest_version": 1,
     "staging_key": "<rollout_id>/<model_call_id>"}

``StagedCallHeader`` (the ``metadata`` of a staged data-plane row) has the same fields,
with ``rollout_id`` in place of ``staging_key``; the row's arrays carry the token delta.

A root call is ``mode="text"`` with no parent and ``prev_len == 0``; a continuation is
``mode="token_in"`` with a parent and ``prev_len > 0``. ``mode`` defaults to ``"token_in"``
as upstream, so a root must say ``"text"`` explicitly. ``from_dict`` validates every field
(types are strict: a bool is not an int) and raises ``InvalidStateError`` with a path.
``chain_hash`` and ``cumulative_hash`` are required here (optional upstream in the older
variant): they are what lets verification detect a broken link.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from .._bounds import INT64_MAX
from .._messages import split_validation_path
from ..errors import InvalidStateError

__all__ = [
    "CallRecord",
    "CaptureMode",
    "DigestHex",
    "Identifier",
    "StagedCallHeader",
    "decode_struct",
]

CaptureMode = Literal["text", "token_in"]

# ``\Z`` rather than ``$``: msgspec searches the pattern, and ``$`` accepts a trailing newline.
_ID = r"[A-Za-z0-9][A-Za-z0-9._-]*"
Identifier = Annotated[str, msgspec.Meta(pattern=rf"^{_ID}\Z")]
StagingKeyStr = Annotated[str, msgspec.Meta(pattern=rf"^{_ID}/{_ID}\Z")]
DigestHex = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}\Z")]
# Lengths and versions are hashed as u64; the bound keeps them JSON- and SQLite-safe too.
Length = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
PositiveLength = Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]


S = TypeVar("S", bound=msgspec.Struct)


def decode_struct(data: object, kind: type[S], what: str) -> S:
    """Validate plain data into ``kind``; failures become ``InvalidStateError`` with a path."""
    if not isinstance(data, Mapping):
        raise InvalidStateError(f"{what} must be a dict, got {type(data).__name__}", path="$")
    try:
        return msgspec.convert(data, kind, strict=True)
    except msgspec.ValidationError as exc:
        message, path = split_validation_path(str(exc))
        raise InvalidStateError(f"invalid {what}: {message}", path=path or "$") from exc


class _CallFields(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fields shared by a manifest entry and a staged-row header."""

    model_call_id: Identifier
    parent_call_id: Identifier | None
    mode: CaptureMode = "token_in"
    prev_len: Length
    delta_len: PositiveLength
    cum_len: Length
    weight_version: Length
    digest: DigestHex
    extras_digest: DigestHex
    chain_hash: DigestHex
    cumulative_hash: DigestHex
    schema_version: Literal[2] = 2
    digest_version: Literal[2] = 2
    extras_digest_version: Literal[1] = 1

    def __post_init__(self) -> None:
        # Cross-field rules; msgspec reports them with the struct's path when decoding.
        if self.cum_len != self.prev_len + self.delta_len:
            raise InvalidStateError(
                f"call {self.model_call_id}: cum_len {self.cum_len} != prev_len "
                f"{self.prev_len} + delta_len {self.delta_len}",
                path="$.cum_len",
            )
        if self.mode == "text":
            if self.parent_call_id is not None or self.prev_len != 0:
                raise InvalidStateError(
                    f"call {self.model_call_id}: a 'text' call must be a parentless root "
                    "with prev_len 0",
                    path="$.mode",
                )
        elif self.parent_call_id is None or self.prev_len == 0:
            raise InvalidStateError(
                f"call {self.model_call_id}: a 'token_in' call needs a parent and prev_len > 0",
                path="$.mode",
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-like dict, every field present, in declaration order."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


class CallRecord(_CallFields, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One manifest entry of a receipt: a staged call's coordinates, no tokens."""

    staging_key: StagingKeyStr

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CallRecord:
        return decode_struct(data, cls, "call record")


class StagedCallHeader(_CallFields, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The metadata stored with a staged row; it names its rollout, so a row is self-describing."""

    rollout_id: Identifier
    # Per-call engine material (sampling params, logprob mode, server versions); its digest
    # is ``extras_digest``. Absent from the dict form when None, so rows without extras keep
    # the exact header they always had.
    extras: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StagedCallHeader:
        return decode_struct(data, cls, "staged call header")

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if out["extras"] is None:
            del out["extras"]
        return out

    def call_record(self, staging_key: str) -> CallRecord:
        """The manifest entry for this staged row: the same coordinates, keyed by row."""
        fields = {name: getattr(self, name) for name in _CallFields.__struct_fields__}
        return CallRecord(**fields, staging_key=staging_key)
