"""Pins every subpackage's public surface: what a user of each layer imports.

A name added to or dropped from a facade must be added or dropped here too, on purpose.
"""

from __future__ import annotations

import importlib

import pytest

SURFACES: dict[str, set[str]] = {
    "ledger": {
        "MutationCut",
        "ParsedRolloutRecoveryState",
        "PromptGroupPhase",
        "PromptGroupRecoveryRecord",
        "PromptGroupStatus",
        "PromptPayload",
        "PromptRef",
        "ROLLOUT_RECOVERY_SCHEMA_VERSION",
        "ROLLOUT_RECOVERY_STATE_FILENAME",
        "RecoveryGranularity",
        "RolloutAttemptRecord",
        "RolloutAttemptStatus",
        "RolloutRecoveryLedger",
        "RolloutRecoveryState",
        "RolloutSiblingRecord",
        "SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS",
        "SiblingSealResult",
        "build_rollout_recovery_state",
        "parse_rollout_recovery_state",
    },
    "checkpoint": {
        "LoadedSidecar",
        "SIDECAR_FILENAMES",
        "SidecarFormat",
        "SidecarFormatError",
        "SidecarProblem",
        "decode_sidecar",
        "encode_native_checkpoint",
        "encode_sidecar",
        "find_sidecar_problems",
        "load_sidecar",
        "read_sidecar_bytes",
        "sidecar_filename",
        "write_sidecar",
    },
    "dataplane": {
        "CANONICAL_PARTITION",
        "CHECKPOINT_MUTATION_KINDS",
        "DataPlane",
        "DataPlaneCheckpointBarrier",
        "DataPlaneCheckpointBarrierTelemetry",
        "DataPlaneMutationCut",
        "MemoryDataPlane",
        "ReplayIndex",
        "Row",
        "SqliteDataPlane",
        "check_keys_argument",
        "check_partition",
        "reconcile_staging",
    },
    "capture": {
        "CallRecord",
        "CaptureFailure",
        "CaptureWriter",
        "LinearizedRollout",
        "REJECTION_CODES",
        "Receipt",
        "Rejection",
        "STAGING_PARTITION",
        "assemble_receipt",
        "fetch_and_verify",
        "staging_key",
        "verify_and_linearize",
    },
    "finalize": {
        "ADVANTAGE_EPSILON",
        "FinalizedGroup",
        "SiblingOutcome",
        "finalize_group",
        "grpo_advantages",
        "publish_finalized_group",
    },
    "rewards": {
        "CaptureRewardOutcome",
        "CaptureRewardSettings",
        "FinalizedReward",
        "LinkSpan",
        "RewardChecks",
        "RewardLogContext",
        "aggregate_capture_reward_metrics",
        "compute_reward_checks",
        "finalize_capture_reward",
        "group_reward_metrics",
        "parse_reward_log_context",
    },
    "policy": {
        "ANSWER",
        "BOS",
        "DEFAULT_CLIP_EPSILON",
        "DEFAULT_LEARNING_RATE",
        "DIGIT_BASE",
        "EOS",
        "FILLER_BASE",
        "KIND_ANSWER",
        "KIND_FIXED",
        "KIND_PROMPT",
        "KIND_THOUGHT",
        "NUM_DIGITS",
        "NUM_FILLER",
        "NUM_THOUGHT",
        "NumpyGRPOTrainer",
        "PARAM_SHAPES",
        "PolicySnapshot",
        "THINK",
        "THOUGHT_BASE",
        "TaskSet",
        "TrainSample",
        "Trainer",
        "VOCAB_SIZE",
        "correct_answer",
        "digit_token",
        "initial_params",
        "log_softmax",
        "prompt_digit",
        "render",
        "row_token_contexts",
    },
    "rollout": {
        "AttemptRequest",
        "AttemptResult",
        "CAPTURE_FAILURE_REASON",
        "FaultSettings",
        "GenerationBackend",
        "SimulatedAgentBackend",
    },
    "control": {
        "AuditReport",
        "AuditTrail",
        "CRASH_POINTS",
        "CheckpointStore",
        "CheckpointTiming",
        "Controller",
        "JobComponents",
        "JobResult",
        "LoadedCheckpoint",
        "PromptDataset",
        "RestoreReport",
        "RunConfig",
        "RunProgress",
        "RunReporter",
        "RunSummary",
        "SkippedCheckpoint",
        "audit_run",
        "config_to_toml",
        "crash_point",
        "default_components",
        "load_config",
        "render_summary",
        "run_job",
    },
    "cli": {
        "cli",
        "main",
    },
}


@pytest.mark.parametrize("package", sorted(SURFACES))
def test_subpackage_surface_is_pinned(package: str) -> None:
    module = importlib.import_module(f"rollout_recovery.{package}")
    assert set(module.__all__) == SURFACES[package]
    assert len(module.__all__) == len(set(module.__all__))
    for name in module.__all__:
        assert hasattr(module, name), f"rollout_recovery.{package}.{name} is missing"


def test_codecs_and_storage_stay_private() -> None:
    for package, names in SURFACES.items():
        for name in names:
            assert not name.endswith("State") or package == "ledger", (package, name)
    assert "GroupState" not in SURFACES["ledger"]
    assert len(SURFACES["checkpoint"]) <= 13
