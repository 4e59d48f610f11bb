"""What finalizing one prompt group produces: N canonical rows and their metadata, metrics.

A sibling is *valid* when its receipt verified against its staged rows and its reward could
be finalized; otherwise it is a *placeholder* (no tokens, masked out of loss and baseline)
with a ``reason``. Independently of validity, ``mask_sample`` is the caller's seal-time
verdict (upstream's batch field of the same name): a valid but flagged row keeps its tokens
and its reward observation, yet never trains and never enters a GRPO baseline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..dataplane import Row
from ..rewards import FinalizedReward
from ._rows import CanonicalRowMeta

__all__ = ["FinalizedGroup"]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class FinalizedGroup:
    """Exactly N canonical rows of one group, in generation order, ready to publish.

    ``metas[i]`` is the typed metadata of ``rows[i]`` (the finalizer's verdict on sibling
    ``i``: valid, or a placeholder with its reason) and ``row_keys[i]``, ``{group_id}_g{i}``,
    its key. ``staging_keys`` lists every
    staging key owned by the group's sealed current attempts (valid or not, dead branches
    included): publication clears them all. ``metrics`` are per-group sums (pool them with
    :func:`rollout_recovery.rewards.aggregate_capture_reward_metrics`), and
    ``reward_observations`` hold one :class:`FinalizedReward` per valid row.
    ``min_weight_version``/``max_weight_version`` span the valid rows' model calls, or equal
    the ledger's ``start_weight_version`` when every row is a placeholder.
    """

    group_id: str
    target_step: int | None
    metas: tuple[CanonicalRowMeta, ...]
    row_keys: tuple[str, ...]
    rows: tuple[Row, ...]
    staging_keys: tuple[str, ...]
    min_weight_version: int
    max_weight_version: int
    metrics: Mapping[str, float]
    reward_observations: tuple[FinalizedReward, ...]

    @property
    def total_row_count(self) -> int:
        return len(self.metas)

    @property
    def valid_row_count(self) -> int:
        return sum(meta.valid for meta in self.metas)

    @property
    def rows_by_key(self) -> dict[str, Row]:
        """The mapping a data-plane ``put`` takes, in generation order."""
        return dict(zip(self.row_keys, self.rows, strict=True))

    def rewards(self) -> npt.NDArray[np.float64]:
        """Final rewards in generation order (placeholders hold 0.0)."""
        return np.array([meta.reward for meta in self.metas], dtype=np.float64)

    def valid_mask(self) -> npt.NDArray[np.bool_]:
        """Which rows verified (upstream's ``sample_mask`` with a loss multiplier of 1)."""
        return np.array([meta.valid for meta in self.metas], dtype=np.bool_)

    def train_mask(self) -> npt.NDArray[np.bool_]:
        """``valid and not mask_sample``: the ``valid_mask`` for :func:`grpo_advantages`."""
        return np.array([meta.trainable for meta in self.metas], dtype=np.bool_)
