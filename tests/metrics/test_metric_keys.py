"""The one key grammar, and flatten_scalars, which makes keys that pass it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery.errors import InvalidArgumentError, InvalidArgumentTypeError
from rollout_recovery.metrics._keys import check_values, flatten_scalars, key_segment


def test_flatten_scalars_on_the_http_backends_telemetry() -> None:
    record = {
        "step": 3,
        "mean_reward": np.float64(0.5),
        "groups": 8,
        "train/loss": 0.25,
        "backend": {
            "servers": {
                "http://127.0.0.1:8000": {"state": "healthy", "calls": 12, "dead": False},
            },
            "redispatches": 2,
            "data_failures": {},
        },
        "tags": ["a", "b"],
        "missing": None,
    }
    assert flatten_scalars(record) == {
        "mean_reward": 0.5,
        "groups": 8,
        "train/loss": 0.25,
        "backend/servers/http___127.0.0.1_8000/calls": 12,
        "backend/servers/http___127.0.0.1_8000/dead": 0,
        "backend/redispatches": 2,
        "missing": None,
    }


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"a//b": 1}, InvalidArgumentError),
        ({"a/": 1}, InvalidArgumentError),
        ({"a/../b": 1}, InvalidArgumentError),
        ({"http://x": 1}, InvalidArgumentError),
        ({"x" * 251: 1}, InvalidArgumentError),
        ({"step": 1}, InvalidArgumentError),
        ({"a": 1, "a/b": 2}, InvalidArgumentError),
        ({"ok": True}, InvalidArgumentTypeError),
        ({"ok": "1"}, InvalidArgumentTypeError),
        ({"ok": np.float32(1)}, InvalidArgumentTypeError),
        ({1: 1}, InvalidArgumentTypeError),
    ],
)
def test_bad_keys_and_values_are_refused_by_name(values: dict[object, object], error: type) -> None:
    with pytest.raises(error) as raised:
        check_values(values)
    assert "$[" in str(raised.value)


def test_a_good_record_passes_unchanged() -> None:
    values = {"train/loss": 0.5, "a b/c-d.e_f": 1, "none": None, "nan": math.nan}
    assert check_values(values) == values


_names = st.one_of(st.text(max_size=12), st.sampled_from(["a", "a/b", "a/b/c", "b", "a b"]))
_nested = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=3)),
    lambda children: st.dictionaries(_names, children, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(_names, _nested, max_size=6))
def test_whatever_flatten_scalars_makes_log_step_takes(record: dict[str, object]) -> None:
    check_values(flatten_scalars(record))


@given(st.text())
def test_key_segment_is_always_one_valid_segment(name: str) -> None:
    segment = key_segment(name)
    assert "/" not in segment
    check_values({segment[:250]: 1})
