"""The canonical row format: one trainable sample (or placeholder) per sibling.

A row's metadata is a :class:`CanonicalRowMeta` stored as plain data (so every data-plane
backend stores it as is) and read back typed with :meth:`CanonicalRowMeta.of`. A
placeholder has empty arrays: it carries no tokens to train on, only its slot, so the
group still publishes exactly N rows and GRPO keeps a fixed group size.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from .._messages import split_validation_path
from ..capture import LinearizedRollout
from ..dataplane import Row
from ..errors import InvalidArgumentError, InvalidStateError
from ._result import SiblingOutcome

__all__ = ["CanonicalRowMeta", "canonical_row"]


class CanonicalRowMeta(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a canonical row says about itself."""

    #: ``"{group_id}_g{i}"``, also the row's key.
    sample_id: str
    group_id: str
    generation_index: int
    prompt_id: str
    target_step: int | None
    #: Gate id of the sealed attempt, ``"{group_id}_g{i}_a{hex}"``.
    rollout_id: str
    #: The receipt verified and the reward was finalized.
    valid: bool
    #: The seal-time verdict of the caller (never trains when True).
    mask_sample: bool
    #: 1.0 for a valid row, 0.0 for a placeholder (upstream's field).
    sample_mask: float
    #: The final reward; 0.0 for a placeholder.
    reward: float
    #: Carried prompt length of the root call; 0 for a placeholder.
    prompt_len: int
    #: The row's own call versions (None for a placeholder).
    min_weight_version: int | None
    max_weight_version: int | None
    #: The group's minimum version (what staleness accounting uses).
    weight_version: int
    #: None for a valid row, the rejection reason for a placeholder.
    reason: str | None
    #: ``[version, start, end]``: the weight version that generated the row's tokens
    #: ``[start, end)`` (row positions; carried tokens are in none). A call interrupted
    #: by new weights adds a span per version. Empty for a placeholder.
    weight_version_spans: list[tuple[int, int, int]] = []

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


def canonical_row(
    outcome: SiblingOutcome,
    linearized: LinearizedRollout | None,
    *,
    group_id: str,
    prompt_id: str,
    target_step: int | None,
    group_min_weight_version: int,
) -> Row:
    """Build the stored row for ``outcome``; ``linearized`` is given exactly for valid rows."""
    if outcome.valid != (linearized is not None):
        raise InvalidArgumentError(
            f"row {outcome.sample_id!r}: a valid outcome needs its linearized rollout and a "
            "placeholder must have none"
        )
    meta = CanonicalRowMeta(
        sample_id=outcome.sample_id,
        group_id=group_id,
        generation_index=outcome.generation_index,
        prompt_id=prompt_id,
        target_step=target_step,
        rollout_id=outcome.rollout_id,
        valid=outcome.valid,
        mask_sample=outcome.mask_sample,
        sample_mask=1.0 if outcome.valid else 0.0,
        reward=outcome.reward,
        prompt_len=outcome.prompt_len,
        min_weight_version=outcome.min_weight_version,
        max_weight_version=outcome.max_weight_version,
        weight_version=group_min_weight_version,
        reason=outcome.reason,
        weight_version_spans=[]
        if linearized is None
        else [(s.version, s.start, s.end) for s in linearized.token_version_spans],
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
