"""Receipts: the token-free record of one finished attempt, and their assembly (§1.9, §3.4).

A :class:`Receipt` inside the rollout and finalize path; its dict form only where it
leaves it, for the ledger (the seed's ``seal_sibling(..., receipt: dict)``) and the
journal's seal (``Receipt.to_dict``; deterministic, JSON-like, no timestamps, so a repeated
seal compares equal)::

    {"rollout_id": "<group>_g<i>_a<hex>",
     "terminal_model_call_id": "<call>" | None,
     "manifest": [<CallRecord dict>, ...],      # every committed call, in commit order
     "capture_poisoned": bool,
     "failure_reason": str | None,
     "terminal_selection": "declared" | None,    # upstream values also accepted on read
     "reward": float | None,
     "schema_version": 2, "digest_version": 2, "extras_digest_version": 1}

State rules (checked on decode): an unpoisoned receipt names a terminal call and a selection
method, and has no ``failure_reason``; verification also requires the terminal to be in
the manifest. A poisoned receipt still lists every staged call, so
the finalizer can clear their rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

import msgspec

from ..errors import InvalidStateError
from ._keys import parse_staging_key, staging_key
from ._records import CallRecord, Identifier, decode_struct

__all__ = [
    "MISSING_TERMINAL_ROW",
    "NON_POISONING_FAILURES",
    "REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES",
    "UNDECLARED_TERMINAL",
    "CaptureFailure",
    "Receipt",
    "TerminalSelection",
    "assemble_receipt",
]

TerminalSelection = Literal["declared", "heuristic", "response_id", "content"]

# A call that was admitted but never served cannot be anyone's parent, so on its own it does
# not spoil the rollout (NeMo-RL's carve-out); if it was the terminal, the terminal rule masks.
REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES = "request_finished_without_staged_coordinates"
NON_POISONING_FAILURES: frozenset[str] = frozenset({REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES})
MISSING_TERMINAL_ROW = "missing_terminal_row"
# No heuristic terminal selection here: without a declared terminal the rollout is masked,
# which the contract allows (§4.2).
UNDECLARED_TERMINAL = "undeclared_terminal"


class CaptureFailure(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A failure row of the manifest store: a call whose capture did not commit (§3.3)."""

    model_call_id: Identifier
    reason: Annotated[str, msgspec.Meta(min_length=1)]


class Receipt(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A validated receipt; see the module docstring for the dict layout and rules."""

    rollout_id: Identifier
    terminal_model_call_id: Identifier | None = None
    manifest: tuple[CallRecord, ...]
    capture_poisoned: bool = False
    failure_reason: str | None = None
    terminal_selection: TerminalSelection | None = None
    reward: float | None = None
    schema_version: Literal[2] = 2
    digest_version: Literal[2] = 2
    extras_digest_version: Literal[1] = 1

    def __post_init__(self) -> None:
        if self.reward is not None and not math.isfinite(self.reward):
            raise InvalidStateError("receipt reward must be finite", path="$.reward")
        # Whether the terminal is in the manifest is left to verification
        # (``rebuild_failed:missing_terminal``), so an empty manifest gets its own reason.
        if not self.capture_poisoned:
            if self.terminal_model_call_id is None or self.terminal_selection is None:
                raise InvalidStateError(
                    "an unpoisoned receipt must name a terminal call and a selection method",
                    path="$.terminal_model_call_id",
                )
            if self.failure_reason is not None:
                raise InvalidStateError(
                    "an unpoisoned receipt must not carry a failure_reason",
                    path="$.failure_reason",
                )

    @property
    def staging_keys(self) -> list[str]:
        """The manifest's staging keys, in manifest order (what the ledger extracts)."""
        return [record.staging_key for record in self.manifest]

    def to_dict(self) -> dict[str, Any]:
        """The plain dict the ledger stores; lists, not tuples, so it is JSON-shaped."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        out["manifest"] = list(out["manifest"])
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Receipt:
        """Validate a stored receipt; raises ``InvalidStateError`` with a ``$.…`` path."""
        return decode_struct(data, cls, "receipt")


def assemble_receipt(
    rollout_id: str,
    records: Iterable[CallRecord],
    *,
    terminal_model_call_id: str | None,
    failures: Iterable[CaptureFailure] = (),
    reward: float | None = None,
) -> Receipt:
    """Build a rollout's receipt from its committed call records (§3.4).

    ``records`` are the manifest store's rows in commit order (duplicates by call id are
    dropped, first wins); ``failures`` its failure rows; ``terminal_model_call_id`` the call
    the agent declared as its final answer. Poisoning: the first failure whose reason is not
    in ``NON_POISONING_FAILURES``, else ``undeclared_terminal`` or ``missing_terminal_row``.
    Raises ``InvalidStateError`` if a record belongs to another rollout (a store bug).
    """
    staging_key(rollout_id, "x")  # validates rollout_id with the key's own rules
    manifest: list[CallRecord] = []
    seen: set[str] = set()
    for record in records:
        key_rollout, key_call = parse_staging_key(record.staging_key)
        if key_rollout != rollout_id or key_call != record.model_call_id:
            raise InvalidStateError(
                f"call record {record.staging_key!r} does not belong to rollout {rollout_id!r} "
                f"call {record.model_call_id!r}",
                path="$.staging_key",
            )
        if record.model_call_id not in seen:
            seen.add(record.model_call_id)
            manifest.append(record)

    failure_reason = next(
        (f.reason for f in failures if f.reason not in NON_POISONING_FAILURES), None
    )
    terminal: str | None = None
    if terminal_model_call_id is not None and terminal_model_call_id in seen:
        terminal = terminal_model_call_id
    if failure_reason is None and terminal is None:
        failure_reason = (
            UNDECLARED_TERMINAL if terminal_model_call_id is None else MISSING_TERMINAL_ROW
        )
    return Receipt(
        rollout_id=rollout_id,
        terminal_model_call_id=terminal,
        manifest=tuple(manifest),
        capture_poisoned=failure_reason is not None,
        failure_reason=failure_reason,
        terminal_selection="declared" if terminal is not None else None,
        reward=reward,
    )
