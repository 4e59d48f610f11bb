"""Which tokens the trainer may check against its own logprobs, and how a refused step
is folded into the state (issue 24, item 12)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.control._logprob_check import (
    guilty_rows,
    logprob_refusal,
    refusal_message,
    token_versions,
    trainer_weights_generate,
)
from rollout_recovery.control._state import ControllerState
from rollout_recovery.finalize import CanonicalRowMeta
from rollout_recovery.history.records import StepTrained


@pytest.mark.parametrize(
    ("sections", "vouched"),
    [
        ({}, True),
        ({"generation": {"backend": "http"}, "http": {"servers": ["http://s:1"]}}, True),
        (
            {
                "generation": {"backend": "http"},
                "http": {"servers": ["http://s:1"], "weight_sync": "none"},
            },
            False,
        ),
        (
            {
                "generation": {"backend": "http"},
                "http": {"servers": ["http://s:1"], "weight_sync": "version-tag"},
            },
            False,
        ),
        ({"generation": {"backend": "ray"}, "http": {"weight_sync": "none"}}, True),
        (
            {
                "generation": {"backend": "ray"},
                "ray": {"worker": "http"},
                "http": {"servers": ["http://s:1"], "weight_sync": "none"},
            },
            False,
        ),
    ],
)
def test_only_weights_the_job_sent_are_vouched_for(
    sections: dict[str, dict[str, Any]], vouched: bool
) -> None:
    assert trainer_weights_generate(config_from_builtins(sections)) is vouched


def _meta(spans: list[tuple[int, int, int]], low: int | None, high: int | None) -> CanonicalRowMeta:
    return CanonicalRowMeta(
        sample_id="g_g0",
        group_id="g",
        generation_index=0,
        prompt_id="0",
        target_step=0,
        rollout_id="g_g0_a0",
        valid=True,
        mask_sample=False,
        sample_mask=1.0,
        reward=1.0,
        prompt_len=2,
        min_weight_version=low,
        max_weight_version=high,
        weight_version=0 if low is None else low,
        reason=None,
        weight_version_spans=spans,
    )


def test_each_token_gets_its_spans_version_and_prompt_tokens_none() -> None:
    mask = np.array([0, 0, 1, 1, 0, 1], dtype=np.float32)
    versions = token_versions(_meta([(3, 2, 4), (4, 5, 6)], 3, 4), mask)
    assert versions.tolist() == [-1, -1, 3, 3, -1, 4]
    # Without spans, one version for every call is every generated token's; two are none.
    assert token_versions(_meta([], 5, 5), mask).tolist() == [-1, -1, 5, 5, -1, 5]
    assert token_versions(_meta([], 5, 6), mask).tolist() == [-1] * 6


def test_a_refused_step_counts_as_a_step_without_a_valid_row_trained() -> None:
    state = ControllerState.initial(0)
    state.apply(StepTrained(step=0, weight_version=1, group_ids=[], rows=[], valid_rows=3))
    assert state.steps_without_valid_rows == 0
    refusal = logprob_refusal(
        step=0,
        metrics={"logprob_gap": 1.5, "logprob_checked_tokens": 12.0},
        tolerance=0.2,
        rows=3,
        steps_without_valid_rows=state.steps_without_valid_rows + 1,
        servers=["http://liar"],
        guilty_rows=2,
        untraced_rows=1,
    )
    state.apply(refusal)
    assert state.steps_without_valid_rows == 1
    assert refusal.detail == {
        "step": 0,
        "gap": 1.5,
        "tolerance": 0.2,
        "checked_tokens": 12,
        "rows": 3,
        "steps_without_valid_rows": 1,
        "servers": ["http://liar"],
        "guilty_rows": 2,
        "untraced_rows": 1,
    }
    message = refusal_message(refusal)
    assert "3 rows not trained; servers taken out of rotation: http://liar " in message
    assert "(1 rows above the tolerance not traced to a server)" in message
    # A step that trains valid rows ends the streak.
    state.apply(StepTrained(step=1, weight_version=2, group_ids=[], rows=[], valid_rows=3))
    assert state.steps_without_valid_rows == 0


class _Reports:
    def __init__(self, gaps: tuple[float, ...]) -> None:
        self.sample_logprob_gaps = gaps


def test_the_rows_blamed_are_those_whose_own_gap_is_above_the_tolerance() -> None:
    ids = ["a", "b", "c", "d"]
    gaps = (0.5, 1e-7, float("nan"), 0.2)
    # Above the tolerance: guilty; within it: cleared; not checked (NaN): neither.
    assert guilty_rows(_Reports(gaps), ids, 0.2) == (["a"], ["b", "d"])
    # A trainer that does not say, or says for another batch: nothing is blamed on a guess.
    assert guilty_rows(object(), ids, 0.2) == ([], [])
    assert guilty_rows(_Reports(gaps[:3]), ids, 0.2) == ([], [])
