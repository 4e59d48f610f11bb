"""The canonical row format: one trainable sample (or placeholder) per sibling.

Metadata keys (JSON-like values only, so every data-plane backend stores them as is)::

    sample_id            "{group_id}_g{i}" (also the row key)
    group_id, generation_index, prompt_id, target_step
    rollout_id           gate id of the sealed attempt, "{group_id}_g{i}_a{hex}"
    valid                bool: the receipt verified and the reward was finalized
    mask_sample          bool: the caller's seal-time verdict (never trains when True)
    sample_mask          1.0 for a valid row, 0.0 for a placeholder (upstream's field)
    reward               final reward; 0.0 for a placeholder
    prompt_len           carried prompt length of the root call; 0 for a placeholder
    min_weight_version / max_weight_version   the row's own call versions (None: placeholder)
    weight_version       the group's minimum version (what staleness accounting uses)
    reason               None for a valid row, the rejection reason for a placeholder

A placeholder has empty arrays: it carries no tokens to train on, only its slot, so the
group still publishes exactly N rows and GRPO keeps a fixed group size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..capture import LinearizedRollout
from ..dataplane import Row
from ..errors import InvalidArgumentError
from ._result import SiblingOutcome

__all__ = ["canonical_row"]

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
    metadata: dict[str, Any] = {
        "sample_id": outcome.sample_id,
        "group_id": group_id,
        "generation_index": outcome.generation_index,
        "prompt_id": prompt_id,
        "target_step": target_step,
        "rollout_id": outcome.rollout_id,
        "valid": outcome.valid,
        "mask_sample": outcome.mask_sample,
        "sample_mask": 1.0 if outcome.valid else 0.0,
        "reward": outcome.reward,
        "prompt_len": outcome.prompt_len,
        "min_weight_version": outcome.min_weight_version,
        "max_weight_version": outcome.max_weight_version,
        "weight_version": group_min_weight_version,
        "reason": outcome.reason,
    }
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
