"""rollout-recovery: crash-safe ownership of GRPO prompt groups for asynchronous RL.

The package root re-exports the public surface; implementation lives in private modules of
the subpackages (``ledger``, ``rewards``, ``dataplane``, ...). ``tests/test_public_api.py``
pins this surface.

The names load on first use (PEP 562): importing the package imports none of its rooms, so
a command line that needs only a little of it (a rerun handed to its warm standby,
``cli/_standby_link.py``) does not pay for numpy and the ledger.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

    CHECKPOINT_MUTATION_KINDS = DataPlaneCheckpointBarrier.MUTATION_KINDS
    DataPlaneCheckpointBarrierTelemetry = DataPlaneCheckpointBarrier.Telemetry
    SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS = RolloutRecoveryLedger.SUPPORTED_SCHEMA_VERSIONS
    RolloutRecoveryState = RolloutRecoveryLedger.State

# Seed names the facades keep on the class they belong to (the subpackages' surface is
# capped at 100 names: tests/test_subpackage_api.py): name: (class, attribute).
_DERIVED = {
    "CHECKPOINT_MUTATION_KINDS": ("DataPlaneCheckpointBarrier", "MUTATION_KINDS"),
    "DataPlaneCheckpointBarrierTelemetry": ("DataPlaneCheckpointBarrier", "Telemetry"),
    "SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS": (
        "RolloutRecoveryLedger",
        "SUPPORTED_SCHEMA_VERSIONS",
    ),
    "RolloutRecoveryState": ("RolloutRecoveryLedger", "State"),
}
# Where each re-exported name lives.
_HOMES = {
    "DataPlaneCheckpointBarrier": "dataplane",
    "DataPlaneMutationCut": "dataplane",
    "BarrierNestingError": "errors",
    "CheckpointUnsafeError": "errors",
    "DeadCutError": "errors",
    "InvalidStateError": "errors",
    "InvalidStateTypeError": "errors",
    "InvalidTransitionError": "errors",
    "RolloutRecoveryError": "errors",
    "UnknownGroupError": "errors",
    "ROLLOUT_RECOVERY_SCHEMA_VERSION": "ledger",
    "ROLLOUT_RECOVERY_STATE_FILENAME": "ledger",
    "ParsedRolloutRecoveryState": "ledger",
    "PromptGroupPhase": "ledger",
    "PromptGroupRecoveryRecord": "ledger",
    "PromptGroupStatus": "ledger",
    "PromptRef": "ledger",
    "RecoveryGranularity": "ledger",
    "RolloutAttemptRecord": "ledger",
    "RolloutAttemptStatus": "ledger",
    "RolloutRecoveryLedger": "ledger",
    "RolloutSiblingRecord": "ledger",
    "SiblingSealResult": "ledger",
    "build_rollout_recovery_state": "ledger",
    "parse_rollout_recovery_state": "ledger",
    "CaptureRewardSettings": "rewards",
    "FinalizedReward": "rewards",
    "RewardChecks": "rewards",
    "RewardLogContext": "rewards",
    "parse_reward_log_context": "rewards",
}

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


def __getattr__(name: str) -> Any:
    """A re-exported name, imported from its room on first use (then cached here)."""
    if name in _DERIVED:
        owner, attribute = _DERIVED[name]
        value = getattr(__getattr__(owner), attribute)
    elif name in _HOMES:
        value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
