"""Pins the ledger's public surface at the package root (the seed contract's names)."""

from __future__ import annotations

import dataclasses
import enum
import importlib

import pytest

import rollout_recovery

LEDGER_NAMES = [
    "RolloutRecoveryLedger",
    "PromptRef",
    "PromptGroupPhase",
    "RecoveryGranularity",
    "RolloutAttemptStatus",
    "PromptGroupStatus",
    "RolloutAttemptRecord",
    "RolloutSiblingRecord",
    "PromptGroupRecoveryRecord",
    "SiblingSealResult",
    "ParsedRolloutRecoveryState",
    "build_rollout_recovery_state",
    "parse_rollout_recovery_state",
    "ROLLOUT_RECOVERY_SCHEMA_VERSION",
    "SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS",
    "ROLLOUT_RECOVERY_STATE_FILENAME",
    "RewardChecks",
    "RewardLogContext",
    "CaptureRewardSettings",
    "FinalizedReward",
]


@pytest.mark.parametrize("name", LEDGER_NAMES)
def test_name_is_importable_from_the_package_root(name: str) -> None:
    module = importlib.import_module("rollout_recovery")
    assert hasattr(module, name), f"rollout_recovery.{name} is missing"
    assert name in rollout_recovery.__all__


def test_schema_constants() -> None:
    from rollout_recovery import (
        ROLLOUT_RECOVERY_SCHEMA_VERSION,
        ROLLOUT_RECOVERY_STATE_FILENAME,
        SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS,
    )

    assert ROLLOUT_RECOVERY_SCHEMA_VERSION == 3
    assert type(ROLLOUT_RECOVERY_SCHEMA_VERSION) is int
    supported = SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS
    assert isinstance(supported, set | frozenset)
    assert supported == {3}  # a frozenset({3}) compares equal too
    assert ROLLOUT_RECOVERY_STATE_FILENAME == "rollout_recovery.pt"


@pytest.mark.parametrize(
    ("name", "members"),
    [
        ("PromptGroupPhase", {"RESERVED": "reserved", "ADMITTED": "admitted"}),
        ("RecoveryGranularity", {"SIBLING": "sibling", "PROMPT_GROUP": "prompt_group"}),
        (
            "RolloutAttemptStatus",
            {
                "RESERVED": "reserved",
                "DISPATCHED": "dispatched",
                "SEALED": "sealed",
                "FAILED": "failed",
                "ABANDONED": "abandoned",
            },
        ),
        (
            "PromptGroupStatus",
            {
                "GENERATING": "generating",
                "READY_TO_FINALIZE": "ready_to_finalize",
                "FINALIZING": "finalizing",
                "FINALIZATION_UNKNOWN": "finalization_unknown",
            },
        ),
    ],
)
def test_enums_are_str_enums_with_the_seed_values(name: str, members: dict[str, str]) -> None:
    cls = getattr(rollout_recovery, name)
    assert issubclass(cls, enum.StrEnum)
    assert {member.name: member.value for member in cls} == members
    for value in members.values():
        assert cls(value) == value  # compares equal to its plain string


@pytest.mark.parametrize(
    ("name", "fields", "frozen"),
    [
        ("PromptRef", ["sample_id", "task_name"], True),
        (
            "RolloutAttemptRecord",
            [
                "attempt_uuid",
                "status",
                "receipt",
                "reward",
                "mask_sample",
                "reward_checks",
                "reward_log_context",
                "staging_keys",
            ],
            False,
        ),
        ("RolloutSiblingRecord", ["generation_index", "attempts"], False),
        (
            "PromptGroupRecoveryRecord",
            [
                "group_id",
                "admission_id",
                "prompt_id",
                "prompt_ref",
                "task_source",
                "recovery_granularity",
                "runtime_prompt_payload",
                "expected_generations",
                "target_step",
                "start_weight_version",
                "siblings",
                "phase",
                "status",
            ],
            False,
        ),
        (
            "SiblingSealResult",
            [
                "gate_rollout_id",
                "receipt",
                "reward",
                "mask_sample",
                "reward_checks",
                "reward_log_context",
            ],
            True,
        ),
        (
            "ParsedRolloutRecoveryState",
            [
                "ledger_state",
                "batch_shortfall",
                "sampler_stamps_target_steps",
                "finalizer_metrics_by_group",
                "finalizer_rewards_by_group",
                "reward_settings",
            ],
            True,
        ),
    ],
)
def test_records_are_dataclasses_with_the_seed_fields(
    name: str, fields: list[str], frozen: bool
) -> None:
    cls = getattr(rollout_recovery, name)
    assert dataclasses.is_dataclass(cls)
    assert [f.name for f in dataclasses.fields(cls)] == fields
    params = getattr(cls, "__dataclass_params__", None)
    assert params is not None and params.frozen is frozen


def test_ledger_methods_exist() -> None:
    ledger_cls = rollout_recovery.RolloutRecoveryLedger
    for method in (
        "groups",
        "reserve_group",
        "mark_group_admitted",
        "bind_runtime_prompt",
        "prepare_for_restart",
        "assert_checkpoint_safe",
        "expected_staging_keys",
        "prepare_incomplete_retry",
        "mark_group_dispatched",
        "mark_sibling_sealed",
        "mark_group_sealed",
        "abandon_unsealed",
        "mark_finalization_started",
        "mark_finalization_unknown",
        "discard_group",
        "discard_canonical_groups",
        "get_group",
        "state_dict",
        "from_state_dict",
        "load_state_dict",
        "__len__",
        "__contains__",
    ):
        assert callable(getattr(ledger_cls, method)), method
