"""Property: after any crash and restore, staging holds exactly what the ledger expects."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_recovery import RecoveryGranularity, RolloutRecoveryLedger, SiblingSealResult
from rollout_recovery.control._inventory import reconcile_staging
from rollout_recovery.dataplane import MemoryDataPlane, Row

STAGING = "rollout_staging"
ROW = Row(
    token_ids=np.arange(2, dtype=np.int32),
    token_mask=np.ones(2, np.float32),
    logprobs=np.zeros(2, np.float32),
)


class _Cut:
    def require_live(self) -> None:
        return None


CUT = _Cut()
# Per sibling: how far its attempt got before the crash.
OUTCOMES = st.sampled_from(["reserved", "staged", "sealed", "sealed-no-receipt"])
GROUP = st.tuples(
    st.sampled_from(list(RecoveryGranularity)), st.lists(OUTCOMES, min_size=1, max_size=4)
)


def _receipt(gate: str, calls: int) -> dict[str, object]:
    return {"rollout_id": gate, "manifest": [{"staging_key": f"{gate}/c{c}"} for c in range(calls)]}


def _run_and_crash(
    groups: list[tuple[RecoveryGranularity, list[str]]], store: MemoryDataPlane
) -> RolloutRecoveryLedger:
    ledger = RolloutRecoveryLedger()
    for number, (granularity, outcomes) in enumerate(groups):
        group_id = f"g{number}"
        ledger.reserve_group(
            CUT,
            prompt_id=str(number),
            prompt_payload={"idx": number},
            expected_generations=len(outcomes),
            target_step=0,
            start_weight_version=0,
            recovery_granularity=granularity,
            group_id=group_id,
        )
        ledger.mark_group_dispatched(CUT, group_id)
        gates = ledger.get_group(group_id).gate_rollout_ids
        for gate, outcome in zip(gates, outcomes, strict=True):
            if outcome != "reserved":  # a worker staged two calls for every started sibling
                store.put(STAGING, {f"{gate}/c0": ROW, f"{gate}/c1": ROW})
        sealed = {
            i: SiblingSealResult(
                gate_rollout_id=gate,
                receipt=None if outcome == "sealed-no-receipt" else _receipt(gate, 2),
                reward=1.0,
                mask_sample=False,
            )
            for i, (gate, outcome) in enumerate(zip(gates, outcomes, strict=True))
            if outcome.startswith("sealed")
        }
        if granularity is RecoveryGranularity.PROMPT_GROUP:
            if len(sealed) == len(outcomes):
                ledger.mark_group_sealed(CUT, group_id, sealed)
        else:
            for index, result in sealed.items():
                ledger.mark_sibling_sealed(
                    CUT,
                    group_id,
                    generation_index=index,
                    gate_rollout_id=result.gate_rollout_id,
                    receipt=result.receipt,
                    reward=result.reward,
                    mask_sample=result.mask_sample,
                )
    return ledger


@settings(max_examples=150, deadline=None)
@given(st.lists(GROUP, min_size=1, max_size=5))
def test_staging_matches_the_ledger_after_restore(
    groups: list[tuple[RecoveryGranularity, list[str]]],
) -> None:
    store = MemoryDataPlane()
    crashed = _run_and_crash(groups, store)
    sealed_before = crashed.expected_staging_keys()
    restored = RolloutRecoveryLedger.from_state_dict(crashed.state_dict())
    restored.prepare_for_restart(CUT)
    reconcile_staging(restored, store, CUT, partition=STAGING, clear_unreferenced=True)
    assert set(store.keys(STAGING)) == restored.expected_staging_keys()
    # Sibling-granularity seals, and fully sealed atomic cohorts, survive the restart.
    kept = {
        key
        for number, (granularity, outcomes) in enumerate(groups)
        if granularity is RecoveryGranularity.SIBLING
        or all(o.startswith("sealed") for o in outcomes)
        for key in sealed_before
        if key.startswith(f"g{number}_")
    }
    assert kept <= set(store.keys(STAGING))
