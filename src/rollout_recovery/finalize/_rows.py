"""The canonical row format: one trainable sample (or placeholder) per sibling.

A row's metadata is a :class:`CanonicalRowMeta` (the finalizer's verdict on the sibling)
stored as plain data (so every data-plane backend stores it as is) and read back typed
with :meth:`CanonicalRowMeta.of`. A
placeholder has empty arrays: it carries no tokens to train on, only its slot, so the
group still publishes exactly N rows and GRPO keeps a fixed group size.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from .._messages import split_validation_path
from .._row_facts import RowFacts
from ..capture import LinearizedRollout
from ..dataplane import Row
from ..errors import InvalidArgumentError, InvalidStateError

__all__ = ["CanonicalRowMeta", "canonical_row"]


class CanonicalRowMeta(RowFacts, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a canonical row says about itself: the finalizer's verdict on its sibling.

    The :class:`~rollout_recovery._row_facts.RowFacts` it shares with the journal's
    ``TrainedRow``, and what only the stored row holds. A placeholder (``valid`` False)
    says why in ``reason``; its versions are None and its spans empty.
    """

    #: ``"{group_id}_g{i}"``, also the row's key.
    sample_id: str
    prompt_id: str
    target_step: int | None
    #: The seal-time verdict of the caller (never trains when True).
    mask_sample: bool
    #: 1.0 for a valid row, 0.0 for a placeholder (upstream's field).
    sample_mask: float
    #: Carried prompt length of the root call; 0 for a placeholder.
    prompt_len: int
    #: The row's own call versions (None for a placeholder).
    min_weight_version: int | None
    max_weight_version: int | None
    #: None for a valid row, an upstream-style rejection reason for a placeholder
    #: (``missing_receipt``, ``digest_mismatch:<key>: ...``,
    #: ``reward_processing:missing_reward_checks``).
    reason: str | None

    @property
    def trainable(self) -> bool:
        """A valid row the caller did not mask: it enters the loss and the baseline."""
        return self.valid and not self.mask_sample

    @classmethod
    def of(cls, row: Row) -> CanonicalRowMeta:
        """The typed metadata of a stored canonical row; ``InvalidStateError`` if it is not
        one."""
        try:
            return msgspec.convert(row.metadata, cls)
        except msgspec.ValidationError as error:
            message, path = split_validation_path(str(error))
            raise InvalidStateError(f"not a canonical row: {message}", path=path) from None


_EMPTY_IDS = np.zeros(0, dtype=np.int32)
_EMPTY_FLOATS = np.zeros(0, dtype=np.float32)


def canonical_row(meta: CanonicalRowMeta, linearized: LinearizedRollout | None) -> Row:
    """The stored row of ``meta``; ``linearized`` is given exactly for valid rows."""
    if meta.valid != (linearized is not None):
        raise InvalidArgumentError(
            f"row {meta.sample_id!r}: a valid row needs its linearized rollout and a "
            "placeholder must have none"
        )
    metadata: dict[str, Any] = msgspec.structs.asdict(meta)
    # Plain lists: row metadata is stored as JSON-like data.
    metadata["weight_version_spans"] = [list(span) for span in meta.weight_version_spans]
    if linearized is None:
        # Separate empty arrays per row: stores may keep what they are given by reference.
        return Row(
            token_ids=_EMPTY_IDS.copy(),
            token_mask=_EMPTY_FLOATS.copy(),
            logprobs=_EMPTY_FLOATS.copy(),
            metadata=metadata,
        )
    return Row(
        token_ids=linearized.token_ids,
        token_mask=linearized.token_mask,
        logprobs=linearized.logprobs,
        metadata=metadata,
    )
