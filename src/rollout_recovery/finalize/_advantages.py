"""GRPO advantages for one prompt group, with placeholders masked out (upstream §2.9).

Only rows in ``valid_mask`` (valid and not ``mask_sample``) form the baseline and the spread,
and only they get a non-zero advantage; a placeholder's reward value is never read, so a
placeholder cannot bias its siblings whatever number it carries.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["ADVANTAGE_EPSILON", "grpo_advantages"]

# Added to the spread before dividing, as upstream; guards a tiny but non-zero std.
ADVANTAGE_EPSILON = 1e-6


def grpo_advantages(
    rewards: Sequence[float] | npt.ArrayLike,
    valid_mask: Sequence[bool] | npt.ArrayLike | None = None,
    *,
    leave_one_out: bool = True,
    normalize: bool = True,
) -> npt.NDArray[np.float64]:
    """Per-row advantages of one group; placeholders (``valid_mask`` False) get 0.0.

    With at most one valid row every advantage is 0. Otherwise row ``i``'s reference set is
    every valid row (``leave_one_out=False``) or every valid row but ``i``; its baseline is
    the set's mean and its spread the set's Bessel-corrected std (NaN, for a one-row set,
    counts as 0). Advantage = reward - baseline, divided by ``std + 1e-6`` when
    ``normalize`` and std > 0.

    ``valid_mask`` defaults to all valid and may be bools or 0/1 numbers (a sample mask).
    Raises ``ValueError`` for a non-1-D input, a length mismatch, mask values other than
    0/1, or a non-finite reward on a valid row (placeholders' values are ignored).
    """
    values = np.asarray(rewards, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"rewards must be 1-D, got shape {values.shape}")
    mask = _valid_mask(valid_mask, values.shape[0])
    bad = np.flatnonzero(mask & ~np.isfinite(values))
    if bad.size:
        raise ValueError(
            f"rewards of valid rows must be finite; row {int(bad[0])} is {float(values[bad[0]])!r}"
        )
    advantages = np.zeros(values.shape[0], dtype=np.float64)
    valid_rows = np.flatnonzero(mask)
    count = valid_rows.size
    if count <= 1:
        return advantages
    valid = values[valid_rows]
    # membership[i, j]: whether valid row j is in valid row i's reference set. O(n^2) in the
    # group size (at most a few hundred), and exact where running sums would cancel.
    membership = np.ones((count, count), dtype=np.float64)
    if leave_one_out:
        np.fill_diagonal(membership, 0.0)
    size = membership.sum(axis=1)
    baseline = membership @ valid / size
    squares = membership * (valid[None, :] - baseline[:, None]) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        std = np.sqrt(squares.sum(axis=1) / (size - 1.0))
    std = np.nan_to_num(std, nan=0.0, posinf=0.0)
    centered = valid - baseline
    if normalize:
        spread = std > 0
        centered = np.where(spread, centered / (std + ADVANTAGE_EPSILON), centered)
    advantages[valid_rows] = centered
    return advantages


def _valid_mask(
    valid_mask: Sequence[bool] | npt.ArrayLike | None, rows: int
) -> npt.NDArray[np.bool_]:
    if valid_mask is None:
        return np.ones(rows, dtype=np.bool_)
    raw = np.asarray(valid_mask)
    if raw.ndim != 1 or raw.shape[0] != rows:
        raise ValueError(
            f"valid_mask must be 1-D with one entry per reward ({rows}), got shape {raw.shape}"
        )
    if raw.dtype == np.bool_:
        return raw
    if raw.dtype.kind not in "iuf" or not np.isin(raw, (0, 1)).all():
        raise ValueError(
            f"valid_mask must hold bools or 0/1 numbers, got {raw.dtype} values "
            f"{np.unique(raw)[:10].tolist()!r}"
        )
    return raw.astype(np.bool_)
