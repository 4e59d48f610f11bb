"""The seed's schema-3 rollout-recovery ledger: records, transitions, state and sidecar.

Pure: no I/O and no asyncio. It imports only ``rollout_recovery.rewards`` (the reward
records persisted with sealed attempts) and ``rollout_recovery.errors``.
"""

from ._constants import (
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    ROLLOUT_RECOVERY_STATE_FILENAME,
    SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS,
    RolloutRecoveryState,
)
from ._cut import MutationCut
from ._enums import (
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)
from ._ledger import RolloutRecoveryLedger
from ._records import (
    PromptGroupRecoveryRecord,
    PromptPayload,
    PromptRef,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
    SiblingSealResult,
)
from ._sidecar import (
    ParsedRolloutRecoveryState,
    build_controller_state,
    build_rollout_recovery_state,
    check_sampler_stamps_flag,
    parse_rollout_recovery_state,
)
from ._storage import (
    AttemptState,
    GroupState,
    PromptRefState,
    RewardChecksState,
    RewardLogContextState,
    SiblingState,
)

# The storage schema (``GroupState`` and what it holds) is exported for codecs that decode
# file bytes straight into it and hand the result to ``from_decoded_groups``.
__all__ = [
    "ROLLOUT_RECOVERY_SCHEMA_VERSION",
    "ROLLOUT_RECOVERY_STATE_FILENAME",
    "SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS",
    "AttemptState",
    "GroupState",
    "MutationCut",
    "ParsedRolloutRecoveryState",
    "PromptGroupPhase",
    "PromptGroupRecoveryRecord",
    "PromptGroupStatus",
    "PromptPayload",
    "PromptRef",
    "PromptRefState",
    "RecoveryGranularity",
    "RewardChecksState",
    "RewardLogContextState",
    "RolloutAttemptRecord",
    "RolloutAttemptStatus",
    "RolloutRecoveryLedger",
    "RolloutRecoveryState",
    "RolloutSiblingRecord",
    "SiblingSealResult",
    "SiblingState",
    "build_controller_state",
    "build_rollout_recovery_state",
    "check_sampler_stamps_flag",
    "parse_rollout_recovery_state",
]
