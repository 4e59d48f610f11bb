"""Snapshots of the journal, built outside the checkpoint's exclusive hold.

A :class:`SnapshotBuilder` keeps its own ledger, replay index and controller state and
follows the journal: to snapshot the history up to position ``P`` it replays the records
between its last position and ``P`` (read back from ``events.jsonl``, verified) and
encodes what it then holds. The live controller is never read, so the checkpoint's hold
only has to take ``P``: it stays flat however large the ledger grows, and every snapshot
proves on the way that the journal on disk rebuilds the state.

The ledger's part of the sidecar is encoded incrementally (:class:`IncrementalSidecar`):
each record the builder replays names the groups it touches (:func:`_touched`), and a
snapshot re-encodes only those, so its cost follows the records since the previous
snapshot, not the ledger. The bytes are a full encode's (the property tests compare them).
The native sidecar is handed out as its parts (``NativeFileParts``), neither joined nor
checksummed: the checkpoint's writer does both as it writes the file (``CheckpointStore.save``),
which is O(bytes) anyway and runs in the background write (``[checkpoint] background``).
Its groups and the staging keys the row check needs are persistent views of the encoder's
maps, taken in O(1): the builder goes on replaying while they are written, and no later
record changes a snapshot already taken.
The replay index keeps its groups' encoded entries too (``ReplayIndex.encoded_state``).
What stays O(ledger) or O(replay index) per snapshot is listed in ``_incremental.py`` and
``encoded_state``, and here: the checks of the sidecar's finalizer metrics (Python, one
entry per canonical group), the sets of canonical ids and row keys, and the controller
state (its ``rounds_used`` has one entry per unfinished group; one msgspec call).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, assert_never

import msgspec

from .._durable import FileParts
from ..checkpoint import IncrementalSidecar, SidecarFormat
from ..dataplane import ReplayIndex
from ..history import JournalScan, records
from ..ledger import RolloutRecoveryLedger
from ..rewards import CaptureRewardSettings
from ._replay import JournalReplay, bind_placeholder_prompts, metadata_only_plane
from ._state import ControllerState, encode_controller_state

__all__ = ["Snapshot", "SnapshotBuilder"]


class _ReplayCut:
    """The cut of the builder's private state: nothing else can reach it, so it is always
    live (like a ledger being loaded, which takes no cut either)."""

    def require_live(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The encoded state at one journal position, ready to be written as a checkpoint."""

    position: int
    step: int
    weight_version: int
    sidecar_name: str
    #: The sidecar file: the native one as its parts, which its writer joins and
    #: checksums as it writes them (``bytes(...)`` for the bytes).
    sidecar: bytes | FileParts
    replay_state: bytes
    controller_state: bytes
    #: The rows the snapshot owns (checked present before the checkpoint commits); a
    #: view of the groups' key lists, not a set built here (``frozenset(...)`` for one).
    expected_staging: Iterable[str]
    canonical_keys: frozenset[str]


class SnapshotBuilder:
    """Follows ``journal`` from ``position`` with copies of a consistent state."""

    def __init__(
        self,
        *,
        journal: Path,
        position: int,
        ledger: RolloutRecoveryLedger,
        replay: ReplayIndex,
        state: ControllerState,
        group_size: int,
    ) -> None:
        self._journal = journal
        self.position = position
        # Copies: the builder's state evolves only from the journal from here on.
        self.ledger = RolloutRecoveryLedger.from_state_dict(ledger.state_dict())
        bind_placeholder_prompts(_ReplayCut(), self.ledger)
        self.replay = ReplayIndex.from_state_dict(
            replay.state_dict(),
            data_plane=metadata_only_plane(),
            group_size=group_size,
            check_rows=False,
        )
        self.state = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=ControllerState)
        self._replay = JournalReplay(
            ledger=self.ledger, replay=self.replay, state=self.state, journal=journal
        )
        self.records_followed = 0
        # The line number at ``position``, so each advance reads only the new records
        # (counting the lines before it would read the whole history at every snapshot).
        self._line: int | None = None
        # Told which groups each replayed record touches; the first snapshot is a full one.
        self._sidecar = IncrementalSidecar(self.ledger)

    def advance_to(self, position: int) -> None:
        """Replay the journal's records from the builder's position up to ``position``."""
        if position <= self.position:
            return
        scan = JournalScan.read(
            self._journal, start=self.position, limit=position, start_line=self._line
        )
        # Marked before they apply: a record that fails halfway has touched its groups too.
        for entry in scan.entries:
            self._mark(entry.record)
        self.records_followed += self._replay.follow(_ReplayCut(), scan.entries)
        self.position = scan.end
        self._line = scan.end_line

    def snapshot(
        self,
        *,
        sidecar_format: Literal["native", "pt"],
        settings: CaptureRewardSettings,
        config: dict[str, Any],
        identity: str,
    ) -> Snapshot:
        """Encode the builder's state (at its position) as checkpoint files."""
        canonical_ids = set(self.replay.group_ids())
        fields: dict[str, Any] = {
            "batch_shortfall": dict(self.state.shortfall),
            "sampler_stamps_target_steps": True,
            "finalizer_metrics_by_group": self.replay.metrics_by_group(),
            "reward_settings": settings,
            "canonical_group_ids": canonical_ids,
        }
        format = SidecarFormat(sidecar_format)
        sidecar = self._sidecar.encode_parts(format, **fields)
        state = copy.copy(self.state)
        state.config = config
        state.identity = identity
        return Snapshot(
            position=self.position,
            step=self.state.step,
            weight_version=self.state.weight_version,
            sidecar_name=format.filename,
            sidecar=sidecar,
            replay_state=self.replay.encoded_state(),
            controller_state=encode_controller_state(state),
            expected_staging=self._sidecar.staging_keys(),
            canonical_keys=frozenset(self.replay.row_keys()),
        )

    def _mark(self, record: records.HistoryRecord) -> None:
        """Tell the sidecar which groups ``record`` may change when it applies."""
        touched = _touched(record)
        if touched is None:
            self._sidecar.changed_all()
            return
        self._sidecar.changed(touched)
        if isinstance(record, records.PromptTaken):
            self._sidecar.reserved(record.group_id)


def _touched(record: records.HistoryRecord) -> Iterable[str] | None:
    """The groups whose ledger or replay-index entries applying ``record`` may change
    (``_transitions.py``), or None for any of them. A record type without a case is a
    mypy error: a new record must say what it touches before snapshots can follow it."""
    match record:
        case (
            records.PromptTaken()
            | records.PromptAliased()
            | records.RoundStarted()
            | records.AttemptResumed()
            | records.SiblingSealed()
            | records.GroupSealed()
            | records.AttemptsAbandoned()
            | records.PromptDropped()
            | records.GroupPublished()
        ):
            return (record.group_id,)
        case records.BatchAdmitted() | records.StepTrained():
            return record.group_ids
        case records.Restored():
            return None  # ``prepare_for_restart`` abandons attempts of every group
        case records.RunStarted() | records.CheckpointCommitted() | records.BackendEvent():
            return ()
        case _:
            assert_never(record)
