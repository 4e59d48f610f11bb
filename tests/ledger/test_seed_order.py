"""Which error comes first when several apply: the seed's order, pinned case by case.

Each case is one the differential fuzz (``test_seed_differential.py``) found; these run
without the seed oracle. The rule: the seed's checks run in the seed's order (arguments,
then state); ours, stricter, run after all of them, so a call the seed refuses is refused
with the seed's builtin exception type, and a refused call changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from ledger_support import reserve

from rollout_recovery import (
    FinalizedReward,
    RolloutRecoveryLedger,
    build_rollout_recovery_state,
    parse_rollout_recovery_state,
)
from rollout_recovery.errors import BareStringError

# ------------------------------------------------------------------------------ sidecars


def _split_admission() -> RolloutRecoveryLedger:
    """Two groups of one admission batch that disagree: the seed writes, then cannot read."""
    ledger = RolloutRecoveryLedger()
    reserve(ledger, 1, group_id="g1", admission_id="a", admitted=False)
    reserve(ledger, 2, group_id="g2", admission_id="a", admitted=True)
    return ledger


def _build(ledger: RolloutRecoveryLedger, **overrides: Any) -> Any:
    arguments: dict[str, Any] = {"batch_shortfall": {}, "sampler_stamps_target_steps": True}
    arguments.update(overrides)
    return build_rollout_recovery_state(ledger, **arguments)


def test_controller_fields_come_before_the_admission_rule() -> None:
    ledger = _split_admission()
    with pytest.raises(TypeError, match="batch_shortfall must be a dictionary"):
        _build(ledger, batch_shortfall=[])
    with pytest.raises(ValueError, match="finalizer_metrics_by_group must be a mapping"):
        _build(ledger, finalizer_metrics_by_group=[1])
    # The stricter rule stays: a sidecar the seed's own restore refuses is never written.
    with pytest.raises(ValueError, match="disagree on phase or target_step"):
        _build(ledger)
    with pytest.raises(ValueError, match="disagree on phase or target_step"):
        ledger.state_dict()


def test_the_seeds_field_errors_come_before_ours_stricter_ones() -> None:
    ledger = RolloutRecoveryLedger()
    reserve(ledger, group_id="g0")
    with pytest.raises(ValueError, match="batch_shortfall entries must contain") as raised:
        _build(ledger, canonical_group_ids="g0", batch_shortfall={-1: 1})
    assert not isinstance(raised.value, BareStringError)
    with pytest.raises(BareStringError):
        _build(ledger, canonical_group_ids="g0")
    with pytest.raises(TypeError, match="FinalizedReward"):
        _build(ledger, batch_shortfall={1: 2**63}, finalizer_rewards_by_group={"g0": [None]})
    with pytest.raises(ValueError, match="fit in 64 bits"):
        _build(ledger, batch_shortfall={1: 2**63})


def _sidecar(**overrides: Any) -> dict[str, Any]:
    row = FinalizedReward(sample_id="3", rollout_id="r", reward=1.0).state_dict()
    state: dict[str, Any] = {
        "schema_version": 3,
        "groups": [],
        "batch_shortfall": {1: 2},
        "sampler_stamps_target_steps": True,
        "finalizer_metrics_by_group": {"g0": {"m": 1.0}},
        "finalizer_rewards_by_group": {"g0": [row]},
        "reward_settings": None,
    }
    state.update(overrides)
    return state


def test_a_lone_surrogate_in_a_finalized_reward_is_refused_after_the_seeds_checks() -> None:
    rows = {"g0": [{"sample_id": "\ud800", "rollout_id": "r", "reward": 1.0, "log_context": None}]}
    with pytest.raises(TypeError, match="batch_shortfall must be a dictionary"):
        parse_rollout_recovery_state(
            _sidecar(finalizer_rewards_by_group=rows, batch_shortfall=None)
        )
    with pytest.raises(ValueError, match="UTF-8") as raised:
        parse_rollout_recovery_state(_sidecar(finalizer_rewards_by_group=rows))
    assert getattr(raised.value, "path", None) == "$.finalizer_rewards_by_group['g0'][0].sample_id"
    # The seed's own row checks still come first for such a row.
    bad = {"g0": [{**rows["g0"][0], "reward": "1"}]}
    with pytest.raises(ValueError, match="finalized reward must be numeric"):
        parse_rollout_recovery_state(_sidecar(finalizer_rewards_by_group=bad, batch_shortfall=None))
