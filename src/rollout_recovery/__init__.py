"""rollout-recovery: crash-safe ownership of GRPO prompt groups for asynchronous RL.

The package root re-exports the public surface; implementation lives in private modules of
the subpackages (``ledger``, ``rewards``, ``dataplane``, ...). ``tests/test_public_api.py``
pins this surface.
"""

from .dataplane import DataPlaneCheckpointBarrier, DataPlaneMutationCut
from .errors import (
    BarrierNestingError,
    CheckpointUnsafeError,
    DeadCutError,
    InvalidStateError,
    InvalidStateTypeError,
    InvalidTransitionError,
    RolloutRecoveryError,
    UnknownGroupError,
)
from .ledger import (
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    ROLLOUT_RECOVERY_STATE_FILENAME,
    ParsedRolloutRecoveryState,
    PromptGroupPhase,
    PromptGroupRecoveryRecord,
    PromptGroupStatus,
    PromptRef,
    RecoveryGranularity,
    RolloutAttemptRecord,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    RolloutSiblingRecord,
    SiblingSealResult,
    build_rollout_recovery_state,
    parse_rollout_recovery_state,
)
from .rewards import (
    CaptureRewardSettings,
    FinalizedReward,
    RewardChecks,
    RewardLogContext,
    parse_reward_log_context,
)

# Seed names the facades keep on the class they belong to (the subpackages' surface is
# capped at 100 names: tests/test_subpackage_api.py).
CHECKPOINT_MUTATION_KINDS = DataPlaneCheckpointBarrier.MUTATION_KINDS
DataPlaneCheckpointBarrierTelemetry = DataPlaneCheckpointBarrier.Telemetry
SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS = RolloutRecoveryLedger.SUPPORTED_SCHEMA_VERSIONS
RolloutRecoveryState = RolloutRecoveryLedger.State

__version__ = "0.1.0"

__all__ = [
    "CHECKPOINT_MUTATION_KINDS",
    "ROLLOUT_RECOVERY_SCHEMA_VERSION",
    "ROLLOUT_RECOVERY_STATE_FILENAME",
    "SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS",
    "BarrierNestingError",
    "CaptureRewardSettings",
    "CheckpointUnsafeError",
    "DataPlaneCheckpointBarrier",
    "DataPlaneCheckpointBarrierTelemetry",
    "DataPlaneMutationCut",
    "DeadCutError",
    "FinalizedReward",
    "InvalidStateError",
    "InvalidStateTypeError",
    "InvalidTransitionError",
    "ParsedRolloutRecoveryState",
    "PromptGroupPhase",
    "PromptGroupRecoveryRecord",
    "PromptGroupStatus",
    "PromptRef",
    "RecoveryGranularity",
    "RewardChecks",
    "RewardLogContext",
    "RolloutAttemptRecord",
    "RolloutAttemptStatus",
    "RolloutRecoveryError",
    "RolloutRecoveryLedger",
    "RolloutRecoveryState",
    "RolloutSiblingRecord",
    "SiblingSealResult",
    "UnknownGroupError",
    "__version__",
    "build_rollout_recovery_state",
    "parse_reward_log_context",
    "parse_rollout_recovery_state",
]
