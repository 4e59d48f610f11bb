"""grpo_advantages at the edges of float range: scaled where it must be, unchanged elsewhere.

``_seed_grpo_advantages`` is the implementation before the std was computed in a scaled
form, kept verbatim as the oracle: on ordinary inputs the current one must return exactly
its bytes. At huge and tiny magnitudes the current one is checked against exact rational
arithmetic instead.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery.finalize import grpo_advantages
from rollout_recovery.finalize._advantages import ADVANTAGE_EPSILON


def _seed_grpo_advantages(
    rewards: npt.ArrayLike, mask: npt.ArrayLike, *, leave_one_out: bool, normalize: bool
) -> npt.NDArray[np.float64]:
    """The pre-scaling implementation (validation dropped: callers pass valid input), with
    the equal-rewards rule added later."""
    values = np.asarray(rewards, dtype=np.float64)
    valid_mask = np.asarray(mask, dtype=np.bool_)
    advantages = np.zeros(values.shape[0], dtype=np.float64)
    valid_rows = np.flatnonzero(valid_mask)
    count = valid_rows.size
    if count <= 1:
        return advantages
    valid = values[valid_rows]
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
        # Plus the one intended change since: a reference set of equal rewards has no
        # spread even when its float mean is inexact (the rounding std is not a spread).
        inside = membership > 0
        equal = np.max(np.where(inside, valid, -np.inf), axis=1) == np.min(
            np.where(inside, valid, np.inf), axis=1
        )
        spread = (std > 0) & ~equal
        centered = np.where(spread, centered / (std + ADVANTAGE_EPSILON), centered)
    advantages[valid_rows] = centered
    return advantages


# ----------------------------------------------------------------- ordinary inputs


def _ordinary_sample() -> list[tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], bool, bool]]:
    rng = np.random.default_rng(20240607)
    cases = []
    for i in range(60):
        n = int(rng.integers(1, 17))
        kind = i % 4
        if kind == 0:
            rewards = rng.integers(0, 2, n).astype(float)
        elif kind == 1:
            rewards = rng.uniform(-5, 5, n)
        elif kind == 2:
            rewards = rng.integers(-3, 4, n) * 0.25
        else:
            rewards = rng.normal(0.0, 1e3, n)
        mask = rng.random(n) < 0.8
        for loo in (False, True):
            for norm in (False, True):
                cases.append((rewards, mask, loo, norm))
    return cases


# sha256 over the 240 outputs of _ordinary_sample, captured from the implementation before
# the scaled std (the same digest _seed_grpo_advantages gives; the next test checks that).
SEED_SAMPLE_DIGEST = "a14f61ccdc594eeaff13feff21ace251db74ed0c68e7bddba8ae47eca88af43d"


@pytest.mark.parametrize("implementation", ["current", "seed"])
def test_ordinary_sample_is_bit_identical_to_the_seed(implementation: str) -> None:
    digest = hashlib.sha256()
    for rewards, mask, loo, norm in _ordinary_sample():
        if implementation == "current":
            got = grpo_advantages(rewards, mask, leave_one_out=loo, normalize=norm)
        else:
            got = _seed_grpo_advantages(rewards, mask, leave_one_out=loo, normalize=norm)
        digest.update(got.astype("<f8").tobytes())
    assert digest.hexdigest() == SEED_SAMPLE_DIGEST


# Ordinary: 0 or a magnitude from 1e-100 to 1e6; squares of deviations stay normal floats.
ordinary_reward = st.one_of(
    st.just(0.0), st.floats(1e-100, 1e6), st.floats(-1e6, -1e-100), st.integers(-5, 5)
).map(float)


@given(
    rows=st.lists(st.tuples(ordinary_reward, st.booleans()), min_size=1, max_size=24),
    leave_one_out=st.booleans(),
    normalize=st.booleans(),
)
def test_ordinary_inputs_give_the_seeds_exact_bytes(
    rows: list[tuple[float, bool]], leave_one_out: bool, normalize: bool
) -> None:
    rewards = [reward for reward, _ in rows]
    mask = [valid for _, valid in rows]
    got = grpo_advantages(rewards, mask, leave_one_out=leave_one_out, normalize=normalize)
    seed = _seed_grpo_advantages(rewards, mask, leave_one_out=leave_one_out, normalize=normalize)
    assert got.tobytes() == seed.tobytes()


# -------------------------------------------------------------------- the reported case


def test_huge_rewards_are_normalized() -> None:
    # Squaring 1e160 overflows; the seed then counted the spread as 0 and returned the raw
    # deviations [1e160, 0, -1e160].
    got = grpo_advantages([1e160, 0.0, -1e160], leave_one_out=False)
    assert got.tolist() == [1.0, 0.0, -1.0]
    loo = grpo_advantages([1e160, 0.0, -1e160])
    # Row 0's others {0, -1e160}: baseline -5e159, std 1e160/sqrt(2).
    assert loo == pytest.approx([1.5 * math.sqrt(2), 0.0, -1.5 * math.sqrt(2)], rel=1e-12, abs=0)


def test_tiny_rewards_are_divided_by_their_spread() -> None:
    # Squaring 1e-170 underflows to 0: the seed returned the raw deviations. Divided by
    # std + 1e-6, they are about 1e-164.
    got = grpo_advantages([1e-170, 0.0, -1e-170], leave_one_out=False)
    assert got == pytest.approx([1e-164, 0.0, -1e-164], rel=1e-9, abs=0)


def test_rewards_near_the_float_limit() -> None:
    got = grpo_advantages([1.5e308, 0.0, -1.5e308], leave_one_out=False)
    assert got.tolist() == [1.0, 0.0, -1.0]
    # Without a spread to divide by, a deviation of 3e308 is beyond the float range.
    with np.errstate(over="ignore"):
        raw = grpo_advantages([1.5e308, -1.5e308])
    assert raw.tolist() == [math.inf, -math.inf]


# ------------------------------------------------------ properties at every magnitude


def _scaled_sqrt(value: Fraction) -> float:
    """sqrt of a non-negative rational, right even where the value itself overflows."""
    if value == 0:
        return 0.0
    shift = (value.numerator.bit_length() - value.denominator.bit_length()) // 2
    return math.ldexp(math.sqrt(value / Fraction(4) ** shift), shift)


def _bessel_std(values: Sequence[Fraction]) -> float:
    mean = sum(values, Fraction(0)) / len(values)
    return _scaled_sqrt(sum(((v - mean) ** 2 for v in values), Fraction(0)) / (len(values) - 1))


def _exact_advantages(
    rewards: Sequence[float], mask: Sequence[bool], *, leave_one_out: bool, normalize: bool
) -> list[float]:
    """The documented formula in rational arithmetic, rounded once per output."""
    valid = [Fraction(r) for r, ok in zip(rewards, mask, strict=True) if ok]
    if len(valid) <= 1:
        return [0.0] * len(rewards)
    out = []
    for i, value in enumerate(valid):
        reference = [v for j, v in enumerate(valid) if not (leave_one_out and j == i)]
        deviation = float(value - sum(reference, Fraction(0)) / len(reference))
        std = _bessel_std(reference) if len(reference) > 1 else 0.0
        out.append(deviation / (std + ADVANTAGE_EPSILON) if normalize and std > 0 else deviation)
    it = iter(out)
    return [next(it) if ok else 0.0 for ok in mask]


def _group(
    magnitude: st.SearchStrategy[float],
) -> st.SearchStrategy[tuple[list[float], list[bool]]]:
    """Small integers times one magnitude, some rows placeholders holding junk."""

    @st.composite
    def build(draw: st.DrawFn) -> tuple[list[float], list[bool]]:
        scale = draw(magnitude)
        rows = draw(
            st.lists(st.tuples(st.integers(-1000, 1000), st.booleans()), min_size=2, max_size=12)
        )
        mask = [valid for _, valid in rows]
        junk = draw(st.sampled_from([math.nan, math.inf, 1e308, 0.0]))
        return [base * scale if valid else junk for base, valid in rows], mask

    return build()


# 10**k times a mantissa in [1, 10): every decade from 1e-300 to 1e300.
decimal_magnitude = st.builds(
    lambda k, m: m * 10.0**k, st.integers(-300, 299), st.floats(1.0, 10.0, exclude_max=True)
)
# Powers of two over the same range: group sums are then exact, so a reference set of
# equal rewards has exactly zero spread, as in exact arithmetic.
binary_magnitude = st.integers(-996, 996).map(lambda k: math.ldexp(1.0, k))


@given(group=_group(decimal_magnitude))
def test_normalized_advantages_have_mean_0_and_std_1_up_to_epsilon(
    group: tuple[list[float], list[bool]],
) -> None:
    rewards, mask = group
    valid = [Fraction(r) for r, ok in zip(rewards, mask, strict=True) if ok]
    if len(valid) < 2 or len(set(valid)) == 1:
        return  # no spread: nothing to normalize
    got = grpo_advantages(rewards, mask, leave_one_out=False)
    assert np.isfinite(got).all()
    assert not got[~np.asarray(mask)].any()
    spread = _bessel_std(valid)
    advantages = [Fraction(float(a)) for a, ok in zip(got, mask, strict=True) if ok]
    # Dividing by std + 1e-6 makes the std spread / (spread + 1e-6): 1 for any spread well
    # above 1e-6, and spread * 1e6 below (the upstream epsilon damps tiny spreads).
    expected_std = spread / (spread + ADVANTAGE_EPSILON)
    assert _bessel_std(advantages) == pytest.approx(expected_std, rel=1e-9, abs=0)
    if spread > 1e-3:
        assert _bessel_std(advantages) == pytest.approx(1.0, rel=1e-3, abs=0)
    mean = float(sum(advantages, Fraction(0)) / len(advantages))
    assert abs(mean) <= 1e-9 * expected_std


@given(group=_group(binary_magnitude), leave_one_out=st.booleans(), normalize=st.booleans())
def test_advantages_match_exact_arithmetic_at_every_magnitude(
    group: tuple[list[float], list[bool]], leave_one_out: bool, normalize: bool
) -> None:
    rewards, mask = group
    got = grpo_advantages(rewards, mask, leave_one_out=leave_one_out, normalize=normalize)
    expected = _exact_advantages(rewards, mask, leave_one_out=leave_one_out, normalize=normalize)
    largest = max((abs(e) for e in expected), default=0.0)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9 * largest)


def test_a_reference_set_of_equal_rewards_has_no_spread_even_with_an_inexact_mean() -> None:
    # mean([0.1, 0.1, 0.1]) is not exactly 0.1: the rounding left a std of ~1e-17, and
    # dividing by it (plus 1e-6) made row 0's advantage 9e5 instead of its deviation 0.9.
    advantages = grpo_advantages([1.0, 0.1, 0.1, 0.1])
    assert advantages[0] == pytest.approx(0.9)
    assert np.abs(grpo_advantages([0.1] * 3, leave_one_out=False)).max() < 1e-15
