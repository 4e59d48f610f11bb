"""Crafted values inside a well-formed file get the documented error, naming the field.

Found by review: a 2^1500 integer (which the .pt format can carry) reached float() and
escaped as OverflowError; a deeply nested JSON document inside a log context escaped as
RecursionError, through the loader and through ``rollout-recovery validate``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rollout_recovery import RolloutRecoveryLedger, build_rollout_recovery_state
from rollout_recovery.checkpoint import encode_sidecar, encode_torch_pt, load_sidecar
from rollout_recovery.cli import cli
from rollout_recovery.errors import InvalidStateError


class _Cut:
    def require_live(self) -> None:
        return None


def _state() -> dict[str, Any]:
    cut = _Cut()
    ledger = RolloutRecoveryLedger()
    ledger.reserve_group(
        cut,
        prompt_id="1",
        prompt_payload={"idx": 1},
        expected_generations=2,
        target_step=0,
        start_weight_version=0,
        group_id="g",
    )
    ledger.mark_group_dispatched(cut, "g")
    gate = ledger.get_group("g").gate_rollout_id(0)
    ledger.mark_sibling_sealed(
        cut,
        "g",
        generation_index=0,
        gate_rollout_id=gate,
        receipt=None,
        reward=1.0,
        mask_sample=False,
    )
    return build_rollout_recovery_state(
        ledger, batch_shortfall={}, sampler_stamps_target_steps=True
    )


DEEP_JSON = "[" * 100_000 + "]" * 100_000


def _attempt(state: dict[str, Any]) -> dict[str, Any]:
    attempt: dict[str, Any] = state["groups"][0]["siblings"][0]["attempts"][0]
    return attempt


CASES: list[tuple[str, str, Callable[[dict[str, Any]], None], str]] = [
    ("huge-reward", "pt", lambda s: _attempt(s).__setitem__("reward", 2**1500), ".reward"),
    (
        "huge-metric",
        "pt",
        lambda s: s.__setitem__("finalizer_metrics_by_group", {"x": {"m": 2**1500}}),
        "finalizer_metrics_by_group",
    ),
    (
        "deep-json-context",
        "native",
        lambda s: _attempt(s).__setitem__(
            "reward_log_context", {"agent_name": "a", "full_result_json": DEEP_JSON}
        ),
        "reward_log_context",
    ),
    (
        "deep-json-context-pt",
        "pt",
        lambda s: _attempt(s).__setitem__(
            "reward_log_context", {"agent_name": "a", "full_result_json": DEEP_JSON}
        ),
        "reward_log_context",
    ),
]


def _write(path: Path, state: dict[str, Any], format: str) -> None:
    if format == "pt":
        path.write_bytes(encode_torch_pt(state))
    else:
        path.write_bytes(encode_sidecar(state, format="native", validate=False))


@pytest.mark.parametrize(("name", "format", "mutate", "where"), CASES, ids=[c[0] for c in CASES])
def test_crafted_values_get_the_documented_error(
    tmp_path: Path, name: str, format: str, mutate: Callable[[dict[str, Any]], None], where: str
) -> None:
    state = copy.deepcopy(_state())
    mutate(state)
    path = tmp_path / name
    _write(path, state, format)
    with pytest.raises(InvalidStateError) as caught:
        load_sidecar(path)
    assert caught.value.path is not None and where in caught.value.path
    result = CliRunner().invoke(cli, ["validate", str(path)])
    # A crash would surface as result.exception (a non-SystemExit) with exit code 1 too.
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1, result.output
    assert where in result.output
