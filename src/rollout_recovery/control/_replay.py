"""Journal replay: the records of the history re-applied to a ledger, a replay index and a
controller state, through the one transition of each record the live controller used
(``_transitions.py``).

Used twice:

- by the snapshot builder (``_snapshot.py``), which follows the journal in the background
  with its own copy of the state, so a checkpoint needs only a journal position under its
  exclusive hold;
- by a restore, which loads a snapshot and replays everything the journal recorded after
  it, so no acknowledged seal is lost.

Ids and versions come from the records, never drawn again. A record that does not apply
raises :class:`ReplayError` naming its line. A replay never touches rows: its transitions
clear and put through :func:`metadata_only_plane`.

What a restore undoes. The policy lives only in checkpoints, so training after a snapshot
is *rolled back*: its steps run again from the same canonical rows. Seals made under
weights a restore lost follow the reuse policy, one prompt group at a time (GRPO trains
a group together): a group with a seal the policy does not keep is *rewound* (its rounds,
seals, abandons and publish in the restore's window are not replayed; the restart then
abandons its attempts and it is generated again), unless it was dropped. The window runs
from the snapshot to the restore, and a window of an earlier restore inside it keeps its
own rewinds, so a rewound group stands where it stood at the snapshot or right after the
last earlier restore. The abandons a restart writes after its ``restored`` record belong
to that restore, not to the group's work: they are replayed for a rewound group too, so
the rounds they gave back stay given back (a restart never costs a prompt a round, however
many kills come in a row). Every restore writes a ``restored`` record saying which steps
it rolled back and which seals it discarded; a later replay that crosses that record
rewinds the same groups from it (a first pass reads every ``restored`` record), so a
replay of the whole journal from its start arrives at the live state too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import assert_never

from .._crashpoints import crash_point
from .._cut import MutationCut
from ..dataplane import DataPlane, ReplayIndex, Row
from ..errors import InvalidStateError, RolloutRecoveryError
from ..history import JournalEntry, records
from ..ledger import RolloutRecoveryLedger
from ._state import ControllerState
from ._transitions import Transitions, by_restart, placeholder_prompt

__all__ = [
    "JournalReplay",
    "ReplayError",
    "ReplayOutcome",
    "bind_placeholder_prompts",
    "metadata_only_plane",
    "whole_cuts",
]


class ReplayError(InvalidStateError):
    """A journal record does not apply to the state it follows: fatal, names its line."""

    fatal = True


class _NoRows:
    """The data plane of a replayed replay index: ownership only, no rows (a replay never
    touches rows; the live run put and cleared them)."""

    def clear(self, partition: str, keys: Iterable[str], *, cut: MutationCut | None = None) -> None:
        return None

    def keys(self, partition: str) -> list[str]:
        return []

    def get(self, partition: str, keys: Sequence[str]) -> list[Row]:
        raise InvalidStateError("a replayed replay index holds no rows")


def whole_cuts(
    entries: Sequence[JournalEntry], *, batch_size: int, journal: Path
) -> tuple[list[JournalEntry], int | None]:
    """``entries`` without a reservation batch that the journal's end cut short.

    A batch of prompts is one cut, written at once; only a power cut can leave part of
    it (the unsynced end of the file torn mid-write). Returns the entries to replay and
    the offset to cut the journal back to (None when nothing is torn). A partial batch
    with other records after it is not a crash's work: a :class:`ReplayError`.
    """
    last_taken = [
        index
        for index, entry in enumerate(entries)
        if isinstance(entry.record, records.PromptTaken)
    ]
    if not last_taken:
        return list(entries), None
    final = entries[last_taken[-1]].record
    assert isinstance(final, records.PromptTaken)
    batch_entries = [
        index
        for index in last_taken
        if isinstance(entries[index].record, records.PromptTaken)
        and entries[index].record.batch == final.batch  # type: ignore[union-attr]
    ]
    if len(batch_entries) == batch_size:
        return list(entries), None
    first = batch_entries[0]
    if last_taken[-1] != len(entries) - 1 or batch_entries != list(range(first, len(entries))):
        entry = entries[first]
        raise ReplayError(
            f"{journal.name}:{entry.line} (byte {entry.offset}): reservation batch "
            f"{final.batch} holds {len(batch_entries)} of its {batch_size} prompts, with "
            "other records after it: the journal was altered",
            file=str(journal),
        )
    return list(entries[:first]), entries[first].offset


def bind_placeholder_prompts(cut: MutationCut, ledger: RolloutRecoveryLedger) -> None:
    """Give every group of a copied ledger its placeholder prompt (a copy has none)."""
    for group in ledger.groups():
        ledger.bind_runtime_prompt(
            cut,
            group.group_id,
            placeholder_prompt(int(group.prompt_id), group.prompt_ref.task_name),
        )


def metadata_only_plane() -> DataPlane:
    """A stand-in data plane for a replay index that only tracks ownership."""
    return _NoRows()  # type: ignore[return-value]


@dataclass(slots=True)
class _Window:
    """What one restore undid: the records in [start, end) after its snapshot."""

    start: int
    end: int
    #: Groups it rewound (a seal of theirs after the snapshot was not kept).
    rewound: frozenset[str]

    def holds(self, offset: int) -> bool:
        return self.start <= offset < self.end


@dataclass(slots=True)
class ReplayOutcome:
    """What a replay did beyond applying records (for the ``restored`` record)."""

    replayed: int = 0
    #: Steps trained after the snapshot, rolled back (trained again).
    rolled_back_steps: list[int] = field(default_factory=list)
    #: Seals this restore's reuse policy discarded (every seal of a rewound group).
    discarded: list[records.DiscardedSeal] = field(default_factory=list)
    #: Tokens of the journaled seals kept.
    tokens_kept: int = 0

    def restored(
        self,
        *,
        checkpoint: str,
        position: int,
        reuse: records.ReusePolicy,
        ledger: RolloutRecoveryLedger,
        replay: ReplayIndex,
        state: ControllerState,
    ) -> records.Restored:
        """The ``restored`` record of a restore that replayed this from the snapshot at
        journal ``position``, now that ``ledger``, ``replay`` and ``state`` are restored:
        what it replayed, rolled back and discarded, and what it kept. The costs only a
        restore over rows knows (tokens, resumable calls) are left for it to fill in."""
        groups = ledger.groups()
        return records.Restored(
            checkpoint=checkpoint,
            step=state.step,
            snapshot_position=position,
            replayed_records=self.replayed,
            reuse=reuse,
            rolled_back_steps=list(self.rolled_back_steps),
            discarded=list(self.discarded),
            groups_in_ledger=len(groups),
            sealed_siblings_kept=sum(len(group.sealed_generation_indices) for group in groups),
            canonical_groups=len(replay),
            shortfall=dict(state.shortfall),
            seals_lost=len(self.discarded),
            tokens_lost=sum(seal.tokens for seal in self.discarded),
        )


class _Rewound(Enum):
    """What replaying a record of a rewound group does."""

    #: Applied as any record.
    APPLY = "apply"
    #: Counted in the controller state only (its tokens were generated all the same).
    COUNT = "count"
    #: Not replayed: the group's work the restore undid.
    SKIP = "skip"


def _when_rewound(record: records.HistoryRecord, rewound: frozenset[str]) -> _Rewound:
    """What replaying ``record`` does inside a restore window that rewound ``rewound``."""
    match record:
        case records.PromptTaken() | records.PromptAliased() | records.BatchAdmitted():
            return _Rewound.APPLY  # a rewound group keeps its place and its admission
        case records.SiblingSealed() | records.GroupSealed():
            return _Rewound.COUNT if record.group_id in rewound else _Rewound.APPLY
        case records.AttemptsAbandoned() if by_restart(record):
            # The restore's own record (after its ``restored``), not the group's work: the
            # round it gave back stays given back (issue 24, item 6).
            return _Rewound.APPLY
        case (
            records.AttemptsAbandoned()
            | records.RoundStarted()
            | records.AttemptResumed()
            | records.PromptDropped()
            | records.GroupPublished()
        ):
            return _Rewound.SKIP if record.group_id in rewound else _Rewound.APPLY
        case (
            records.RunStarted()
            | records.StepTrained()
            | records.CheckpointCommitted()
            | records.Restored()
            | records.BackendEvent()
        ):
            return _Rewound.APPLY  # no group of its own (a step's rollback is its window's)
        case _:
            assert_never(record)


class JournalReplay:
    """Applies journal entries to ``ledger``, ``replay`` and ``state`` in order."""

    def __init__(
        self,
        *,
        ledger: RolloutRecoveryLedger,
        replay: ReplayIndex,
        state: ControllerState,
        journal: Path,
    ) -> None:
        self.ledger = ledger
        self.replay = replay
        self.state = state
        self._transitions = Transitions(
            ledger=ledger, replay=replay, state=state, rows=metadata_only_plane()
        )
        self._journal = journal
        self._windows: list[_Window] = []

    # -- the two passes ------------------------------------------------------------------

    def restore(
        self,
        cut: MutationCut,
        entries: Sequence[JournalEntry],
        *,
        snapshot_position: int,
        reuse: records.ReusePolicy,
    ) -> ReplayOutcome:
        """Replay ``entries`` (everything after a snapshot) as a restore: training after
        the snapshot rolled back, groups with seals under lost weights rewound per
        ``reuse``."""
        # Pass 1: what each earlier restore undid, and what this one will.
        self._windows = self._earlier_restores(entries, since=None)
        end = entries[-1].offset + 1 if entries else snapshot_position
        lineage = set(self.state.lineage)
        dropped = {
            e.record.group_id for e in entries if isinstance(e.record, records.PromptDropped)
        }
        rewound = {
            record.group_id
            for entry in entries
            if self._window_of(entry.offset) is None
            and isinstance(record := entry.record, records.SiblingSealed | records.GroupSealed)
            and not all(_kept(seal, reuse, lineage) for seal in _seals_of(record))
        } - dropped
        current = _Window(snapshot_position, end, frozenset(rewound))
        outcome = ReplayOutcome()
        # Pass 2: apply.
        middle = len(entries) // 2
        for index, entry in enumerate(entries):
            if index == middle:
                crash_point("replay.mid")
            self._apply(cut, entry, current=current, out=outcome)
        return outcome

    def follow(self, cut: MutationCut, entries: Sequence[JournalEntry]) -> int:
        """Apply records with no restore of this replay in between: the snapshot builder's
        pass, or the whole journal from its start (with the restores it records)."""
        self._windows = self._earlier_restores(entries, since=entries[0].offset if entries else 0)
        for entry in entries:
            self._apply(cut, entry, current=None, out=None)
        return len(entries)

    def _earlier_restores(
        self, entries: Sequence[JournalEntry], *, since: int | None
    ) -> list[_Window]:
        """The windows of the restores ``entries`` record. With ``since``, each must begin
        at or after it: a window reaching back before a follow's start would rewind
        records it already applied. (A restore's snapshot may lie inside an earlier
        restore's window, after a fallback: those records are rewound as that restore
        rewound them.)"""
        windows: list[_Window] = []
        for entry in entries:
            record = entry.record
            if not isinstance(record, records.Restored):
                continue
            if since is not None and record.snapshot_position < since:
                raise ReplayError(
                    f"{self._journal.name}:{entry.line} (byte {entry.offset}): the restore "
                    f"recorded here began at byte {record.snapshot_position}, before this "
                    f"replay's start ({since}): replay from that snapshot or earlier",
                    file=str(self._journal),
                )
            windows.append(
                _Window(
                    record.snapshot_position,
                    entry.offset,
                    frozenset(d.group_id for d in record.discarded),
                )
            )
        return windows

    # -- one record ----------------------------------------------------------------------

    def _window_of(self, offset: int) -> _Window | None:
        for window in self._windows:
            if window.holds(offset):
                return window
        return None

    def _apply(
        self,
        cut: MutationCut,
        entry: JournalEntry,
        *,
        current: _Window | None,
        out: ReplayOutcome | None,
    ) -> None:
        record = entry.record
        earlier = self._window_of(entry.offset)
        window = earlier or current
        effect = _Rewound.APPLY if window is None else _when_rewound(record, window.rewound)
        if out is not None:
            out.replayed += 1
        if effect is _Rewound.SKIP:
            return
        if effect is _Rewound.COUNT:
            # A rewound group's seal: not replayed, but its tokens were generated.
            self.state.apply(record)
            if out is not None and window is current:
                out.discarded.extend(_discarded(record))
            return
        # Training after a snapshot: its policy was lost, it runs again.
        rolled_back = window is not None and isinstance(record, records.StepTrained)
        try:
            self._transitions.apply(cut, record, rolled_back=rolled_back)
        except RolloutRecoveryError as error:
            raise ReplayError(
                f"{self._journal.name}:{entry.line} (byte {entry.offset}): a "
                f"{type(record).__name__} record does not apply: {error}",
                file=str(self._journal),
            ) from error
        if out is None:
            return
        if rolled_back and earlier is None:
            assert isinstance(record, records.StepTrained)
            out.rolled_back_steps.append(record.step)
        if isinstance(record, records.SiblingSealed | records.GroupSealed):
            out.tokens_kept += sum(seal.tokens for seal in _seals_of(record))


def _seals_of(record: records.SiblingSealed | records.GroupSealed) -> list[records.Seal]:
    return [record.seal] if isinstance(record, records.SiblingSealed) else list(record.seals)


def _discarded(record: records.HistoryRecord) -> list[records.DiscardedSeal]:
    if not isinstance(record, records.SiblingSealed | records.GroupSealed):
        return []
    return [
        records.DiscardedSeal(
            group_id=record.group_id,
            generation_index=seal.generation_index,
            rollout_id=seal.rollout_id,
            tokens=seal.tokens,
            weight_versions=list(seal.weight_versions),
        )
        for seal in _seals_of(record)
    ]


def _kept(seal: records.Seal, reuse: records.ReusePolicy, lineage: set[int]) -> bool:
    """Whether a restore keeps a seal journaled after its snapshot."""
    if reuse is records.ReusePolicy.ALL:
        return True
    if reuse is records.ReusePolicy.NONE:
        return False
    return all(version in lineage for version in seal.weight_versions)
