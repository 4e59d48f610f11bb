"""Verify a receipt against its staged rows and linearize its terminal chain (§3.6).

Checks run in a fixed order so a given corruption always yields the same reason family:
receipt (presence, schema, identity, poison, emptiness, duplicates, key ownership), then
each staged row in manifest order (count, key, header fields, array shapes, mask and
logprob rules, digest), then the lineage graph (parents present and listed earlier, lengths
chained, chain hashes), then the terminal chain (cumulative hashes). Every manifest row is
verified, dead branches included; only the terminal's ancestry is linearized.

Rollout-level problems never raise: they return a :class:`Rejection` (see ``_result`` for
the codes), so the finalizer can turn the rollout into a masked placeholder and keep the
group's N rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..dataplane import DataPlane, Row
from ..errors import InvalidRowError, InvalidStateError
from ._digest import (
    compute_call_digest,
    compute_chain_hash,
    hash_token_ids,
)
from ._extras import compute_extras_digest
from ._keys import parse_staging_key
from ._receipt import Receipt
from ._records import CallRecord, StagedCallHeader
from ._result import (
    FIELD_MISMATCH_FIELDS,
    LinearizedRollout,
    LinkSpan,
    RebuildCode,
    Rejection,
    RejectionCode,
    WeightVersionSpan,
)
from ._spans import TokenVersionSpan, call_token_versions
from ._writer import STAGING_PARTITION

__all__ = ["fetch_and_verify", "verify_and_linearize", "verify_receipts", "verify_rows"]

ReceiptInput = Receipt | Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class _VerifiedCall:
    """One manifest call whose staged row passed every per-row check."""

    record: CallRecord
    token_ids: npt.NDArray[np.int32]
    token_mask: npt.NDArray[np.float32]
    logprobs: npt.NDArray[np.float32]
    carry_len: int
    extras: Mapping[str, Any] | None = None


def verify_and_linearize(
    receipt: ReceiptInput,
    staged_rows: Sequence[Row],
    *,
    expected_rollout_id: str | None = None,
) -> LinearizedRollout | Rejection:
    """Verify ``receipt`` against ``staged_rows`` and linearize its terminal chain.

    ``staged_rows`` are the rows fetched for the receipt's staging keys, **in manifest
    order** (what ``DataPlane.get(partition, receipt_keys)`` returns). ``receipt`` is the
    plain dict the ledger stored (or a :class:`Receipt`, or ``None``). With
    ``expected_rollout_id`` (the ledger's gate id) a receipt for another attempt is
    rejected as ``identity_mismatch``.
    """
    checked = _check_receipt(receipt, expected_rollout_id)
    if isinstance(checked, Rejection):
        return checked
    return verify_rows(checked, staged_rows)


def fetch_and_verify(
    receipt: ReceiptInput,
    data_plane: DataPlane,
    *,
    partition: str = STAGING_PARTITION,
    expected_rollout_id: str | None = None,
) -> LinearizedRollout | Rejection:
    """Fetch every manifest row from ``data_plane`` in manifest order, then verify.

    A key the store does not hold (its ``KeyError``) becomes ``missing_staging_row``; a
    stored row the store cannot decode (``InvalidRowError``) becomes ``invalid_staging_row``.
    Other data-plane errors propagate: they are infrastructure faults, not rollout faults.
    """
    checked = _check_receipt(receipt, expected_rollout_id)
    if isinstance(checked, Rejection):
        return checked
    try:
        rows = data_plane.get(partition, checked.staging_keys)
    except KeyError as exc:
        # Prefer a store's structured list of missing keys; a plain KeyError names one key.
        missing = getattr(exc, "keys", None)
        if isinstance(missing, list) and missing:
            detail = ",".join(str(key) for key in missing)
        else:
            detail = str(exc.args[0]) if exc.args else "?"
        return Rejection(code=RejectionCode.MISSING_STAGING_ROW, detail=detail)
    except InvalidRowError as exc:
        return Rejection(code=RejectionCode.INVALID_STAGING_ROW, detail=f"{exc.key or '?'}: {exc}")
    return verify_rows(checked, rows)


def verify_receipts(
    receipts: Sequence[tuple[ReceiptInput, Sequence[str], str | None]],
    data_plane: DataPlane,
    *,
    partition: str = STAGING_PARTITION,
) -> list[LinearizedRollout | Rejection]:
    """Verify a group's receipts, each given as ``(receipt, staging_keys,
    expected_rollout_id)``; one data-plane round trip when every staged row is there.

    ``staging_keys`` are what the ledger recorded for the sealed attempt: its receipt's
    manifest keys in manifest order, so one batched ``get`` returns exactly what
    per-receipt fetches would. If any row is missing or undecodable, fall back to
    per-receipt fetches (:func:`fetch_and_verify`), so that only the affected receipts are
    rejected, each with its own reason.
    """
    keys = [
        key for receipt, staging_keys, _ in receipts if receipt is not None for key in staging_keys
    ]
    fetched: list[Row] | None = None
    if keys:
        try:
            fetched = data_plane.get(partition, keys)
        except (KeyError, InvalidRowError):
            fetched = None
    if fetched is None or len(fetched) != len(keys):
        return [
            fetch_and_verify(receipt, data_plane, partition=partition, expected_rollout_id=gate)
            for receipt, _, gate in receipts
        ]
    verdicts: list[LinearizedRollout | Rejection] = []
    start = 0
    for receipt, staging_keys, gate in receipts:
        if receipt is None:
            verdicts.append(Rejection(code=RejectionCode.MISSING_RECEIPT))
            continue
        end = start + len(staging_keys)
        verdicts.append(verify_and_linearize(receipt, fetched[start:end], expected_rollout_id=gate))
        start = end
    return verdicts


def _check_receipt(receipt: ReceiptInput, expected_rollout_id: str | None) -> Receipt | Rejection:
    if receipt is None:
        return Rejection(code=RejectionCode.MISSING_RECEIPT)
    try:
        # A Receipt built in code skipped msgspec's field constraints; round-trip it so both
        # inputs get the same validation.
        data = receipt.to_dict() if isinstance(receipt, Receipt) else receipt
        parsed = Receipt.from_dict(data)
    except InvalidStateError as exc:
        return Rejection(code=RejectionCode.INVALID_RECEIPT, detail=str(exc))
    if expected_rollout_id is not None and parsed.rollout_id != expected_rollout_id:
        return Rejection(
            code=RejectionCode.IDENTITY_MISMATCH,
            detail=f"receipt={parsed.rollout_id}, expected={expected_rollout_id}",
        )
    if parsed.capture_poisoned:
        return Rejection(code=RejectionCode.CAPTURE_POISONED, detail=parsed.failure_reason or "")
    if not parsed.manifest:
        return Rejection(code=RejectionCode.EMPTY_MANIFEST)
    keys: set[str] = set()
    call_ids: set[str] = set()
    for record in parsed.manifest:
        if record.staging_key in keys:
            return Rejection(code=RejectionCode.DUPLICATE_STAGING_KEY, detail=record.staging_key)
        keys.add(record.staging_key)
        if record.model_call_id in call_ids:
            return Rejection(
                code=RejectionCode.DUPLICATE_MANIFEST_CALL_ID, detail=record.model_call_id
            )
        call_ids.add(record.model_call_id)
    for record in parsed.manifest:
        # The schema already guarantees the key's shape; here it must name this rollout and
        # this entry's call, since the key is what the ledger owns and the store is asked.
        key_rollout, key_call = parse_staging_key(record.staging_key)
        if key_rollout != parsed.rollout_id:
            return Rejection(
                code=RejectionCode.IDENTITY_MISMATCH,
                detail=f"manifest key {record.staging_key} is not in rollout {parsed.rollout_id}",
            )
        if key_call != record.model_call_id:
            return Rejection(
                code=RejectionCode.CALL_ID_MISMATCH,
                detail=f"manifest key {record.staging_key} names call {key_call}, "
                f"entry is {record.model_call_id}",
            )
    return parsed


def verify_rows(receipt: Receipt, staged_rows: Sequence[Row]) -> LinearizedRollout | Rejection:
    manifest = receipt.manifest
    if len(staged_rows) != len(manifest):
        return Rejection(
            code=RejectionCode.MISSING_STAGING_ROW,
            detail=f"expected {len(manifest)} rows in manifest order, got {len(staged_rows)}",
        )
    calls: list[_VerifiedCall] = []
    for record, row in zip(manifest, staged_rows, strict=True):
        verified = _check_row(receipt.rollout_id, record, row)
        if isinstance(verified, Rejection):
            return verified
        calls.append(verified)
    graph = _check_graph(calls)
    if graph is not None:
        return graph
    terminal = receipt.terminal_model_call_id
    if terminal is None or all(call.record.model_call_id != terminal for call in calls):
        return _rebuild_failed(
            RebuildCode.MISSING_TERMINAL, f"terminal call {terminal} is not in the manifest"
        )
    return _linearize(receipt, calls)


def _check_row(rollout_id: str, record: CallRecord, row: Row) -> _VerifiedCall | Rejection:
    key = record.staging_key

    def bad(code: RejectionCode, why: str) -> Rejection:
        return Rejection(code=code, detail=f"{key}: {why}")

    if not isinstance(row, Row):
        return bad(RejectionCode.INVALID_STAGING_ROW, f"expected a Row, got {type(row).__name__}")
    try:
        header = StagedCallHeader.from_dict(row.metadata)
    except InvalidStateError as exc:
        return bad(RejectionCode.INVALID_STAGING_ROW, str(exc))
    row_key = f"{header.rollout_id}/{header.model_call_id}"
    if row_key != key:
        # The store answered with a row describing another key: misordered or mixed up.
        return Rejection(
            code=RejectionCode.STAGING_KEY_MISMATCH, detail=f"{key}: row holds {row_key}"
        )
    for name in FIELD_MISMATCH_FIELDS:
        staged, listed = getattr(header, name), getattr(record, name)
        if staged != listed:
            return bad(
                RejectionCode.field_mismatch(name), f"staged {staged!r}, manifest {listed!r}"
            )
    try:
        extras_digest = compute_extras_digest(header.extras)
    except InvalidStateError as exc:
        return bad(RejectionCode.CORRUPT_EXTRAS, str(exc))
    if extras_digest != header.extras_digest:
        return bad(RejectionCode.CORRUPT_EXTRAS, "the staged extras do not match their digest")

    arrays = (row.token_ids, row.token_mask, row.logprobs)
    names, kinds = ("token_ids", "token_mask", "logprobs"), ("iu", "f", "f")
    for name, array, kind in zip(names, arrays, kinds, strict=True):
        if not isinstance(array, np.ndarray) or array.ndim != 1 or array.dtype.kind not in kind:
            return bad(RejectionCode.INVALID_STAGING_ROW, f"{name} must be a 1-D numeric array")
        if array.size != record.delta_len:
            return bad(
                RejectionCode.LENGTH_MISMATCH,
                f"{name} has {array.size} entries, delta_len {record.delta_len}",
            )
    token_ids, token_mask, logprobs = arrays
    if token_ids.size and (
        int(token_ids.min()) < 0 or int(token_ids.max()) > np.iinfo(np.int32).max
    ):
        return bad(RejectionCode.INVALID_STAGING_ROW, "token ids must lie in [0, 2**31)")
    if not np.isin(token_mask, (0.0, 1.0)).all():
        return bad(RejectionCode.INVALID_TOKEN_MASK, "mask values must be exactly 0.0 or 1.0")
    carry_len = int(np.count_nonzero(token_mask == 0.0))
    if carry_len == token_mask.size or not (token_mask[carry_len:] == 1.0).all():
        return bad(
            RejectionCode.INVALID_TOKEN_MASK,
            "mask must be carried zeros then at least one generated one",
        )
    if not np.isfinite(logprobs).all():
        return bad(RejectionCode.NON_FINITE_LOGPROB, "logprobs must be finite")
    if (logprobs[:carry_len] != 0.0).any():
        return bad(RejectionCode.MISALIGNED_DELTA, "carried positions must have logprob 0.0")
    try:
        digest = compute_call_digest(
            rollout_id=rollout_id,
            model_call_id=record.model_call_id,
            parent_call_id=record.parent_call_id,
            mode=record.mode,
            prev_len=record.prev_len,
            delta_len=record.delta_len,
            cum_len=record.cum_len,
            weight_version=record.weight_version,
            token_ids=token_ids,
            token_mask=token_mask,
            logprobs=logprobs,
            extras_digest=record.extras_digest,
            chain_hash=record.chain_hash,
            cumulative_hash=record.cumulative_hash,
        )
    except InvalidStateError as exc:
        return bad(RejectionCode.INVALID_STAGING_ROW, str(exc))
    if digest != record.digest:
        return bad(RejectionCode.DIGEST_MISMATCH, "staged contents do not match the call digest")
    return _VerifiedCall(
        record=record,
        token_ids=token_ids.astype(np.int32),
        token_mask=token_mask.astype(np.float32),
        logprobs=logprobs.astype(np.float32),
        carry_len=carry_len,
        extras=header.extras,
    )


def _rebuild_failed(rebuild_code: RebuildCode, detail: str) -> Rejection:
    return Rejection(code=RejectionCode.REBUILD_FAILED, rebuild_code=rebuild_code, detail=detail)


def _check_graph(calls: Sequence[_VerifiedCall]) -> Rejection | None:
    index = {call.record.model_call_id: i for i, call in enumerate(calls)}
    for i, call in enumerate(calls):
        record = call.record
        parent_chain: str | None = None
        if record.parent_call_id is not None:
            j = index.get(record.parent_call_id)
            if j is None:
                return _rebuild_failed(
                    RebuildCode.MISSING_PARENT,
                    f"call {record.model_call_id} names parent {record.parent_call_id}, "
                    "which is not in the manifest",
                )
            if j >= i:
                # Commit order puts every parent first; a violation is a corrupted manifest
                # or a cycle, and both would make the chain walk ill-defined.
                return _rebuild_failed(
                    RebuildCode.MANIFEST_ORDER,
                    f"parent {record.parent_call_id} is not listed before call "
                    f"{record.model_call_id}",
                )
            parent = calls[j].record
            if parent.cum_len != record.prev_len:
                return _rebuild_failed(
                    RebuildCode.PARENT_LENGTH_MISMATCH,
                    f"call {record.model_call_id} prev_len {record.prev_len} != parent "
                    f"{parent.model_call_id} cum_len {parent.cum_len}",
                )
            parent_chain = parent.chain_hash
        if compute_chain_hash(parent_chain, call.token_ids) != record.chain_hash:
            return _rebuild_failed(
                RebuildCode.CHAIN_HASH_MISMATCH,
                f"call {record.model_call_id} does not continue its parent's token chain",
            )
    return None


def _token_versions(chain: Sequence[_VerifiedCall]) -> tuple[TokenVersionSpan, ...]:
    """Which weight version generated each generated token of the row, as spans over row
    positions (carried tokens are in no span); equal neighbours merged."""
    spans: list[TokenVersionSpan] = []
    for call in chain:
        first = call.record.prev_len + call.carry_len
        generated = call.record.cum_len - first
        for span in call_token_versions(call.extras, generated, call.record.weight_version):
            start, end = first + span.start, first + span.end
            if spans and spans[-1].version == span.version and spans[-1].end == start:
                spans[-1] = TokenVersionSpan(span.version, spans[-1].start, end)
            else:
                spans.append(TokenVersionSpan(span.version, start, end))
    return tuple(spans)


def _linearize(receipt: Receipt, calls: Sequence[_VerifiedCall]) -> LinearizedRollout | Rejection:
    by_id = {call.record.model_call_id: call for call in calls}
    terminal = receipt.terminal_model_call_id
    assert terminal is not None
    chain: list[_VerifiedCall] = []
    cursor: str | None = terminal
    # The graph check guarantees every parent exists and is listed earlier, so this ends.
    while cursor is not None:
        call = by_id[cursor]
        chain.append(call)
        cursor = call.record.parent_call_id
    chain.reverse()

    token_ids = np.concatenate([call.token_ids for call in chain])
    for call in chain:
        end = call.record.cum_len
        if hash_token_ids(token_ids[:end]) != call.record.cumulative_hash:
            return _rebuild_failed(
                RebuildCode.CUMULATIVE_HASH_MISMATCH,
                f"call {call.record.model_call_id}: linearized prefix of {end} tokens does not "
                "match its cumulative hash",
            )
    token_versions = _token_versions(chain)
    # An interrupted call's first tokens are older than its staged (newest) version: the
    # row's oldest weights are its oldest token's.
    versions = [call.record.weight_version for call in calls]
    versions += [span.version for span in token_versions]
    return LinearizedRollout(
        rollout_id=receipt.rollout_id,
        terminal_model_call_id=terminal,
        token_ids=token_ids,
        token_mask=np.concatenate([call.token_mask for call in chain]),
        logprobs=np.concatenate([call.logprobs for call in chain]),
        prompt_len=chain[0].carry_len,
        call_ids=tuple(call.record.model_call_id for call in chain),
        link_spans=tuple(
            LinkSpan(
                call.record.model_call_id, call.carry_len, call.record.delta_len - call.carry_len
            )
            for call in chain
        ),
        weight_version_spans=tuple(
            WeightVersionSpan(
                call.record.model_call_id,
                call.record.prev_len,
                call.record.cum_len,
                call.record.weight_version,
            )
            for call in chain
        ),
        staging_keys=tuple(call.record.staging_key for call in calls),
        token_version_spans=token_versions,
        min_weight_version=min(versions),
        max_weight_version=max(versions),
    )
