"""The snapshot builder's incremental snapshots are full ones, byte for byte (issue 28,
item 5).

The builder re-encodes only the groups the records since its previous snapshot touched
(``_snapshot._touched``). A record that touched a group it did not name would leave that
group's old bytes in the file: the property below follows the golden journal (a real run:
faults, retries, publishes, trained steps, two restores, a drain) with snapshots at random
positions and compares each with everything encoded afresh from the same state, the way
``snapshot()`` did before. The planted-bug test proves the property sees a missed mark.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_recovery._durable import FileParts
from rollout_recovery.checkpoint import SidecarFormat
from rollout_recovery.control import _snapshot
from rollout_recovery.control._replay import metadata_only_plane
from rollout_recovery.control._snapshot import Snapshot, SnapshotBuilder
from rollout_recovery.control._state import ControllerState, encode_controller_state
from rollout_recovery.dataplane import ReplayIndex
from rollout_recovery.history import records
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.ledger import RolloutRecoveryLedger
from rollout_recovery.rewards import CaptureRewardSettings
from rollout_recovery.rundir import CheckpointStore

JOURNAL = Path(__file__).parents[1] / "fixtures" / "transitions" / "events.jsonl"
GROUP_SIZE = 2  # the golden job's generations_per_prompt
ENTRIES = read_entries(JOURNAL)
END = JOURNAL.stat().st_size
SETTINGS = CaptureRewardSettings()
CONFIG: dict[str, Any] = {"job": {"name": "golden"}}
FORMATS = ("native", "pt")


def builder() -> SnapshotBuilder:
    return SnapshotBuilder(
        journal=JOURNAL,
        position=0,
        ledger=RolloutRecoveryLedger(),
        replay=ReplayIndex(data_plane=metadata_only_plane(), group_size=GROUP_SIZE),
        state=ControllerState.initial(0),
        group_size=GROUP_SIZE,
    )


def take(snapshots: SnapshotBuilder, format: str) -> Snapshot:
    return snapshots.snapshot(
        sidecar_format=format,  # type: ignore[arg-type]
        settings=SETTINGS,
        config=CONFIG,
        identity="golden",
    )


def full(snapshots: SnapshotBuilder, format: str) -> Snapshot:
    """The snapshot of the builder's state with everything encoded afresh (the builder's
    ``snapshot()`` before it was incremental)."""
    ledger, replay = snapshots.ledger, snapshots.replay
    sidecar_format = SidecarFormat(format)
    state = copy.copy(snapshots.state)
    state.config = CONFIG
    state.identity = "golden"
    return Snapshot(
        position=snapshots.position,
        step=state.step,
        weight_version=state.weight_version,
        sidecar_name=sidecar_format.filename,
        sidecar=sidecar_format.encode_checkpoint(
            ledger,
            batch_shortfall=dict(state.shortfall),
            sampler_stamps_target_steps=True,
            finalizer_metrics_by_group=replay.metrics_by_group(),
            reward_settings=SETTINGS,
            canonical_group_ids=set(replay.group_ids()),
        ),
        replay_state=msgspec.msgpack.encode(replay.state_dict()),
        controller_state=encode_controller_state(state),
        expected_staging=frozenset(ledger.expected_staging_keys()),
        canonical_keys=frozenset(replay.row_keys()),
    )


def boundaries(end: int) -> list[int]:
    """The positions a builder following the journal up to ``end`` may stop at: a restore
    recorded before ``end`` must be replayed in one advance with its window (a follow
    refuses a restore whose snapshot lies before the advance's start)."""
    windows = [
        (entry.record.snapshot_position, entry.offset)
        for entry in ENTRIES
        if isinstance(entry.record, records.Restored) and entry.offset < end
    ]
    return [
        entry.offset
        for entry in ENTRIES
        if 0 < entry.offset < end and not any(lo < entry.offset <= hi for lo, hi in windows)
    ]


def follow(stops: Iterable[int], format: str) -> list[tuple[Snapshot, Snapshot]]:
    """Snapshots at each stop, incremental and full; all are taken before any is compared,
    so each incremental one is held while the builder goes on (its sidecar's groups and its
    staging keys are views of the encoder's maps: a later record must not reach them)."""
    snapshots = builder()
    taken = []
    for stop in stops:
        snapshots.advance_to(stop)
        taken.append((take(snapshots, format), full(snapshots, format)))
    return taken


def test_the_golden_journal_gives_the_property_something_to_find() -> None:
    # Snapshots may stop inside the records after the last restore, which hold every kind
    # of record that changes a group.
    last_restore = max(e.offset for e in ENTRIES if isinstance(e.record, records.Restored))
    free = {type(e.record) for e in ENTRIES if e.offset > last_restore}
    assert {records.SiblingSealed, records.GroupPublished, records.StepTrained} <= free
    assert {records.RoundStarted, records.AttemptsAbandoned, records.PromptTaken} <= free
    assert len([b for b in boundaries(END) if b > last_restore]) > 30


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_incremental_snapshots_equal_full_ones(data: st.DataObject) -> None:
    end = data.draw(st.sampled_from([*(e.offset for e in ENTRIES[1:]), END]), label="end")
    allowed = boundaries(end)
    stops = data.draw(st.sets(st.sampled_from(allowed)) if allowed else st.just(set()))
    format = data.draw(st.sampled_from(FORMATS), label="format")
    for incremental, whole in follow([*sorted(stops), end], format):
        assert incremental == whole


def test_every_position_after_the_restores_in_one_run() -> None:
    """Snapshots at every record after the journal's last restore: each re-encodes only
    what one record touched (the property's stops are sparser)."""
    last_restore = max(e.offset for e in ENTRIES if isinstance(e.record, records.Restored))
    stops = [b for b in boundaries(END) if b > last_restore] + [END]
    snapshots = builder()
    snapshots.advance_to(stops[0])
    take(snapshots, "native")
    for stop in stops[1:]:
        snapshots.advance_to(stop)
        assert take(snapshots, "native") == full(snapshots, "native"), stop
    # One full encode at the start, and one at each restore the first advance crossed.
    assert snapshots._sidecar.full_encodes == 1


def test_the_native_sidecar_is_written_from_its_parts(tmp_path: Path) -> None:
    """The snapshot hands out the native sidecar as its parts, not as a joined file: the
    checkpoint's writer joins and checksums them as it writes, and what it writes is the
    full encode's file. Nothing else in it is built per key of the ledger either."""
    snapshots = builder()
    snapshots.advance_to(END)
    take(snapshots, "native")  # the first: fills the cache
    incremental = take(snapshots, "native")
    assert isinstance(incremental.sidecar, FileParts)
    assert not isinstance(incremental.sidecar, bytes | bytearray | memoryview)
    store = CheckpointStore(tmp_path, keep=1)
    saved = store.save(incremental.step, {incremental.sidecar_name: incremental.sidecar})
    whole = full(snapshots, "native").sidecar
    assert (saved / incremental.sidecar_name).read_bytes() == whole
    assert store.load(store.committed()[0]).files[incremental.sidecar_name] == whole
    # The rows it owns: the groups' key lists, the set built by the row check, not here.
    assert not isinstance(incremental.expected_staging, frozenset | set)
    assert frozenset(incremental.expected_staging) == full(snapshots, "native").expected_staging


def _forgetting(kind: type[records.HistoryRecord]) -> Callable[[Any], Any]:
    real = _snapshot._touched

    def touched(record: records.HistoryRecord) -> Iterable[str] | None:
        return () if isinstance(record, kind) else real(record)

    return touched


@pytest.mark.parametrize(
    "kind",
    [
        records.RoundStarted,
        records.SiblingSealed,
        records.AttemptsAbandoned,
        records.GroupPublished,
        records.BatchAdmitted,
    ],
)
def test_a_missed_mark_is_caught(kind: type[records.HistoryRecord], monkeypatch: Any) -> None:
    """The planted bug: the builder forgets the groups one kind of record touches. Some
    snapshot then differs from the full one, and the comparison sees it."""
    monkeypatch.setattr(_snapshot, "_touched", _forgetting(kind))
    taken = follow([*boundaries(END), END], "native")
    assert any(incremental != whole for incremental, whole in taken)
