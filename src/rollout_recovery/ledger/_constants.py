"""Schema constants and the field sets that make decoding strict."""

from __future__ import annotations

from typing import Any, TypeAlias

from ..rewards import RewardChecks
from ._storage import (
    AttemptState,
    GroupState,
    PromptRefState,
    SiblingState,
)

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
# Derived from the storage Structs, the one definition of each persisted record's fields.
GROUP_STATE_FIELDS = frozenset(GroupState.__struct_fields__)
PROMPT_REF_STATE_FIELDS = frozenset(PromptRefState.__struct_fields__)
SIBLING_STATE_FIELDS = frozenset(SiblingState.__struct_fields__)
ATTEMPT_STATE_FIELDS = frozenset(AttemptState.__struct_fields__)
REWARD_CHECKS_FIELDS = frozenset(RewardChecks.__struct_fields__)
