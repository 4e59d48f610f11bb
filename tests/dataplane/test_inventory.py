"""The restore inventory pass: after it, staging holds exactly what the ledger expects."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rollout_recovery import (
    RecoveryGranularity,
    RolloutRecoveryLedger,
    SiblingSealResult,
    build_rollout_recovery_state,
    parse_rollout_recovery_state,
)
from rollout_recovery.control._inventory import reconcile_staging
from rollout_recovery.dataplane import Row, SqliteDataPlane
from rollout_recovery.errors import DeadCutError, StagingInventoryError

STAGING = "rollout_staging"


class _Cut:
    def __init__(self, live: bool = True) -> None:
        self.live = live

    def require_live(self) -> None:
        if not self.live:
            raise DeadCutError("data-plane mutation cut is no longer active")


CUT = _Cut()


def _row() -> Row:
    return Row(
        token_ids=np.arange(4, dtype=np.int32),
        token_mask=np.ones(4, np.float32),
        logprobs=np.zeros(4, np.float32),
    )


def _receipt(gate: str) -> dict[str, object]:
    return {"rollout_id": gate, "manifest": [{"staging_key": f"{gate}/c0"}]}


def _crashed_run(store: SqliteDataPlane) -> dict[str, object]:
    """A run that staged rows for sealed, in-flight and atomic-group siblings, then died."""
    ledger = RolloutRecoveryLedger()
    for group_id, granularity in (
        ("a", RecoveryGranularity.SIBLING),
        ("b", RecoveryGranularity.PROMPT_GROUP),
    ):
        ledger.reserve_group(
            CUT,
            prompt_id="7" if group_id == "a" else "8",
            prompt_payload={"idx": 7 if group_id == "a" else 8},
            expected_generations=2,
            target_step=0,
            start_weight_version=0,
            recovery_granularity=granularity,
            group_id=group_id,
        )
        ledger.mark_group_dispatched(CUT, group_id)
    a = ledger.get_group("a")
    for gate in a.gate_rollout_ids:  # both siblings staged a call ...
        store.put(STAGING, {f"{gate}/c0": _row()})
    ledger.mark_sibling_sealed(  # ... but only g0 sealed before the crash
        CUT,
        "a",
        generation_index=0,
        gate_rollout_id=a.gate_rollout_ids[0],
        receipt=_receipt(a.gate_rollout_ids[0]),
        reward=1.0,
        mask_sample=False,
    )
    b = ledger.get_group("b")
    for gate in b.gate_rollout_ids:
        store.put(STAGING, {f"{gate}/c0": _row()})
    ledger.mark_group_sealed(
        CUT,
        "b",
        {
            i: SiblingSealResult(
                gate_rollout_id=gate, receipt=_receipt(gate), reward=1.0, mask_sample=False
            )
            for i, gate in enumerate(b.gate_rollout_ids)
        },
    )
    ledger.abandon_unsealed(CUT, "a")  # a worker died; and then the controller
    return build_rollout_recovery_state(
        ledger, batch_shortfall={}, sampler_stamps_target_steps=True
    )


def _restored(sidecar: dict[str, object]) -> RolloutRecoveryLedger:
    ledger = RolloutRecoveryLedger()
    ledger.load_state_dict(CUT, parse_rollout_recovery_state(sidecar).ledger_state)
    ledger.prepare_for_restart(CUT)
    return ledger


def test_restore_leaves_exactly_the_expected_staging_keys(tmp_path: Path) -> None:
    store = SqliteDataPlane(tmp_path / "rows.sqlite")
    ledger = _restored(_crashed_run(store))
    before = set(store.keys(STAGING))
    cleared = reconcile_staging(ledger, store, CUT, partition=STAGING, clear_unreferenced=True)
    # a's abandoned g1 row went; b's sealed cohort is kept (fully sealed groups survive).
    assert len(cleared) == 1 and cleared[0].startswith("a_g1_a")
    assert set(store.keys(STAGING)) == ledger.expected_staging_keys() == before - set(cleared)


def test_checkpoint_time_check_tolerates_unreferenced_rows(tmp_path: Path) -> None:
    store = SqliteDataPlane(tmp_path / "rows.sqlite")
    ledger = _restored(_crashed_run(store))
    before = store.keys(STAGING)
    unreferenced = reconcile_staging(
        ledger, store, CUT, partition=STAGING, clear_unreferenced=False
    )
    assert len(unreferenced) == 1 and store.keys(STAGING) == before


def test_a_missing_sealed_row_is_fatal_and_deletes_nothing(tmp_path: Path) -> None:
    store = SqliteDataPlane(tmp_path / "rows.sqlite")
    ledger = _restored(_crashed_run(store))
    lost = sorted(ledger.expected_staging_keys())[0]
    store.clear(STAGING, [lost])
    before = store.keys(STAGING)
    with pytest.raises(StagingInventoryError) as caught:
        reconcile_staging(ledger, store, CUT, partition=STAGING, clear_unreferenced=True)
    assert caught.value.missing == [lost]
    assert store.keys(STAGING) == before


def test_a_dead_cut_is_refused(tmp_path: Path) -> None:
    store = SqliteDataPlane(tmp_path / "rows.sqlite")
    ledger = _restored(_crashed_run(store))
    before = store.keys(STAGING)
    with pytest.raises(DeadCutError):
        reconcile_staging(
            ledger, store, _Cut(live=False), partition=STAGING, clear_unreferenced=True
        )
    assert store.keys(STAGING) == before


def test_the_canonical_partition_is_never_reconciled(tmp_path: Path) -> None:
    from rollout_recovery.dataplane._replay import CANONICAL_PARTITION
    from rollout_recovery.errors import InvalidTransitionError

    store = SqliteDataPlane(tmp_path / "rows.sqlite")
    store.put(CANONICAL_PARTITION, {"g_g0": _row()})
    with pytest.raises(InvalidTransitionError, match="canonical rows"):
        reconcile_staging(
            RolloutRecoveryLedger(),
            store,
            CUT,
            partition=CANONICAL_PARTITION,
            clear_unreferenced=True,
        )
    assert store.keys(CANONICAL_PARTITION) == ["g_g0"]


def test_clearing_is_refused_while_attempts_are_in_flight(tmp_path: Path) -> None:
    from rollout_recovery.errors import InvalidTransitionError

    store = SqliteDataPlane(tmp_path / "rows.sqlite")
    ledger = RolloutRecoveryLedger()
    ledger.reserve_group(
        CUT,
        prompt_id="7",
        prompt_payload={"idx": 7},
        expected_generations=1,
        target_step=0,
        start_weight_version=0,
        group_id="g",
    )
    ledger.mark_group_dispatched(CUT, "g")
    gate = ledger.get_group("g").gate_rollout_id(0)
    store.put(STAGING, {f"{gate}/c0": _row()})  # a call still being made
    with pytest.raises(InvalidTransitionError, match="1 attempts are dispatched"):
        reconcile_staging(ledger, store, CUT, partition=STAGING, clear_unreferenced=True)
    assert store.keys(STAGING) == [f"{gate}/c0"]
