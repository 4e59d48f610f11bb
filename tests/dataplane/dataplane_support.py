"""Shared helpers for the data-plane tests: a cut double and deterministic rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from rollout_recovery.dataplane import Row
from rollout_recovery.errors import DeadCutError


class FakeCut:
    """A ``MutationCut`` whose liveness the test controls; counts its checks."""

    def __init__(self) -> None:
        self.live = True
        self.checks = 0

    def require_live(self) -> None:
        self.checks += 1
        if not self.live:
            raise DeadCutError("data-plane mutation cut is no longer active")


def dead_cut() -> FakeCut:
    cut = FakeCut()
    cut.live = False
    return cut


def make_row(seed: int, length: int | None = None, **metadata: Any) -> Row:
    """A row whose every byte follows from ``seed`` (and ``length``)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 64)) if length is None else length
    return Row(
        token_ids=rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int32),
        token_mask=(rng.random(n) < 0.5).astype(np.float32),
        logprobs=-rng.random(n, dtype=np.float32),
        metadata={"seed": seed, **metadata},
    )


def assert_rows_equal(got: Row, expected: Row) -> None:
    """Byte-exact comparison (NaN payloads included); metadata compared after the
    JSON-like round trip, where tuples become lists."""
    for name in ("token_ids", "token_mask", "logprobs"):
        a, b = getattr(got, name), getattr(expected, name)
        assert a.dtype == b.dtype, name
        assert a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name
    assert dict(got.metadata) == listify(dict(expected.metadata))


def listify(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [listify(item) for item in value]
    if isinstance(value, dict):
        return {key: listify(item) for key, item in value.items()}
    return value
