"""Journal replay: the records of the history re-applied to a ledger, a replay index and a
controller state, through the same transitions the live controller made.

Used twice:

- by the snapshot builder (``_snapshot.py``), which follows the journal in the background
  with its own copy of the state, so a checkpoint needs only a journal position under its
  exclusive hold;
- by a restore, which loads a snapshot and replays everything the journal recorded after
  it, so no acknowledged seal is lost.

Ids and versions come from the records, never drawn again (``attempt_uuids``). A record
that does not apply raises :class:`ReplayError` naming its line.

What a restore undoes. The policy lives only in checkpoints, so training after a snapshot
is *rolled back*: its steps run again from the same canonical rows. Seals made under
weights a restore lost follow the reuse policy, one prompt group at a time (GRPO trains
a group together): a group with a seal the policy does not keep is *rewound* to where it
stood at the snapshot (its rounds, seals, abandons and publish after the snapshot are not
replayed; the restart then abandons its attempts and it is generated again), unless it
was dropped. Every restore writes a ``restored`` record saying which steps it rolled back
and which seals it discarded; a later replay that crosses that record rewinds the same
groups from it (a first pass reads every ``restored`` record).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._crashpoints import crash_point
from ..dataplane import DataPlane, ReplayIndex, Row
from ..errors import InvalidStateError, RolloutRecoveryError
from ..history import JournalEntry
from ..history.records import (
    AttemptsAbandoned,
    BatchAdmitted,
    DiscardedSeal,
    GroupPublished,
    GroupSealed,
    PromptDropped,
    PromptTaken,
    Restored,
    ReusePolicy,
    RoundStarted,
    Seal,
    SiblingSealed,
    StepTrained,
)
from ..ledger import (
    MutationCut,
    PromptRef,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    SiblingSealResult,
)
from ..rewards import RewardChecks
from ..rollout import FailureReason
from ._state import ControllerState

__all__ = [
    "JournalReplay",
    "ReplayError",
    "ReplayOutcome",
    "admission_id_of",
    "bind_placeholder_prompts",
    "metadata_only_plane",
    "placeholder_prompt",
    "whole_cuts",
]


def admission_id_of(batch: int) -> str:
    """The ledger's admission id of dataloader batch ``batch`` (one per reservation cut)."""
    return f"batch{batch:06d}"


class ReplayError(InvalidStateError):
    """A journal record does not apply to the state it follows: fatal, names its line."""

    fatal = True


def _attempt_uuid(rollout_id: str) -> uuid.UUID:
    """The attempt id inside a gate rollout id ``{group}_g{i}_a{hex}``."""
    _, _, hex_id = rollout_id.rpartition("_a")
    return uuid.UUID(hex=hex_id)


def _checks(seal: Seal) -> RewardChecks | None:
    checks = seal.reward_checks
    if checks is None:
        return None
    return RewardChecks(
        duplicated_reasoning=checks.duplicated_reasoning,
        empty_final_answer=checks.empty_final_answer,
        low_effort=checks.low_effort,
    )


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
        index for index, entry in enumerate(entries) if isinstance(entry.record, PromptTaken)
    ]
    if not last_taken:
        return list(entries), None
    final = entries[last_taken[-1]].record
    assert isinstance(final, PromptTaken)
    batch_entries = [
        index
        for index in last_taken
        if isinstance(entries[index].record, PromptTaken)
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


def placeholder_prompt(prompt_idx: int, task_name: str | None) -> dict[str, object]:
    """The prompt a replayed group carries until the dataset's is bound: just its identity
    (a replay needs no prompt; ``bind_runtime_prompt`` checks the real one against it)."""
    return {"idx": prompt_idx, "task_name": task_name}


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
    discarded: list[DiscardedSeal] = field(default_factory=list)
    #: Tokens of the journaled seals kept.
    tokens_kept: int = 0
    #: Rollout ids of attempts dispatched and never sealed nor abandoned in the history
    #: up to the crash: the attempts the crash interrupted (their staged calls are the
    #: work it lost). Includes attempts of groups the policy rewound.
    open_attempts: set[str] = field(default_factory=set)


#: What a rewound group still replays: its place in the dataloader and its admission.
_KEPT_FOR_REWOUND = (PromptTaken, BatchAdmitted)


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
        self._journal = journal
        self._windows: list[_Window] = []

    # -- the two passes ------------------------------------------------------------------

    def restore(
        self,
        cut: MutationCut,
        entries: Sequence[JournalEntry],
        *,
        snapshot_position: int,
        reuse: ReusePolicy,
    ) -> ReplayOutcome:
        """Replay ``entries`` (everything after a snapshot) as a restore: training after
        the snapshot rolled back, groups with seals under lost weights rewound per
        ``reuse``."""
        # Pass 1: what each earlier restore undid, and what this one will.
        self._windows = [
            _Window(
                entry.record.snapshot_position,
                entry.offset,
                frozenset(d.group_id for d in entry.record.discarded),
            )
            for entry in entries
            if isinstance(entry.record, Restored)
        ]
        end = entries[-1].offset + 1 if entries else snapshot_position
        lineage = set(self.state.lineage)
        dropped = {e.record.group_id for e in entries if isinstance(e.record, PromptDropped)}
        rewound = {
            record.group_id
            for entry in entries
            if self._window_of(entry.offset) is None
            and isinstance(record := entry.record, SiblingSealed | GroupSealed)
            and not all(_kept(seal, reuse, lineage) for seal in _seals_of(record))
        } - dropped
        current = _Window(snapshot_position, end, frozenset(rewound))
        outcome = ReplayOutcome(open_attempts=_open_attempts(self.ledger, entries))
        # Pass 2: apply.
        middle = len(entries) // 2
        for index, entry in enumerate(entries):
            if index == middle:
                crash_point("replay.mid")
            self._apply(cut, entry, current=current, out=outcome)
        return outcome

    def follow(self, cut: MutationCut, entries: Iterable[JournalEntry]) -> int:
        """Apply live records (no restore in between): the snapshot builder's pass."""
        count = 0
        for entry in entries:
            self._apply(cut, entry, current=None, out=None)
            count += 1
        return count

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
        window = self._window_of(entry.offset) or current
        group_id = getattr(record, "group_id", None)
        if (
            window is not None
            and group_id in window.rewound
            and not isinstance(record, _KEPT_FOR_REWOUND)
        ):
            # A rewound group: its work after the snapshot is not replayed (its seals'
            # tokens were generated all the same).
            if isinstance(record, SiblingSealed | GroupSealed):
                self.state.apply(record)
                if out is not None and window is current:
                    out.discarded.extend(_discarded(record))
            if out is not None:
                out.replayed += 1
            return
        try:
            rolled_back = self._transition(cut, entry, window, out)
        except RolloutRecoveryError as error:
            raise ReplayError(
                f"{self._journal.name}:{entry.line} (byte {entry.offset}): a "
                f"{type(record).__name__} record does not apply: {error}",
                file=str(self._journal),
            ) from error
        self.state.apply(record, rolled_back=rolled_back)
        if out is not None:
            out.replayed += 1
            if isinstance(record, SiblingSealed | GroupSealed):
                out.tokens_kept += sum(seal.tokens for seal in _seals_of(record))

    def _transition(
        self,
        cut: MutationCut,
        entry: JournalEntry,
        window: _Window | None,
        out: ReplayOutcome | None,
    ) -> bool:
        """Apply one record's transitions; True if it is a training step rolled back."""
        record = entry.record
        ledger = self.ledger
        if isinstance(record, PromptTaken):
            ledger.reserve_group(
                cut,
                prompt_id=str(record.prompt_idx),
                # The dataset's prompt is bound after the replay (its identity is checked).
                prompt_payload=placeholder_prompt(record.prompt_idx, record.task_name),
                prompt_ref=PromptRef(sample_id=str(record.prompt_idx), task_name=record.task_name),
                expected_generations=len(record.attempts),
                target_step=None,
                start_weight_version=record.weight_version,
                task_source=record.task_source,
                recovery_granularity=record.granularity,
                admitted=False,
                group_id=record.group_id,
                admission_id=admission_id_of(record.batch),
                attempt_uuids=[_attempt_uuid(rid) for rid in record.attempts],
            )
        elif isinstance(record, BatchAdmitted):
            for group_id in record.group_ids:
                ledger.mark_group_admitted(
                    cut,
                    group_id,
                    target_step=record.target_step,
                    start_weight_version=record.weight_version,
                )
        elif isinstance(record, RoundStarted):
            group = ledger.get_group(record.group_id)
            renewed = {
                attempt.generation_index: _attempt_uuid(attempt.rollout_id)
                for attempt in record.dispatched
                if group.gate_rollout_id(attempt.generation_index) != attempt.rollout_id
            }
            ledger.prepare_incomplete_retry(cut, record.group_id, attempt_uuids=renewed)
            ledger.mark_group_dispatched(
                cut,
                record.group_id,
                generation_indices=[a.generation_index for a in record.dispatched],
            )
        elif isinstance(record, SiblingSealed):
            seal = record.seal
            ledger.mark_sibling_sealed(
                cut,
                record.group_id,
                generation_index=seal.generation_index,
                gate_rollout_id=seal.rollout_id,
                receipt=seal.receipt,
                reward=seal.reward,
                mask_sample=seal.mask_sample,
                reward_checks=_checks(seal),
            )
        elif isinstance(record, GroupSealed):
            ledger.mark_group_sealed(
                cut,
                record.group_id,
                {
                    seal.generation_index: SiblingSealResult(
                        gate_rollout_id=seal.rollout_id,
                        receipt=seal.receipt,
                        reward=seal.reward,
                        mask_sample=seal.mask_sample,
                        reward_checks=_checks(seal),
                    )
                    for seal in record.seals
                },
            )
        elif isinstance(record, AttemptsAbandoned):
            # A restart's abandons are the prepare_for_restart of its restored record.
            if not all(a.reason is FailureReason.RESTART for a in record.attempts):
                ledger.abandon_unsealed(cut, record.group_id)
        elif isinstance(record, PromptDropped):
            ledger.discard_group(cut, record.group_id)
        elif isinstance(record, GroupPublished):
            ledger.mark_finalization_started(cut, record.group_id)
            if record.group_id not in self.replay.reserved_group_ids():
                self.replay.reserve(cut, record.group_id)
            self.replay.commit(
                cut,
                record.group_id,
                record.row_keys,
                target_step=record.target_step,
                min_weight_version=record.min_weight_version,
                max_weight_version=record.max_weight_version,
                metrics=record.metrics,
            )
            ledger.discard_group(cut, record.group_id)
        elif isinstance(record, StepTrained):
            if window is not None:
                # Training after a snapshot: its policy was lost, it runs again.
                if out is not None and self._window_of(entry.offset) is None:
                    out.rolled_back_steps.append(record.step)
                return True
            self.replay.claim(cut, record.step, record.group_ids)
            self.replay.clear(cut, record.group_ids)
        elif isinstance(record, Restored):
            ledger.prepare_for_restart(cut)
        return False


def _open_attempts(ledger: RolloutRecoveryLedger, entries: Sequence[JournalEntry]) -> set[str]:
    """Attempts in flight at the end of ``entries``, from the snapshot's ``ledger`` on.

    Followed over every record, whatever a restore will apply: a seal a policy discards
    was still sealed (its tokens are counted as discarded, not as interrupted).
    """
    open_ = {
        group.gate_rollout_id(sibling.generation_index)
        for group in ledger.groups()
        for sibling in group.siblings
        if sibling.current_attempt.status is RolloutAttemptStatus.DISPATCHED
    }
    for entry in entries:
        record = entry.record
        if isinstance(record, RoundStarted):
            open_.update(attempt.rollout_id for attempt in record.dispatched)
        elif isinstance(record, SiblingSealed | GroupSealed):
            open_.difference_update(seal.rollout_id for seal in _seals_of(record))
        elif isinstance(record, AttemptsAbandoned):
            open_.difference_update(attempt.rollout_id for attempt in record.attempts)
        elif isinstance(record, PromptDropped):
            prefix = f"{record.group_id}_g"
            open_ = {rollout_id for rollout_id in open_ if not rollout_id.startswith(prefix)}
    return open_


def _seals_of(record: SiblingSealed | GroupSealed) -> list[Seal]:
    return [record.seal] if isinstance(record, SiblingSealed) else list(record.seals)


def _discarded(record: SiblingSealed | GroupSealed) -> list[DiscardedSeal]:
    return [
        DiscardedSeal(
            group_id=record.group_id,
            generation_index=seal.generation_index,
            rollout_id=seal.rollout_id,
            tokens=seal.tokens,
            weight_versions=list(seal.weight_versions),
        )
        for seal in _seals_of(record)
    ]


def _kept(seal: Seal, reuse: ReusePolicy, lineage: set[int]) -> bool:
    """Whether a restore keeps a seal journaled after its snapshot."""
    if reuse is ReusePolicy.ALL:
        return True
    if reuse is ReusePolicy.NONE:
        return False
    return all(version in lineage for version in seal.weight_versions)
