"""Schema constants and the field sets that make decoding strict."""

from __future__ import annotations

from typing import Any, TypeAlias

__all__ = [
    "ATTEMPT_STATE_FIELDS",
    "GROUP_STATE_FIELDS",
    "LEDGER_STATE_FIELDS",
    "PROMPT_REF_STATE_FIELDS",
    "REWARD_CHECKS_FIELDS",
    "ROLLOUT_RECOVERY_SCHEMA_VERSION",
    "ROLLOUT_RECOVERY_STATE_FILENAME",
    "SIBLING_STATE_FIELDS",
    "SIDECAR_STATE_FIELDS",
    "SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS",
    "RolloutRecoveryState",
]

ROLLOUT_RECOVERY_SCHEMA_VERSION = 3
SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS: frozenset[int] = frozenset(
    {ROLLOUT_RECOVERY_SCHEMA_VERSION}
)
ROLLOUT_RECOVERY_STATE_FILENAME = "rollout_recovery.pt"

RolloutRecoveryState: TypeAlias = dict[str, Any]

# Every persisted level rejects unknown keys, so adding a record field forces a schema
# decision instead of silently dropping data on an older reader.
LEDGER_STATE_FIELDS = frozenset({"schema_version", "groups"})
SIDECAR_STATE_FIELDS = LEDGER_STATE_FIELDS | frozenset(
    {
        "batch_shortfall",
        "finalizer_metrics_by_group",
        "finalizer_rewards_by_group",
        "reward_settings",
        "sampler_stamps_target_steps",
    }
)
GROUP_STATE_FIELDS = frozenset(
    {
        "group_id",
        "admission_id",
        "prompt_id",
        "prompt_ref",
        "task_source",
        "recovery_granularity",
        "expected_generations",
        "target_step",
        "start_weight_version",
        "status",
        "phase",
        "siblings",
    }
)
PROMPT_REF_STATE_FIELDS = frozenset({"sample_id", "task_name"})
SIBLING_STATE_FIELDS = frozenset({"generation_index", "attempts"})
ATTEMPT_STATE_FIELDS = frozenset(
    {
        "attempt_uuid",
        "status",
        "receipt",
        "reward",
        "mask_sample",
        "reward_checks",
        "reward_log_context",
        "staging_keys",
    }
)
REWARD_CHECKS_FIELDS = frozenset({"duplicated_reasoning", "empty_final_answer", "low_effort"})
