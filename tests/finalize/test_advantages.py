"""grpo_advantages: examples from upstream's catalogue and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from rollout_recovery.finalize import grpo_advantages

reward = st.floats(-100, 100, allow_nan=False, allow_infinity=False)


def test_placeholder_is_excluded_from_the_baseline() -> None:
    got = grpo_advantages(
        [1, 3, 2, 0], [True, True, True, False], leave_one_out=False, normalize=False
    )
    assert got.tolist() == [-1.0, 1.0, 0.0, 0.0]


def test_leave_one_out_baseline_and_normalization() -> None:
    got = grpo_advantages([1.0, 3.0, 2.0], leave_one_out=True, normalize=False)
    assert got.tolist() == [1 - 2.5, 3 - 1.5, 2 - 2.0]
    normalized = grpo_advantages([1.0, 3.0, 2.0], leave_one_out=True, normalize=True)
    # Row 0's others {3, 2}: std = sqrt(0.5); row 2's others {1, 3}: std = sqrt(2).
    expected = [-1.5 / (math.sqrt(0.5) + 1e-6), 1.5 / (math.sqrt(0.5) + 1e-6), 0.0]
    assert normalized == pytest.approx(expected)


def test_two_valid_rows_with_leave_one_out_have_no_spread_to_normalize_by() -> None:
    # Each row's reference set is one row: Bessel std is NaN, counted as 0, so no division.
    assert grpo_advantages([1.0, 4.0]).tolist() == [-3.0, 3.0]


def test_none_mask_equals_all_valid() -> None:
    rewards = [0.5, 1.0, -2.0, 3.0]
    assert np.array_equal(grpo_advantages(rewards), grpo_advantages(rewards, [1, 1, 1, 1]))


@pytest.mark.parametrize("mask", [[False] * 3, [True, False, False]])
def test_at_most_one_valid_row_gives_zero(mask: list[bool]) -> None:
    assert grpo_advantages([5.0, 1.0, 2.0], mask).tolist() == [0.0, 0.0, 0.0]


def test_equal_rewards_give_zero_without_dividing() -> None:
    assert grpo_advantages([2.0, 2.0, 2.0], leave_one_out=False).tolist() == [0.0] * 3


def test_placeholder_reward_may_be_anything_even_nan() -> None:
    got = grpo_advantages([1.0, math.nan, 3.0], [True, False, True], leave_one_out=False)
    assert got[1] == 0.0 and np.isfinite(got).all()


@pytest.mark.parametrize(
    ("rewards", "mask", "match"),
    [
        ([1.0, 2.0], [True], "one entry per reward"),
        ([[1.0, 2.0]], None, "rewards must be 1-D"),
        ([1.0, math.inf], None, "row 1 is inf"),
        ([math.nan, 1.0], [True, True], "row 0 is nan"),
        ([1.0, 2.0], [0.5, 1.0], "bools or 0/1"),
        ([1.0, 2.0], ["a", "b"], "bools or 0/1"),
    ],
)
def test_invalid_inputs_are_refused(rewards: object, mask: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        grpo_advantages(rewards, mask)  # type: ignore[arg-type]


@st.composite
def masked_groups(draw: st.DrawFn) -> tuple[list[float], list[bool]]:
    n = draw(st.integers(1, 16))
    return draw(st.lists(reward, min_size=n, max_size=n)), draw(
        st.lists(st.booleans(), min_size=n, max_size=n)
    )


@given(masked_groups(), st.booleans(), st.booleans())
def test_placeholders_get_zero(
    group: tuple[list[float], list[bool]], leave_one_out: bool, normalize: bool
) -> None:
    rewards, mask = group
    got = grpo_advantages(rewards, mask, leave_one_out=leave_one_out, normalize=normalize)
    assert got.shape == (len(rewards),) and np.isfinite(got).all()
    assert all(value == 0.0 for value, ok in zip(got, mask, strict=True) if not ok)


@given(masked_groups(), st.booleans())
def test_valid_advantages_sum_to_zero_without_leave_one_out(
    group: tuple[list[float], list[bool]], normalize: bool
) -> None:
    rewards, mask = group
    got = grpo_advantages(rewards, mask, leave_one_out=False, normalize=normalize)
    scale = max(1.0, *(abs(r) for r in rewards))
    assert abs(float(got.sum())) <= 1e-9 * scale * len(rewards) * (1e6 if normalize else 1)


@given(masked_groups(), st.lists(reward, min_size=16, max_size=16), st.booleans(), st.booleans())
def test_invariant_to_placeholder_reward_values(
    group: tuple[list[float], list[bool]],
    replacements: list[float],
    leave_one_out: bool,
    normalize: bool,
) -> None:
    rewards, mask = group
    assume(not all(mask))
    changed = [
        r if ok else replacements[i] for i, (r, ok) in enumerate(zip(rewards, mask, strict=True))
    ]
    kwargs = {"leave_one_out": leave_one_out, "normalize": normalize}
    assert np.array_equal(
        grpo_advantages(rewards, mask, **kwargs), grpo_advantages(changed, mask, **kwargs)
    )


@given(masked_groups(), st.booleans())
def test_placeholders_do_not_change_valid_rows(
    group: tuple[list[float], list[bool]], leave_one_out: bool
) -> None:
    rewards, mask = group
    valid = [r for r, ok in zip(rewards, mask, strict=True) if ok]
    alone = grpo_advantages(valid, leave_one_out=leave_one_out)
    together = grpo_advantages(rewards, mask, leave_one_out=leave_one_out)
    assert np.array_equal(together[np.array(mask, dtype=bool)], alone)
