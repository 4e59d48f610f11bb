"""publish_finalized_group: the ledger -> replay index hand-off inside one group_commits cut,
as the controller's ``group_published`` transition runs it: ``finalize_group`` reads, then
the hand-off puts the finalized rows (a replay runs it from the record, without rows)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from finalize_support import CUT, build_group, reserve_dispatched

from rollout_recovery._cut import MutationCut
from rollout_recovery.capture import CaptureWriter
from rollout_recovery.dataplane import (
    DataPlane,
    DataPlaneCheckpointBarrier,
    MemoryDataPlane,
    ReplayIndex,
    Row,
    SqliteDataPlane,
)
from rollout_recovery.dataplane._replay import CANONICAL_PARTITION
from rollout_recovery.errors import (
    CheckpointUnsafeError,
    DeadCutError,
    FinalizationUnknownError,
    InvalidTransitionError,
    UnknownGroupError,
)
from rollout_recovery.finalize import finalize_group, publish_finalized_group
from rollout_recovery.finalize._result import FinalizedGroup
from rollout_recovery.ledger import PromptGroupStatus, RolloutRecoveryLedger
from rollout_recovery.rewards import CaptureRewardSettings

PLAIN = CaptureRewardSettings()


class Boom(OSError):
    """An injected data-plane fault."""


class FaultyPlane:
    """Delegates to a real store and fails one chosen operation, before or after it ran."""

    def __init__(self, inner: DataPlane) -> None:
        self.inner = inner
        self.fail: tuple[str, str, str] | None = None  # (operation, partition, before|after)
        self.calls: list[tuple[str, str]] = []

    def _maybe_fail(self, operation: str, partition: str, when: str) -> None:
        if self.fail == (operation, partition, when):
            raise Boom(f"injected {operation} failure {when} on {partition}")

    def put(
        self, partition: str, rows: Mapping[str, Row], *, cut: MutationCut | None = None
    ) -> None:
        self.calls.append(("put", partition))
        self._maybe_fail("put", partition, "before")
        self.inner.put(partition, rows, cut=cut)
        self._maybe_fail("put", partition, "after")

    def get(self, partition: str, keys: Sequence[str]) -> list[Row]:
        self._maybe_fail("get", partition, "before")
        return self.inner.get(partition, keys)

    def clear(self, partition: str, keys: Iterable[str], *, cut: MutationCut | None = None) -> None:
        self.calls.append(("clear", partition))
        self._maybe_fail("clear", partition, "before")
        self.inner.clear(partition, keys, cut=cut)

    def keys(self, partition: str) -> list[str]:
        return self.inner.keys(partition)

    def snapshot(self, directory: Path, *, cut: MutationCut | None = None) -> None:
        self.inner.snapshot(directory, cut=cut)

    def restore(self, directory: Path, *, cut: MutationCut | None = None) -> None:
        self.inner.restore(directory, cut=cut)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(params=["memory", "sqlite"])
def plane(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FaultyPlane]:
    inner: DataPlane = (
        MemoryDataPlane() if request.param == "memory" else SqliteDataPlane(tmp_path / "dp.db")
    )
    yield FaultyPlane(inner)
    inner.close()


@pytest.fixture
def ledger() -> RolloutRecoveryLedger:
    return RolloutRecoveryLedger()


def publish(
    ledger: RolloutRecoveryLedger,
    plane: FaultyPlane,
    index: ReplayIndex,
    cut: Any = CUT,
    group_id: str = "grp",
) -> FinalizedGroup:
    """As the controller publishes: finalize (reads only), then hand over its rows."""
    finalized = finalize_group(group=ledger.get_group(group_id), data_plane=plane, settings=PLAIN)
    publish_finalized_group(
        ledger, cut, finalized, replay_index=index, data_plane=plane, rows=finalized.rows_by_key
    )
    return finalized


def snapshot(ledger: RolloutRecoveryLedger, plane: FaultyPlane, index: ReplayIndex) -> Any:
    return (
        [(g.group_id, g.status) for g in ledger.groups()],
        plane.keys(CaptureWriter.staging_partition),
        plane.keys(CANONICAL_PARTITION),
        index.group_ids(),
        index.reserved_group_ids(),
    )


def test_publish_inside_a_real_group_commits_section(
    ledger: RolloutRecoveryLedger, plane: FaultyPlane
) -> None:
    build_group(ledger, plane, ["sealed", "failed", "poisoned", "flipped_token"])
    # Rows of another group must survive the staging clear, and so must the rows the failed
    # sibling staged before its receipt was lost: no receipt names them, so the ledger never
    # owned them; the restore inventory pass reclaims such orphans.
    build_group(ledger, plane, ["sealed", "sealed", "sealed", "sealed"], group_id="other")
    owned = {k for s in ledger.get_group("grp").siblings for k in s.current_attempt.staging_keys}
    assert owned and not any(key.startswith("grp_g1_") for key in owned)
    survivors = set(plane.keys(CaptureWriter.staging_partition)) - owned
    index = ReplayIndex(data_plane=plane, group_size=4)
    barrier = DataPlaneCheckpointBarrier()
    plane.calls.clear()  # only the publication's own writes from here on

    async def main() -> FinalizedGroup:
        async with barrier.mutation("group_commits") as cut:
            return publish(ledger, plane, index, cut)

    result = asyncio.run(main())

    assert "grp" not in ledger and "other" in ledger
    assert plane.keys(CANONICAL_PARTITION) == ["grp_g0", "grp_g1", "grp_g2", "grp_g3"]
    assert set(plane.keys(CaptureWriter.staging_partition)) == survivors
    committed = index.group("grp")
    assert committed.row_keys == result.row_keys
    assert committed.target_step == 3
    assert (committed.min_weight_version, committed.max_weight_version) == (3, 4)
    assert dict(committed.metrics) == dict(result.metrics)
    stored = plane.get(CANONICAL_PARTITION, list(result.row_keys))
    assert [row.metadata["valid"] for row in stored] == [True, False, False, False]
    assert [row.metadata["reason"] is None for row in stored] == [True, False, False, False]
    ledger.assert_checkpoint_safe()
    # Ownership order of the writes: canonical rows first, staging clear after.
    assert plane.calls == [("put", CANONICAL_PARTITION), ("clear", CaptureWriter.staging_partition)]


def test_publish_uses_an_existing_replay_slot(
    ledger: RolloutRecoveryLedger, plane: FaultyPlane
) -> None:
    build_group(ledger, plane, ["sealed", "sealed"])
    index = ReplayIndex(data_plane=plane, group_size=2)
    index.reserve(CUT, "grp")
    publish(ledger, plane, index)
    assert index.group_ids() == ["grp"] and index.reserved_group_ids() == []


@pytest.mark.parametrize(
    ("setup", "error", "match"),
    [
        ("generating", InvalidTransitionError, "cannot finalize group 'grp' from 'generating'"),
        ("unknown_group", UnknownGroupError, "unknown recovery group_id='grp'"),
        ("no_target_step", InvalidTransitionError, r"'grp' for step None: .*never admitted"),
        ("wrong_size", InvalidTransitionError, "commits 2 row keys, expected exactly 3"),
        ("already_committed", InvalidTransitionError, "already committed"),
        ("dead_cut", DeadCutError, "no longer active"),
        ("read_fault", Boom, "injected get failure"),
    ],
)
def test_refusals_before_submission_change_nothing(
    ledger: RolloutRecoveryLedger, plane: FaultyPlane, setup: str, error: type, match: str
) -> None:
    size = 3 if setup == "wrong_size" else 2
    index = ReplayIndex(data_plane=plane, group_size=size)
    cut: Any = CUT
    if setup == "generating":
        reserve_dispatched(ledger, n=2)
    elif setup != "unknown_group":
        build_group(
            ledger,
            plane,
            ["sealed", "sealed"],
            target_step=None if setup == "no_target_step" else 3,
        )
    if setup == "already_committed":
        index.reserve(CUT, "grp")
        plane.put(CANONICAL_PARTITION, {"x0": Row(**_empty()), "x1": Row(**_empty())})
        index.commit(CUT, "grp", ["x0", "x1"], target_step=0, min_weight_version=0,
                     max_weight_version=0)  # fmt: skip
    if setup == "dead_cut":

        class Dead:
            def require_live(self) -> None:
                raise DeadCutError("data-plane mutation cut is no longer active")

        cut = Dead()
    if setup == "read_fault":
        plane.fail = ("get", CaptureWriter.staging_partition, "before")
    before = snapshot(ledger, plane, index)
    with pytest.raises(error, match=match):
        publish(ledger, plane, index, cut)
    assert snapshot(ledger, plane, index) == before
    if setup not in ("generating", "unknown_group"):
        assert ledger.get_group("grp").status is PromptGroupStatus.READY_TO_FINALIZE
        ledger.assert_checkpoint_safe()


def _empty() -> dict[str, Any]:
    import numpy as np

    return {
        "token_ids": np.zeros(0, np.int32),
        "token_mask": np.zeros(0, np.float32),
        "logprobs": np.zeros(0, np.float32),
    }


@pytest.mark.parametrize(
    "fail",
    [
        ("put", CANONICAL_PARTITION, "before"),  # a store that raised may still have written
        ("put", CANONICAL_PARTITION, "after"),
        ("clear", CaptureWriter.staging_partition, "before"),
    ],
)
def test_failure_after_submission_is_finalization_unknown_and_never_checkpointed(
    ledger: RolloutRecoveryLedger, plane: FaultyPlane, fail: tuple[str, str, str]
) -> None:
    build_group(ledger, plane, ["sealed", "failed"])
    index = ReplayIndex(data_plane=plane, group_size=2)
    plane.fail = fail

    with pytest.raises(FinalizationUnknownError) as raised:
        publish(ledger, plane, index)

    assert raised.value.fatal and raised.value.group_id == "grp"
    assert isinstance(raised.value.__cause__, Boom)
    assert any("FINALIZATION_UNKNOWN" in note for note in raised.value.__cause__.__notes__)
    assert ledger.get_group("grp").status is PromptGroupStatus.FINALIZATION_UNKNOWN
    with pytest.raises(CheckpointUnsafeError) as unsafe:
        ledger.assert_checkpoint_safe()
    assert unsafe.value.group_ids == ["grp"]
    with pytest.raises(CheckpointUnsafeError):
        ledger.state_dict()
    with pytest.raises(CheckpointUnsafeError):
        ledger.prepare_for_restart(CUT)
    # No retry path: the group can neither be published again nor re-finalized.
    plane.fail = None
    with pytest.raises(InvalidTransitionError, match="from 'finalization_unknown'"):
        publish(ledger, plane, index)


def test_unknown_outcome_when_the_replay_commit_fails(
    ledger: RolloutRecoveryLedger, plane: FaultyPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_group(ledger, plane, ["sealed", "sealed"])
    index = ReplayIndex(data_plane=plane, group_size=2)

    def broken_commit(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("index exploded")

    monkeypatch.setattr(index, "commit", broken_commit)
    with pytest.raises(RuntimeError, match="index exploded"):
        publish(ledger, plane, index)
    assert ledger.get_group("grp").status is PromptGroupStatus.FINALIZATION_UNKNOWN
    # The rows were written: exactly the ambiguity the unknown state records.
    assert plane.keys(CANONICAL_PARTITION) == ["grp_g0", "grp_g1"]
