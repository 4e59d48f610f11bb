"""Read an unsealed attempt's staged calls back, verified: what a later attempt continues.

An attempt that died (its worker, its actor, the whole process) leaves the calls it staged
in the store, each row durable before it was acknowledged. :meth:`StagedPrefix.read`
turns those rows into a :class:`StagedPrefix` (every call's whole prompt, generated ids,
logprobs, weight version and extras) after the checks a receipt gets at finalization:
every header well formed and naming the attempt (a row of another rollout is refused as
foreign), every row's contents hashing to its digest (a tampered row is refused), and the
calls forming one contiguous chain from a root call, each extending its parent's exact
tokens. It is all or nothing: a prefix that fails any check comes back as a
:class:`Rejection`, and the attempt that wanted it starts over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..dataplane import DataPlane
from ..errors import InvalidRowError, InvalidStateError
from ._keys import parse_staging_key
from ._receipt import Receipt
from ._records import StagedCallHeader
from ._result import LinearizedRollout, RebuildCode, Rejection, RejectionCode
from ._verify import verify_rows
from ._writer import STAGING_PARTITION

__all__ = ["StagedCall", "StagedPrefix"]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class StagedCall:
    """One staged model call as an episode sees it again.

    ``prompt_token_ids`` is the whole prompt the engine saw (the parent's tokens and the
    carried ones), ``token_ids`` and ``logprobs`` what it generated.
    """

    staging_key: str
    model_call_id: str
    prompt_token_ids: npt.NDArray[np.int32]
    token_ids: npt.NDArray[np.int32]
    logprobs: npt.NDArray[np.float32]
    weight_version: int
    extras: dict[str, Any] | None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class StagedPrefix:
    """The staged calls of attempt ``rollout_id``, root first, each continuing the last."""

    rollout_id: str
    calls: tuple[StagedCall, ...]

    @property
    def tokens(self) -> int:
        """Generated tokens the calls hold (what continuing them saves)."""
        return sum(int(call.token_ids.size) for call in self.calls)

    @property
    def staging_keys(self) -> list[str]:
        return [call.staging_key for call in self.calls]

    @property
    def weight_versions(self) -> list[int]:
        return [call.weight_version for call in self.calls]

    def truncated(self, count: int) -> StagedPrefix:
        """The first ``count`` calls (still a prefix: each continues the one before)."""
        return StagedPrefix(rollout_id=self.rollout_id, calls=self.calls[:count])

    @classmethod
    def read(
        cls,
        data_plane: DataPlane,
        rollout_id: str,
        keys: Sequence[str],
        *,
        partition: str = STAGING_PARTITION,
    ) -> StagedPrefix | Rejection:
        """Verify the staged rows ``keys`` of attempt ``rollout_id`` as one prefix.

        ``keys`` are every staged key of the attempt (any order). Returns the prefix, or the
        first problem as a :class:`Rejection` (``identity_mismatch`` for a foreign row,
        ``digest_mismatch`` for a tampered one, ``missing_staging_row``, ``rebuild_failed``
        for calls that do not form one chain, ...). Data-plane errors other than a missing or
        undecodable row propagate.
        """
        if not keys:
            return cls(rollout_id=rollout_id, calls=())
        for key in keys:
            if parse_staging_key(key)[0] != rollout_id:
                return Rejection(
                    code=RejectionCode.IDENTITY_MISMATCH,
                    detail=f"{key} is not a call of {rollout_id}",
                )
        try:
            rows = data_plane.get(partition, list(keys))
        except InvalidRowError as exc:
            return Rejection(
                code=RejectionCode.INVALID_STAGING_ROW, detail=f"{exc.key or '?'}: {exc}"
            )
        except KeyError as exc:
            return Rejection(code=RejectionCode.MISSING_STAGING_ROW, detail=str(exc))
        headers = []
        for key, row in zip(keys, rows, strict=True):
            try:
                header = StagedCallHeader.from_dict(row.metadata)
            except InvalidStateError as exc:
                return Rejection(code=RejectionCode.INVALID_STAGING_ROW, detail=f"{key}: {exc}")
            if header.rollout_id != rollout_id:
                return Rejection(
                    code=RejectionCode.IDENTITY_MISMATCH,
                    detail=f"{key}: the row names {header.rollout_id}",
                )
            headers.append((key, header, row))
        # A chain has strictly growing lengths: order by them, then every call must continue
        # the one before it (no gap, no second root, no branch).
        headers.sort(key=lambda entry: entry[1].cum_len)
        parent: str | None = None
        seen: set[str] = set()
        for key, header, _ in headers:
            if header.parent_call_id != parent:
                # Continuing an earlier call than the last: a branch; anything else: a gap.
                code = (
                    RebuildCode.MANIFEST_ORDER
                    if header.parent_call_id in seen
                    else RebuildCode.MISSING_PARENT
                )
                return Rejection(
                    code=RejectionCode.REBUILD_FAILED,
                    rebuild_code=code,
                    detail=f"{key} continues {header.parent_call_id}, not {parent}: not one chain",
                )
            seen.add(header.model_call_id)
            parent = header.model_call_id
        receipt = Receipt(
            rollout_id=rollout_id,
            terminal_model_call_id=parent,
            manifest=tuple(header.call_record(key) for key, header, _ in headers),
            terminal_selection="declared",
        )
        verified = verify_rows(receipt, [row for _, _, row in headers])
        if isinstance(verified, Rejection):
            return verified
        return _prefix(rollout_id, verified, [(key, header) for key, header, _ in headers])


def _prefix(
    rollout_id: str,
    linearized: LinearizedRollout,
    headers: Sequence[tuple[str, StagedCallHeader]],
) -> StagedPrefix:
    calls = []
    for (key, header), span in zip(headers, linearized.link_spans, strict=True):
        # The call's whole prompt: everything before it and its carried tokens.
        start = header.prev_len + span.carry_len
        end = header.cum_len
        calls.append(
            StagedCall(
                staging_key=key,
                model_call_id=header.model_call_id,
                prompt_token_ids=linearized.token_ids[:start].copy(),
                token_ids=linearized.token_ids[start:end].copy(),
                logprobs=linearized.logprobs[start:end].copy(),
                weight_version=header.weight_version,
                extras=None if header.extras is None else dict(header.extras),
            )
        )
    return StagedPrefix(rollout_id=rollout_id, calls=tuple(calls))
