"""Valid sidecars built by driving the ledger (no test functions here).

``rich_state`` covers every shape a sidecar field can take: both granularities, every
group phase and status a checkpoint allows, retried siblings (history), sealed siblings
with and without receipts, reward checks and log contexts, shortfall, reward settings and
finalizer observations.
"""

from __future__ import annotations

import copy
from typing import Any

from rollout_recovery import (
    CaptureRewardSettings,
    FinalizedReward,
    RecoveryGranularity,
    RewardChecks,
    RewardLogContext,
    RolloutRecoveryLedger,
    build_rollout_recovery_state,
)


class _Cut:
    def require_live(self) -> None:
        return None


CUT = _Cut()


def receipt(gate: str, calls: int = 2) -> dict[str, Any]:
    return {
        "rollout_id": gate,
        "manifest": [{"staging_key": f"{gate}/c{k}", "call": k} for k in range(calls)],
        "meta": {"tokens": [1, 2, 3], "blob": b"\x00\xff", "nested": {"ok": True, "x": None}},
    }


def _reserve(
    ledger: RolloutRecoveryLedger,
    index: int,
    *,
    n: int = 4,
    granularity: RecoveryGranularity = RecoveryGranularity.SIBLING,
    admitted: bool = True,
) -> str:
    group_id = f"grp-{index}"
    ledger.reserve_group(
        CUT,
        prompt_id=str(index),
        prompt_payload={"idx": index, "task_name": "math" if index % 2 else None},
        expected_generations=n,
        target_step=index // 3 if admitted else None,
        start_weight_version=index,
        task_source="unit" if index % 3 == 0 else None,
        recovery_granularity=granularity,
        admitted=admitted,
        group_id=group_id,
        admission_id=f"adm-{index}",
    )
    return group_id


def _seal(ledger: RolloutRecoveryLedger, group_id: str, index: int, **extra: Any) -> None:
    gate = ledger.get_group(group_id).gate_rollout_id(index)
    missing = extra.pop("missing", False)
    ledger.mark_sibling_sealed(
        CUT,
        group_id,
        generation_index=index,
        gate_rollout_id=gate,
        receipt=None if missing else receipt(gate, calls=1 + index % 3),
        reward=extra.pop("reward", 0.25 * index),
        mask_sample=extra.pop("mask_sample", index % 2 == 1),
        **extra,
    )


def rich_ledger() -> RolloutRecoveryLedger:
    ledger = RolloutRecoveryLedger()
    _reserve(ledger, 0, admitted=False)  # RESERVED phase
    gid = _reserve(ledger, 1)  # admitted, dispatched, partly sealed, retried
    ledger.mark_group_dispatched(CUT, gid)
    _seal(
        ledger,
        gid,
        0,
        reward_checks=RewardChecks(
            duplicated_reasoning=True, empty_final_answer=False, low_effort=True
        ),
        reward_log_context=RewardLogContext(agent_name="agent", full_result_json='{"a": 1}'),
    )
    _seal(ledger, gid, 1, missing=True)
    ledger.abandon_unsealed(CUT, gid)
    ledger.prepare_incomplete_retry(CUT, gid)
    gid = _reserve(ledger, 2)  # every sibling sealed: ready to finalize
    ledger.mark_group_dispatched(CUT, gid)
    for index in range(4):
        _seal(ledger, gid, index)
    gid = _reserve(ledger, 3, n=2, granularity=RecoveryGranularity.PROMPT_GROUP)
    ledger.mark_group_dispatched(CUT, gid)
    ledger.abandon_unsealed(CUT, gid)
    ledger.prepare_incomplete_retry(CUT, gid)
    return ledger


def rich_state() -> dict[str, Any]:
    ledger = rich_ledger()
    context = RewardLogContext(agent_name="agent", full_result_json=None)
    return build_rollout_recovery_state(
        ledger,
        batch_shortfall={0: 1, 5: 2},
        sampler_stamps_target_steps=True,
        finalizer_metrics_by_group={"done-1": {"reward_mean": 0.5, "len": 12.0}},
        finalizer_rewards_by_group={
            "done-1": [
                FinalizedReward(sample_id="done-1_g0", rollout_id="r0", reward=0.5),
                FinalizedReward(
                    sample_id="done-1_g1", rollout_id="r1", reward=-1.0, log_context=context
                ),
            ]
        },
        reward_settings=CaptureRewardSettings(
            enabled_penalties=("penalize_unwanted_tokens",), unwanted_tokens=(3, 7)
        ),
    )


def fresh(state: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(state)
