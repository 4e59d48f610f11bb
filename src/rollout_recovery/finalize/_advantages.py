"""GRPO advantages for one prompt group, with placeholders masked out (upstream §2.9).

Only rows in ``valid_mask`` (valid and not ``mask_sample``) form the baseline and the spread,
and only they get a non-zero advantage; a placeholder's reward value is never read, so a
placeholder cannot bias its siblings whatever number it carries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError

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
    ``normalize`` and std > 0. The std is computed in a scaled form, so it is right for
    rewards of any finite magnitude (``[1e160, 0, -1e160]`` normalizes to ``[1, 0, -1]``);
    only an advantage that is not divided by a spread and is itself beyond the float range
    (rewards near 1e308 of both signs) comes out as ``±inf``.

    ``valid_mask`` defaults to all valid and may be bools or 0/1 numbers (a sample mask).
    Raises :class:`InvalidArgumentError` (a ``ValueError``) for a non-1-D input, a length
    mismatch, mask values other than 0/1, or a non-finite reward on a valid row
    (placeholders' values are ignored).
    """
    values = np.asarray(rewards, dtype=np.float64)
    if values.ndim != 1:
        raise InvalidArgumentError(f"rewards must be 1-D, got shape {values.shape}")
    mask = _valid_mask(valid_mask, values.shape[0])
    bad = np.flatnonzero(mask & ~np.isfinite(values))
    if bad.size:
        raise InvalidArgumentError(
            f"rewards of valid rows must be finite; row {int(bad[0])} is {float(values[bad[0]])!r}"
        )
    advantages = np.zeros(values.shape[0], dtype=np.float64)
    valid_rows = np.flatnonzero(mask)
    count = valid_rows.size
    if count <= 1:
        return advantages
    valid = values[valid_rows]
    # Rewards near the float limit would overflow the baseline's sum or a deviation: then
    # work in units of 2**unit (an exact rescaling) and convert back at the end.
    peak = float(np.max(np.abs(valid)))
    unit = math.frexp(peak)[1] if peak > _UNIT_THRESHOLD else 0
    if unit:
        valid = np.ldexp(valid, -unit)
    # membership[i, j]: whether valid row j is in valid row i's reference set. O(n^2) in the
    # group size (at most a few hundred), and exact where running sums would cancel.
    membership = np.ones((count, count), dtype=np.float64)
    if leave_one_out:
        np.fill_diagonal(membership, 0.0)
    size = membership.sum(axis=1)
    baseline = membership @ valid / size
    std = _scaled_std(np.where(membership > 0, valid[None, :] - baseline[:, None], 0.0), size)
    centered = valid - baseline
    # Without a spread (or without normalizing) the advantage is the deviation itself, in
    # the rewards' units; a normalized one is a ratio, the same in any unit.
    result = np.ldexp(centered, unit) if unit else centered
    if normalize:
        epsilon = math.ldexp(ADVANTAGE_EPSILON, -unit)
        # A reference set of equal rewards has no spread, even when its float mean is
        # inexact ([0.1, 0.1, 0.1]) and the rounding leaves a std of ~1e-17 that would
        # blow the advantage up by 1e6.
        inside = membership > 0
        spread = np.max(np.where(inside, valid, -np.inf), axis=1) > np.min(
            np.where(inside, valid, np.inf), axis=1
        )
        result = np.divide(centered, std + epsilon, out=np.array(result), where=(std > 0) & spread)
    advantages[valid_rows] = result
    return advantages


# Above this magnitude (2**1000) a group's sum or a deviation could overflow.
_UNIT_THRESHOLD = math.ldexp(1.0, 1000)


def _scaled_std(
    deviations: npt.NDArray[np.float64], size: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Each row's Bessel-corrected std, from deviations scaled so squaring cannot overflow.

    ``deviations[i]`` holds row ``i``'s reference set's deviations from its mean (0 outside
    the set); ``size[i]`` the set's size. Each row is divided by the power of two just above
    its largest magnitude before squaring, and the root multiplied back. Scaling by a power
    of two is exact, so wherever squaring the raw deviations neither overflows nor
    underflows (|deviation| between about 1e-154 and 1e154) the result is bit for bit the
    unscaled formula's; beyond, it stays correct instead of becoming inf (which counted as
    no spread) or 0. A one-row set's NaN (0/0) counts as 0.
    """
    exponents = np.frexp(np.max(np.abs(deviations), axis=1))[1]  # 0 for a row of zeros
    scaled = np.ldexp(deviations, -exponents[:, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        std = np.ldexp(np.sqrt((scaled * scaled).sum(axis=1) / (size - 1.0)), exponents)
    result: npt.NDArray[np.float64] = np.nan_to_num(std, nan=0.0, posinf=0.0)
    return result


def _valid_mask(
    valid_mask: Sequence[bool] | npt.ArrayLike | None, rows: int
) -> npt.NDArray[np.bool_]:
    if valid_mask is None:
        return np.ones(rows, dtype=np.bool_)
    raw = np.asarray(valid_mask)
    if raw.ndim != 1 or raw.shape[0] != rows:
        raise InvalidArgumentError(
            f"valid_mask must be 1-D with one entry per reward ({rows}), got shape {raw.shape}"
        )
    if raw.dtype == np.bool_:
        return raw
    if raw.dtype.kind not in "iuf" or not np.isin(raw, (0, 1)).all():
        raise InvalidArgumentError(
            f"valid_mask must hold bools or 0/1 numbers, got {raw.dtype} values "
            f"{np.unique(raw)[:10].tolist()!r}"
        )
    return raw.astype(np.bool_)
