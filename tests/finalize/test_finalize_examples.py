"""finalize_group examples: valid rows, every placeholder reason, mask_sample, metrics."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest
from finalize_support import (
    CUT,
    SealOptions,
    build_group,
    default_plan,
    reserve_dispatched,
    row_arrays,
    stage_chain,
)

from rollout_recovery.capture import CaptureWriter, LinearizedRollout
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.dataplane import DataPlane, MemoryDataPlane, SqliteDataPlane
from rollout_recovery.errors import DataPlaneClosedError, InvalidTransitionError
from rollout_recovery.finalize import CanonicalRowMeta
from rollout_recovery.finalize._group import finalize_group
from rollout_recovery.finalize._metrics import (
    INVALID_ROW_RATE,
    REWARD_PROCESSING,
    failure_reason_metric,
)
from rollout_recovery.finalize._result import FinalizedGroup
from rollout_recovery.history.records import TrainedRow
from rollout_recovery.ledger import PromptGroupStatus, RolloutRecoveryLedger
from rollout_recovery.rewards import (
    CaptureRewardSettings,
    FinalizedReward,
    RewardChecks,
    RewardLogContext,
)
from rollout_recovery.rewards._metrics import aggregate_capture_reward_metrics

PLAIN = CaptureRewardSettings()


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DataPlane]:
    plane: DataPlane = (
        MemoryDataPlane() if request.param == "memory" else SqliteDataPlane(tmp_path / "dp.db")
    )
    yield plane
    plane.close()


@pytest.fixture
def ledger() -> RolloutRecoveryLedger:
    return RolloutRecoveryLedger()


def run(
    ledger: RolloutRecoveryLedger,
    store: DataPlane,
    settings: CaptureRewardSettings = PLAIN,
    group_id: str = "grp",
) -> FinalizedGroup:
    return finalize_group(group=ledger.get_group(group_id), data_plane=store, settings=settings)


def test_all_valid_group_yields_n_rows_in_generation_order(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    staged = build_group(ledger, store, ["sealed"] * 3)
    result = run(ledger, store)

    assert result.row_keys == ("grp_g0", "grp_g1", "grp_g2")
    assert result.total_row_count == result.valid_row_count == 3
    for index, (sibling, outcome, row) in enumerate(
        zip(staged, result.metas, result.rows, strict=True)
    ):
        assert outcome.valid and outcome.reason is None and not outcome.mask_sample
        assert outcome.rollout_id == sibling.rollout_id
        assert outcome.reward == float(index)
        assert row_arrays(row) == (
            sibling.expected_tokens,
            sibling.expected_mask,
            sibling.expected_logprobs,
        )
        assert row.metadata == {
            "sample_id": f"grp_g{index}",
            "group_id": "grp",
            "generation_index": index,
            "prompt_id": "7",
            "target_step": 3,
            "rollout_id": sibling.rollout_id,
            "valid": True,
            "mask_sample": False,
            "sample_mask": 1.0,
            "reward": float(index),
            "prompt_len": 3,
            "min_weight_version": 3,
            "max_weight_version": 4,
            "weight_version": 3,
            "reason": None,
            # Each call's generated tokens, by the version that generated them.
            "weight_version_spans": [[3, 3, 6], [4, 9, 12]],
        }
    assert (result.min_weight_version, result.max_weight_version) == (3, 4)
    assert result.staging_keys == tuple(
        r.staging_key for sibling in staged for r in sibling.records
    )
    assert result.reward_observations == tuple(
        FinalizedReward(sample_id=f"grp_g{i}", rollout_id=s.rollout_id, reward=float(i))
        for i, s in enumerate(staged)
    )
    assert result.metrics["finalize/reward_count"] == 3.0
    assert result.metrics["finalize/reward_sum"] == 3.0
    assert result.metrics["finalize/reward_sumsq"] == 5.0
    assert result.metrics["finalize/reward_min"] == 0.0
    assert result.metrics["finalize/reward_max"] == 2.0
    assert result.metrics[INVALID_ROW_RATE] == 0.0
    assert result.metrics["finalize/calls_per_rollout"] == 2.0
    assert result.metrics["finalize/token_in_calls"] == 3.0
    assert result.metrics["finalize/text_root_calls"] == 3.0
    assert result.metrics["finalize/token_in_rate"] == 0.5


def test_finalize_reads_only(ledger: RolloutRecoveryLedger, store: DataPlane) -> None:
    build_group(ledger, store, ["sealed", "failed"])
    before = {p: store.keys(p) for p in (CaptureWriter.staging_partition, "canonical")}
    run(ledger, store)
    assert {p: store.keys(p) for p in (CaptureWriter.staging_partition, "canonical")} == before
    assert ledger.get_group("grp").status is PromptGroupStatus.READY_TO_FINALIZE


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("failed", "missing_receipt"),
        ("poisoned", "capture_poisoned:worker_lost_ack"),
        ("missing_row", "missing_staging_row:"),
        ("flipped_token", "digest_mismatch:"),
        ("reordered", "rebuild_failed:manifest_order: "),
        ("broken_parent", "rebuild_failed:missing_parent: "),
    ],
)
def test_each_capture_failure_becomes_a_placeholder_with_its_reason(
    ledger: RolloutRecoveryLedger, store: DataPlane, kind: str, reason: str
) -> None:
    build_group(ledger, store, ["sealed", kind, "sealed"])  # type: ignore[list-item]
    result = run(ledger, store)

    assert len(result.rows) == 3
    bad = result.metas[1]
    assert not bad.valid and bad.reason is not None and bad.reason.startswith(reason)
    assert bad.reward == 0.0 and bad.prompt_len == 0
    assert bad.min_weight_version is None and bad.max_weight_version is None
    row = result.rows[1]
    assert row.token_ids.size == row.token_mask.size == row.logprobs.size == 0
    assert row.metadata["valid"] is False and row.metadata["sample_mask"] == 0.0
    assert row.metadata["reason"] == bad.reason
    # The neighbours are untouched by their sibling's failure (batched fetch falls back).
    assert [o.valid for o in result.metas] == [True, False, True]
    code = reason.split(":")[0]
    assert result.metrics[failure_reason_metric(code)] == 1.0
    assert result.metrics[INVALID_ROW_RATE] == pytest.approx(1 / 3)
    assert result.metrics["finalize/reward_count"] == 2.0
    assert [o.sample_id for o in result.reward_observations] == ["grp_g0", "grp_g2"]
    assert result.metrics["finalize/capture_poisoned_rollouts"] == float(kind == "poisoned")


def test_invalid_receipt_schema_is_a_placeholder(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    record = reserve_dispatched(ledger, n=1)
    sibling = stage_chain(store, record.gate_rollout_id(0), default_plan(0))
    assert sibling.receipt is not None
    del sibling.receipt["manifest"][0]["digest"]  # the ledger only reads staging keys
    ledger.mark_sibling_sealed(
        CUT, "grp", generation_index=0, gate_rollout_id=sibling.rollout_id,
        receipt=sibling.receipt, reward=1.0, mask_sample=False,
    )  # fmt: skip
    (outcome,) = run(ledger, store).metas
    assert outcome.reason is not None and outcome.reason.startswith("invalid_receipt:")


def test_missing_reward_checks_is_a_reward_processing_placeholder(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    settings = CaptureRewardSettings.from_configs(penalties={"penalize_empty_final_answer": True})
    checks = RewardChecks(duplicated_reasoning=False, empty_final_answer=False, low_effort=False)
    build_group(
        ledger,
        store,
        ["sealed", "sealed"],
        options=[SealOptions(reward=1.0, checks=checks), SealOptions(reward=1.0, checks=None)],
    )
    result = run(ledger, store, settings)
    assert result.metas[0].valid
    assert result.metas[1].reason == "reward_processing:missing_reward_checks"
    assert result.metrics[failure_reason_metric(REWARD_PROCESSING)] == 1.0
    assert result.metrics["finalize/penalty_count/empty_final_answer"] == 0.0


def test_non_finite_raw_reward_is_a_reward_processing_placeholder(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    build_group(
        ledger,
        store,
        ["sealed", "sealed"],
        options=[SealOptions(reward=math.inf), SealOptions(reward=math.nan)],
    )
    reasons = [o.reason for o in run(ledger, store).metas]
    assert reasons[0] == "reward_processing:non_finite_reward"
    assert reasons[1] is not None and reasons[1].startswith("reward_processing:raw reward")


def test_penalties_zero_the_reward_and_are_counted(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    # Sibling 1's generated tokens start at 205 (default_plan), sibling 0's never reach it.
    settings = CaptureRewardSettings.from_configs(
        penalties={"penalize_unwanted_tokens": True, "token_ids": {"unwanted": [205]}}
    )
    build_group(ledger, store, ["sealed", "sealed"], options=[SealOptions(2.0), SealOptions(2.0)])
    result = run(ledger, store, settings)
    assert [o.reward for o in result.metas] == [2.0, 0.0]
    assert all(o.valid for o in result.metas)
    assert result.metrics["finalize/penalty_count/unwanted_token"] == 1.0
    pooled = aggregate_capture_reward_metrics(
        {k: [v] for k, v in result.metrics.items()}, list(result.reward_observations)
    )
    assert pooled["unwanted_token_rate"] == 0.5
    assert pooled["total_reward/mean"] == 1.0


def test_effort_shaping_runs_before_penalties(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    settings = CaptureRewardSettings.from_configs(
        effort={"low_weight": 0.5, "low_ub": 6, "low_string": "be brief"}
    )
    low = RewardChecks(duplicated_reasoning=False, empty_final_answer=False, low_effort=True)
    build_group(ledger, store, ["sealed"], options=[SealOptions(reward=1.0, checks=low)])
    result = run(ledger, store, settings)
    # Terminal call generated 3 tokens: length_reward = 0.5 * (1 - 3/6) = 0.25.
    assert result.metas[0].reward == pytest.approx(1.25)
    assert result.metrics["finalize/effort/low/3"] == 1.0
    assert result.metrics["finalize/effort/length_reward_sum"] == pytest.approx(0.25)


def test_mask_sample_keeps_the_row_valid_but_out_of_training(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    context = RewardLogContext(agent_name="swe", full_result_json='{"ok": true}')
    build_group(
        ledger,
        store,
        ["sealed", "sealed", "failed"],
        options=[
            SealOptions(1.0),
            SealOptions(3.0, mask_sample=True, log_context=context),
            SealOptions(5.0, mask_sample=True),
        ],
    )
    result = run(ledger, store)
    flagged = result.metas[1]
    assert flagged.valid and flagged.mask_sample and not flagged.trainable
    assert flagged.reward == 3.0 and result.rows[1].token_ids.size > 0
    assert result.rows[1].metadata["mask_sample"] is True
    assert result.metas[2].mask_sample and not result.metas[2].valid
    assert result.valid_mask().tolist() == [True, True, False]
    assert result.train_mask().tolist() == [True, False, False]
    assert result.metrics["finalize/mask_sample_count"] == 1.0
    assert result.reward_observations[1].log_context == context


def test_all_placeholder_group_falls_back_to_the_start_weight_version(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    build_group(ledger, store, ["failed", "missing_row"], start_weight_version=9)
    result = run(ledger, store)
    assert result.valid_row_count == 0 and len(result.rows) == 2
    assert (result.min_weight_version, result.max_weight_version) == (9, 9)
    assert all(row.metadata["weight_version"] == 9 for row in result.rows)
    assert result.metrics["finalize/reward_count"] == 0.0
    assert "finalize/reward_sum" not in result.metrics
    assert "finalize/calls_per_rollout" not in result.metrics
    assert result.metrics[INVALID_ROW_RATE] == 1.0
    assert result.reward_observations == ()


def test_group_weight_versions_span_valid_rows_dead_branch_calls_included(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    plans = [default_plan(0), default_plan(1, calls=4)]
    for call, version in zip(plans[1], (1, 8, 2, 5), strict=True):
        call.weight_version = version
    build_group(ledger, store, ["sealed", "sealed", "failed"], plans=[*plans, default_plan(2)])
    result = run(ledger, store)
    assert (result.min_weight_version, result.max_weight_version) == (1, 8)
    assert result.rows[0].metadata["weight_version"] == 1


def test_valid_rows_equal_a_direct_linearization(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    build_group(ledger, store, ["sealed", "flipped_token", "sealed"])
    result = run(ledger, store)
    record = ledger.get_group("grp")
    for index in (0, 2):
        attempt = record.siblings[index].current_attempt
        direct = fetch_and_verify(
            attempt.receipt, store, expected_rollout_id=record.gate_rollout_id(index)
        )
        assert isinstance(direct, LinearizedRollout)
        row = result.rows[index]
        assert np.array_equal(row.token_ids, direct.token_ids)
        assert np.array_equal(row.logprobs, direct.logprobs)


def test_refuses_a_group_that_is_still_generating(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    reserve_dispatched(ledger, n=2)
    with pytest.raises(InvalidTransitionError, match="cannot finalize group 'grp' from"):
        run(ledger, store)


def test_refuses_a_record_with_an_unsealed_sibling(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    build_group(ledger, store, ["sealed", "sealed"])
    record = ledger.get_group("grp")
    record.siblings[1].attempts.append(
        type(record.siblings[1].current_attempt)(
            attempt_uuid=record.siblings[1].current_attempt.attempt_uuid,
            status=record.siblings[0].current_attempt.status.__class__("dispatched"),
        )
    )
    with pytest.raises(InvalidTransitionError, match="sibling 'grp_g1' current attempt"):
        finalize_group(group=record, data_plane=store, settings=PLAIN)


def test_data_plane_faults_propagate(ledger: RolloutRecoveryLedger, store: DataPlane) -> None:
    build_group(ledger, store, ["sealed"])
    store.close()
    with pytest.raises(DataPlaneClosedError):
        run(ledger, store)


# The stored metadata keys of a canonical row and the journal's keys of a trained row:
# one row-metadata shape must not move either wire format (data-plane rows a restore
# reads, ``step_trained`` lines an old journal holds).
STORED_ROW_KEYS = {
    "sample_id", "group_id", "generation_index", "prompt_id", "target_step", "rollout_id",
    "valid", "mask_sample", "sample_mask", "reward", "prompt_len", "min_weight_version",
    "max_weight_version", "weight_version", "reason", "weight_version_spans",
}  # fmt: skip
JOURNAL_ROW_KEYS = {
    "group_id", "generation_index", "prompt_idx", "rollout_id", "valid", "reward",
    "weight_version", "weight_version_spans",
}  # fmt: skip


def test_the_journal_row_is_built_from_the_stored_rows_shared_facts(
    ledger: RolloutRecoveryLedger, store: DataPlane
) -> None:
    build_group(ledger, store, ["sealed", "failed"])
    result = run(ledger, store)
    for meta, row in zip(result.metas, result.rows, strict=True):
        assert set(row.metadata) == STORED_ROW_KEYS
        assert CanonicalRowMeta.of(row) == meta
        trained = TrainedRow(**meta.facts(), prompt_idx=7)
        assert set(msgspec.to_builtins(trained)) == JOURNAL_ROW_KEYS
        shared = JOURNAL_ROW_KEYS - {"prompt_idx"}
        assert {key: getattr(trained, key) for key in shared} == {
            key: getattr(meta, key) for key in shared
        }
    assert [meta.valid for meta in result.metas] == [True, False]
