"""The seed's schema-3 rollout-recovery ledger: records, transitions, state and sidecar.

Pure: no I/O and no asyncio. It imports only ``rollout_recovery.rewards`` (the reward
records persisted with sealed attempts) and ``rollout_recovery.errors``.
"""

from ._constants import (
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    ROLLOUT_RECOVERY_STATE_FILENAME,
)
from ._enums import (
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)
from ._ledger import RolloutRecoveryLedger
from ._records import (
    PromptGroupRecoveryRecord,
    PromptRef,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
    SiblingSealResult,
)
from ._sidecar import (
    ParsedRolloutRecoveryState,
    build_rollout_recovery_state,
    parse_rollout_recovery_state,
)

# The storage schema (``GroupState`` and what it holds) is private; the checkpoint codecs
# that decode file bytes straight into it reach it through ``ledger.codec_support``.
__all__ = [
    "ROLLOUT_RECOVERY_SCHEMA_VERSION",
    "ROLLOUT_RECOVERY_STATE_FILENAME",
    "ParsedRolloutRecoveryState",
    "PromptGroupPhase",
    "PromptGroupRecoveryRecord",
    "PromptGroupStatus",
    "PromptRef",
    "RecoveryGranularity",
    "RolloutAttemptRecord",
    "RolloutAttemptStatus",
    "RolloutRecoveryLedger",
    "RolloutSiblingRecord",
    "SiblingSealResult",
    "build_rollout_recovery_state",
    "parse_rollout_recovery_state",
]
