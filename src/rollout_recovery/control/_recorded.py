"""The state a journal folds to, for a loop the controller does not run (the recorder).

A foreign trainer (TRL's, verl's) owns its loop and calls the recorder (``recorder/``)
from inside it. The recorder writes the controller's history (the same typed records, the
same journal) and must not grow a second way of turning a record into state: it applies
every record through :class:`Transitions` (the one transition per record), snapshots
through the :class:`SnapshotBuilder` and restores through :class:`JournalReplay`, as the
controller's checkpoints do. :class:`RecordedRun` is that seam, the one name the recorder
imports from this room.

The recorder has no barrier: it serializes its calls under one lock, so inside it the
state is always live (:data:`_RECORDER_CUT`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._durable import FileParts
from ..dataplane import DataPlane, ReplayIndex, Row
from ..errors import InvalidOperationError, RolloutRecoveryError
from ..history import JournalEntry, records
from ..ledger import RolloutRecoveryLedger
from ..rewards import CaptureRewardSettings
from ..rundir import CheckpointStore
from ._checkpointing import _dispatched_attempts, decode_checkpoint_files, restart_abandons
from ._replay import JournalReplay, bind_placeholder_prompts, metadata_only_plane
from ._snapshot import Snapshot, SnapshotBuilder
from ._state import ControllerState
from ._transitions import Transitions, fresh_rollout_id

__all__ = ["RecordedRestore", "RecordedRun"]


class _RecorderCut:
    """The recorder's cut: its lock serializes every mutation, so the state is live."""

    def require_live(self) -> None:
        return None


_RECORDER_CUT = _RecorderCut()


@dataclass(frozen=True, slots=True)
class RecordedRestore:
    """What :meth:`RecordedRun.restore` did: the records to journal (already applied)
    and where it started from."""

    #: ``restored``, then one ``attempts_abandoned`` (reason ``restart``) per group whose
    #: attempts the crash interrupted.
    records: list[records.HistoryRecord]
    #: The committed snapshot it loaded (``""``: none, the journal replayed from its start).
    snapshot: str
    #: ``(group id, generation index, rollout id)`` of every attempt the restart abandoned.
    interrupted: list[tuple[str, int, str]] = field(default_factory=list)


class RecordedRun:
    """The ledger, replay index and controller state of a recorder's run, moved only by
    :meth:`apply` (the one transition of each record)."""

    def __init__(
        self,
        *,
        ledger: RolloutRecoveryLedger,
        replay: ReplayIndex,
        state: ControllerState,
        rows: DataPlane,
        group_size: int,
    ) -> None:
        self.ledger = ledger
        self.replay = replay
        self.state = state
        self.group_size = group_size
        self._transitions = Transitions(ledger=ledger, replay=replay, state=state, rows=rows)
        self._snapshots: SnapshotBuilder | None = None

    @classmethod
    def fresh(cls, rows: DataPlane, *, group_size: int) -> RecordedRun:
        """The state of a run that has done nothing yet."""
        return cls(
            ledger=RolloutRecoveryLedger(),
            replay=ReplayIndex(data_plane=rows, group_size=group_size),
            state=ControllerState.initial(0),
            rows=rows,
            group_size=group_size,
        )

    # -- live -----------------------------------------------------------------------------

    def apply(
        self, record: records.HistoryRecord, *, canonical_rows: Mapping[str, Row] | None = None
    ) -> None:
        """Apply ``record``'s one transition; raises, changing nothing, if it does not apply."""
        self._transitions.apply(_RECORDER_CUT, record, canonical_rows=canonical_rows)

    @staticmethod
    def new_rollout_id(group_id: str, index: int) -> str:
        """A fresh attempt's rollout id, in the ledger's form."""
        return fresh_rollout_id(group_id, index)

    # -- snapshots ------------------------------------------------------------------------

    def follow_journal(self, journal: Path, position: int) -> None:
        """Start following ``journal`` from ``position``, where the state now stands: the
        snapshots are built from the journal on disk from then on, never from this state."""
        self._snapshots = SnapshotBuilder(
            journal=journal,
            position=position,
            ledger=self.ledger,
            replay=self.replay,
            state=self.state,
            group_size=self.group_size,
        )

    def snapshot(self, position: int) -> Snapshot:
        """The snapshot of the journal up to ``position`` (durable before the call)."""
        if self._snapshots is None:
            raise InvalidOperationError("snapshot before follow_journal: no snapshot builder")
        self._snapshots.advance_to(position)
        return self._snapshots.snapshot(
            sidecar_format="native", settings=CaptureRewardSettings(), config={}, identity=""
        )

    @staticmethod
    def snapshot_files(snapshot: Snapshot) -> dict[str, bytes | FileParts]:
        """A snapshot's checkpoint files (no trainer's: the caller's trainer saves its own)."""
        files = CheckpointStore.FILES
        return {
            snapshot.sidecar_name: snapshot.sidecar,
            files.replay_index: snapshot.replay_state,
            files.controller_state: snapshot.controller_state,
        }

    # -- restore --------------------------------------------------------------------------

    @classmethod
    def restore(
        cls,
        *,
        journal: Path,
        entries: Sequence[JournalEntry],
        store: CheckpointStore,
        rows: DataPlane,
        group_size: int,
        position: int,
        checkpoint: str,
    ) -> tuple[RecordedRun, RecordedRestore]:
        """The state at journal ``position`` (where the caller's trainer checkpoint stands)
        with every record after it replayed as a restore: training after ``position`` is
        rolled back (the caller's trainer lost it), every seal is kept, and attempts in
        flight are abandoned (reason ``restart``).

        Starts from the newest committed snapshot at or before ``position`` that decodes
        and replays (else from the empty state at the journal's start), so the result is
        the controller's restore of a snapshot at ``position``. ``entries``: the whole
        journal, verified.
        """
        candidates: list[tuple[int, str]] = []
        for committed in store.committed():
            try:
                start = store.read_marks(committed).get(journal.name)
            except RolloutRecoveryError:
                continue
            if start is not None and start <= position:
                candidates.append((start, committed.name))
        candidates.sort(reverse=True)
        for start, name in [*candidates, (0, "")]:
            try:
                recorded = cls._replayed(
                    journal=journal,
                    entries=entries,
                    store=store,
                    rows=rows,
                    group_size=group_size,
                    snapshot=(start, name),
                    position=position,
                    checkpoint=checkpoint,
                )
            except (RolloutRecoveryError, ValueError):
                if not name:
                    raise
                continue  # a damaged or unusable snapshot: an older one, or the start
            return recorded
        raise AssertionError("unreachable: the empty state either replays or raises")

    @classmethod
    def _replayed(
        cls,
        *,
        journal: Path,
        entries: Sequence[JournalEntry],
        store: CheckpointStore,
        rows: DataPlane,
        group_size: int,
        snapshot: tuple[int, str],
        position: int,
        checkpoint: str,
    ) -> tuple[RecordedRun, RecordedRestore]:
        start, name = snapshot
        cut = _RECORDER_CUT
        if name:
            committed = next(c for c in store.committed() if c.name == name)
            files = decode_checkpoint_files(store.load(committed), trainer=False)
            ledger = RolloutRecoveryLedger.from_state_dict(files.parsed.ledger_state)
            bind_placeholder_prompts(cut, ledger)
            replay = ReplayIndex.from_state_dict(
                files.replay_state,
                data_plane=metadata_only_plane(),
                group_size=group_size,
                check_rows=False,
            )
            state = files.controller_state
        else:
            ledger = RolloutRecoveryLedger()
            replay = ReplayIndex(data_plane=metadata_only_plane(), group_size=group_size)
            state = ControllerState.initial(0)
        replayer = JournalReplay(ledger=ledger, replay=replay, state=state, journal=journal)
        replayer.follow(cut, [e for e in entries if start <= e.offset < position])
        after = [e for e in entries if e.offset >= position]
        outcome = replayer.restore(
            cut, after, snapshot_position=position, reuse=records.ReusePolicy.ALL
        )
        interrupted = _dispatched_attempts(ledger)
        ledger.prepare_for_restart(cut)
        ledger.discard_canonical_groups(cut, replay.group_ids())
        live_replay = ReplayIndex.from_state_dict(
            replay.state_dict(), data_plane=rows, group_size=group_size, check_rows=False
        )
        restored = outcome.restored(
            checkpoint=checkpoint,
            position=position,
            reuse=records.ReusePolicy.ALL,
            ledger=ledger,
            replay=live_replay,
            state=state,
        )
        abandons: list[records.HistoryRecord] = [*restart_abandons(ledger, interrupted)]
        recorded = cls(
            ledger=ledger, replay=live_replay, state=state, rows=rows, group_size=group_size
        )
        return recorded, RecordedRestore(
            records=[restored, *abandons],
            snapshot=name,
            interrupted=[
                (group_id, index, rollout_id)
                for group_id, attempts in interrupted.items()
                for index, rollout_id in attempts
            ],
        )
