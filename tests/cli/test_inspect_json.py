"""``rollout-recovery inspect --json`` writes standard JSON, with means that cannot overflow."""

from __future__ import annotations

import json
import math
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rollout_recovery import FinalizedReward, RolloutRecoveryLedger, build_rollout_recovery_state
from rollout_recovery.checkpoint import write_sidecar
from rollout_recovery.cli._main import cli


class _Cut:
    def require_live(self) -> None:
        return None


def _refuse_constant(name: str) -> Any:
    raise AssertionError(f"not standard JSON: the output holds {name}")


def strict_json(text: str) -> Any:
    """``json.loads`` that refuses NaN, Infinity and -Infinity, as RFC 8259 does."""
    return json.loads(text, parse_constant=_refuse_constant)


def _edge_state() -> dict[str, Any]:
    ledger = RolloutRecoveryLedger()
    ledger.reserve_group(
        _Cut(),
        prompt_id="1",
        prompt_payload={"idx": 1},
        expected_generations=2,
        target_step=0,
        start_weight_version=0,
        group_id="g",
    )
    ledger.mark_group_dispatched(_Cut(), "g")
    for index, reward in enumerate([math.nan, 1e308]):
        ledger.mark_sibling_sealed(
            _Cut(),
            "g",
            generation_index=index,
            gate_rollout_id=ledger.get_group("g").gate_rollout_id(index),
            receipt=None,
            reward=reward,
            mask_sample=False,
        )
    huge = sys.float_info.max
    return build_rollout_recovery_state(
        ledger,
        batch_shortfall={},
        sampler_stamps_target_steps=True,
        finalizer_metrics_by_group={
            "done-1": {"reward_mean": math.nan, "big": 1e308, "max": huge, "up": math.inf},
            "done-2": {"reward_mean": 0.5, "big": 1e308, "max": huge, "up": 1.0},
            "done-3": {"reward_mean": 0.25, "big": 1e308, "max": huge, "up": -math.inf},
        },
        finalizer_rewards_by_group={
            "done-1": [FinalizedReward(sample_id="done-1_g0", rollout_id="r0", reward=math.nan)],
            "done-2": [FinalizedReward(sample_id="done-2_g0", rollout_id="r1", reward=1e308)],
        },
    )


@pytest.fixture(params=["native", "pt"])
def edge_sidecar(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / f"edge-{request.param}"
    write_sidecar(path, _edge_state(), format=request.param)
    return path


def test_inspect_json_is_standard_json_with_null_for_non_finite(edge_sidecar: Path) -> None:
    result = CliRunner().invoke(cli, ["inspect", "--json", str(edge_sidecar)])
    assert result.exit_code == 0, result.output
    summary = strict_json(result.output)
    metrics = summary["finalizer"]["metrics"]
    # A NaN metric makes its mean, min and max NaN (not an order-dependent min), so null.
    assert metrics["reward_mean"] == {"groups": 3, "mean": None, "min": None, "max": None}
    # Means that a running sum overflowed: 3e308 / 3 printed Infinity.
    assert metrics["big"] == {"groups": 3, "mean": 1e308, "min": 1e308, "max": 1e308}
    huge = sys.float_info.max
    assert metrics["max"] == {"groups": 3, "mean": huge, "min": huge, "max": huge}
    # inf and -inf: the mean is NaN, the extremes infinite; all null.
    assert metrics["up"] == {"groups": 3, "mean": None, "min": None, "max": None}
    assert summary["finalizer"]["reward_observations"] == 2


def test_inspect_text_still_shows_non_finite_numbers(edge_sidecar: Path) -> None:
    result = CliRunner().invoke(cli, ["inspect", str(edge_sidecar)])
    assert result.exit_code == 0, result.output
    assert "mean=nan min=nan max=nan over 3 groups" in result.output
    assert "mean=1e+308 min=1e+308 max=1e+308 over 3 groups" in result.output
    assert "mean=nan min=-inf max=inf over 3 groups" in result.output


def test_help_documents_null_for_non_finite_numbers() -> None:
    result = CliRunner().invoke(cli, ["inspect", "--help"])
    assert result.exit_code == 0
    assert "is written as null" in " ".join(result.output.split())


@pytest.mark.parametrize(
    "values",
    [
        [1e308, 1e308, 1e308],  # the running sum overflows
        [1e308, 1e308, -1e308, 1 / 3],  # an intermediate sum overflows, the total does not
        [1e-320, 3e-320],
        [0.1, 0.2, 0.3],
        [0.0, -0.0],
    ],
)
def test_mean_is_accurate_and_does_not_overflow(tmp_path: Path, values: list[float]) -> None:
    path = tmp_path / "sidecar"
    write_sidecar(
        path,
        build_rollout_recovery_state(
            RolloutRecoveryLedger(),
            batch_shortfall={},
            sampler_stamps_target_steps=True,
            finalizer_metrics_by_group={f"g{i}": {"m": v} for i, v in enumerate(values)},
        ),
    )
    result = CliRunner().invoke(cli, ["inspect", "--json", str(path)])
    assert result.exit_code == 0, result.output
    exact = float(sum(map(Fraction, values), Fraction(0)) / len(values))
    got = strict_json(result.output)["finalizer"]["metrics"]["m"]["mean"]
    assert got == pytest.approx(exact, rel=2**-52, abs=5e-324)
