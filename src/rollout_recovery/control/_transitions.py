"""One transition per history record: the only code that turns a record into state.

Every fact the journal holds is applied here, once, by one function per record type
(``Transitions._apply_<record>``), reached through one dispatcher (:meth:`Transitions.apply`)
that ends in ``assert_never``: a new record type is a mypy error until it has a case,
and an object that is no record fails at run time. The live controller and the journal
replay (a restore, the snapshot builder) call the same dispatcher, so they cannot drift
apart: the live run is a replay of the records it builds. (Temporal's workflow instance
applies each activation job the same way, live and in replay.)

What only the live run has is passed in as context, never through a second code path:

- ``prompt``: the dataset's prompt of a ``prompt_taken`` (a replay binds a placeholder that
  names it; the restore binds the dataset's afterwards and checks its identity);
- ``canonical_rows``: the rows a ``group_published`` puts (a replay touches no rows);
- ``rows``: the data plane staged rows are cleared from (a replay's is
  ``metadata_only_plane()``, whose clears do nothing);
- ``rolled_back``: a ``step_trained`` a restore undoes (only its weight version is kept).

The order, live. The controller builds the record first, minting any fresh id (attempt
uuids) so the record carries it; then, inside the barrier cut the record describes, it
*applies* the record and only then *appends* it to the journal; a seal is acknowledged
only after ``history.flush()`` made its line durable. So:

(a) the journal never holds a record its transition refuses: a refusal raises before the
    append;
(b) a refused record changes nothing: each transition checks everything it can before
    its first change (the ledger's and the replay index's own calls check first, too).
    A cut of several records (a reservation batch) is applied record by record and
    appended in one write, all or none: a refusal in the middle leaves the records before
    it applied in memory but journals none of them, and stops the run (the controller
    builds its records from its own state, so a refusal is a bug); the next start
    rebuilds the state from the journal, which never saw them;
(c) a seal is acknowledged only once durable, as before (``history.flush()``).

An append that fails (a full disk) stops the run the same way: memory is ahead of the
journal only in a process that is about to end.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, assert_never

from .._cut import MutationCut
from ..capture import CaptureWriter
from ..dataplane import DataPlane, ReplayIndex, Row
from ..errors import InvalidOperationError, InvalidTransitionError
from ..finalize import publish_finalized_group
from ..history import records
from ..ledger import (
    PromptGroupPhase,
    PromptGroupRecoveryRecord,
    PromptRef,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    SiblingSealResult,
)
from ..rollout import FailureReason
from ._state import ControllerState

__all__ = [
    "OUTSIDE_ANY_CUT",
    "Transitions",
    "admission_id_of",
    "attempt_uuid",
    "by_restart",
    "fresh_rollout_id",
    "placeholder_prompt",
]


def admission_id_of(batch: int) -> str:
    """The ledger's admission id of dataloader batch ``batch`` (one per reservation cut)."""
    return f"batch{batch:06d}"


def fresh_rollout_id(group_id: str, index: int) -> str:
    """A new attempt's rollout id, minted before its record is built: the ledger's form
    ``{group}_g{i}_a{uuid hex}``, which :func:`attempt_uuid` reads back."""
    return f"{group_id}_g{index}_a{uuid.uuid4().hex}"


def attempt_uuid(rollout_id: str, *, group_id: str, index: int) -> uuid.UUID:
    """The attempt id inside ``rollout_id``, which must be sibling ``index`` of
    ``group_id``'s: ``{group}_g{i}_a{uuid hex}``."""
    _, _, hex_id = rollout_id.rpartition("_a")
    try:
        parsed = uuid.UUID(hex=hex_id)
    except ValueError:
        parsed = None
    if parsed is None or rollout_id != f"{group_id}_g{index}_a{parsed.hex}":
        raise InvalidTransitionError(
            f"rollout id {rollout_id!r} does not name an attempt of sibling {index} of "
            f"group {group_id!r} ({group_id}_g{index}_a<32 hex digits>)",
            group_id=group_id,
        )
    return parsed


def placeholder_prompt(prompt_idx: int, task_name: str | None) -> dict[str, object]:
    """The prompt a replayed group carries until the dataset's is bound: just its identity
    (a replay needs no prompt; ``bind_runtime_prompt`` checks the real one against it)."""
    return {"idx": prompt_idx, "task_name": task_name}


def by_restart(record: records.AttemptsAbandoned) -> bool:
    """Whether ``record`` is a restore's: the attempts a crash interrupted, which the
    ``restored`` record before it already abandoned (``prepare_for_restart``)."""
    return bool(record.attempts) and all(
        attempt.reason is FailureReason.RESTART for attempt in record.attempts
    )


class _OutsideAnyCut:
    """The cut of a record appended outside every barrier section (``run_started``,
    ``checkpoint_committed``): refuses, naming the fix, if the record changes the ledger."""

    def require_live(self) -> None:
        raise InvalidOperationError(
            "this history record changes the ledger or the replay index: record it inside "
            "the barrier section it describes (record(..., cut=cut))"
        )


#: The cut of records that change neither the ledger nor the replay index.
OUTSIDE_ANY_CUT: MutationCut = _OutsideAnyCut()


def _sealed_staging_keys(group: PromptGroupRecoveryRecord) -> list[str]:
    """The staged rows a group's sealed current attempts own (a drop lets go of them)."""
    return [
        key
        for sibling in group.siblings
        if sibling.current_attempt.status is RolloutAttemptStatus.SEALED
        for key in sibling.current_attempt.staging_keys
    ]


@dataclass(slots=True)
class Transitions:
    """The ledger, the replay index, the rows and the controller state one history
    applies to: the live controller's own, or a replay's copies."""

    ledger: RolloutRecoveryLedger
    replay: ReplayIndex
    state: ControllerState
    #: Where staged rows are cleared and canonical rows put: the live store, or a replay's
    #: ``metadata_only_plane()``.
    rows: DataPlane

    def apply(
        self,
        cut: MutationCut,
        record: records.HistoryRecord,
        *,
        prompt: Mapping[str, Any] | None = None,
        canonical_rows: Mapping[str, Row] | None = None,
        rolled_back: bool = False,
    ) -> None:
        """Apply ``record`` to the ledger, the replay index and the rows, then fold it
        into the controller state. Raises (and changes nothing) if it does not apply."""
        match record:
            case records.PromptTaken():
                self._apply_prompt_taken(cut, record, prompt)
            case records.BatchAdmitted():
                self._apply_batch_admitted(cut, record)
            case records.RoundStarted():
                self._apply_round_started(cut, record)
            case records.SiblingSealed():
                self._apply_sibling_sealed(cut, record)
            case records.GroupSealed():
                self._apply_group_sealed(cut, record)
            case records.AttemptsAbandoned():
                self._apply_attempts_abandoned(cut, record)
            case records.PromptDropped():
                self._apply_prompt_dropped(cut, record)
            case records.GroupPublished():
                self._apply_group_published(cut, record, canonical_rows)
            case records.StepTrained():
                self._apply_step_trained(cut, record, rolled_back=rolled_back)
            case records.Restored():
                self._apply_restored(cut, record)
            case (
                records.RunStarted()
                | records.PromptAliased()
                | records.AttemptResumed()
                | records.CheckpointCommitted()
                | records.BackendEvent()
            ):
                # Nothing in the ledger or the replay index: what they say is read from
                # the journal (the audit) or counted by the state below.
                pass
            case _:
                assert_never(record)
        self.state.apply(record, rolled_back=rolled_back)

    # -- one function per record type ----------------------------------------------------

    def _apply_prompt_taken(
        self, cut: MutationCut, record: records.PromptTaken, prompt: Mapping[str, Any] | None
    ) -> None:
        self.ledger.reserve_group(
            cut,
            prompt_id=str(record.prompt_idx),
            prompt_payload=(
                placeholder_prompt(record.prompt_idx, record.task_name)
                if prompt is None
                else prompt
            ),
            prompt_ref=PromptRef(sample_id=str(record.prompt_idx), task_name=record.task_name),
            expected_generations=len(record.attempts),
            target_step=None,
            start_weight_version=record.weight_version,
            task_source=record.task_source,
            recovery_granularity=record.granularity,
            admitted=False,
            group_id=record.group_id,
            admission_id=admission_id_of(record.batch),
            attempt_uuids=[
                attempt_uuid(rollout_id, group_id=record.group_id, index=index)
                for index, rollout_id in enumerate(record.attempts)
            ],
        )

    def _apply_batch_admitted(self, cut: MutationCut, record: records.BatchAdmitted) -> None:
        # Every group first, so a refusal admits none of them.
        for group_id in record.group_ids:
            phase = self.ledger.get_group(group_id).phase
            if phase is not PromptGroupPhase.RESERVED:
                raise InvalidTransitionError(
                    f"batch {record.batch} admits group {group_id!r}, which is already "
                    f"{phase.value}",
                    group_id=group_id,
                )
        for group_id in record.group_ids:
            self.ledger.mark_group_admitted(
                cut,
                group_id,
                target_step=record.target_step,
                start_weight_version=record.weight_version,
            )

    def _apply_round_started(self, cut: MutationCut, record: records.RoundStarted) -> None:
        group = self.ledger.get_group(record.group_id)
        if group.phase is not PromptGroupPhase.ADMITTED:
            raise InvalidTransitionError(
                f"a round of group {record.group_id!r}, which was never admitted",
                group_id=record.group_id,
            )
        indices = [attempt.generation_index for attempt in record.dispatched]
        if len(set(indices)) != len(indices):
            raise InvalidTransitionError(
                f"a round of group {record.group_id!r} dispatches a sibling twice: {indices}",
                group_id=record.group_id,
            )
        renewed: dict[int, uuid.UUID] = {}
        for attempt in record.dispatched:
            index = attempt.generation_index
            if not 0 <= index < group.expected_generations:
                raise InvalidTransitionError(
                    f"a round of group {record.group_id!r} dispatches sibling {index}, which "
                    f"it does not have ({group.expected_generations} siblings)",
                    group_id=record.group_id,
                )
            current = group.siblings[index].current_attempt
            if group.gate_rollout_id(index) == attempt.rollout_id:
                if current.status is not RolloutAttemptStatus.RESERVED:
                    raise InvalidTransitionError(
                        f"a round of group {record.group_id!r} dispatches "
                        f"{attempt.rollout_id!r} again, which is {current.status.value}",
                        group_id=record.group_id,
                    )
            else:
                # A fresh attempt for a lost one: its id is the record's.
                renewed[index] = attempt_uuid(
                    attempt.rollout_id, group_id=record.group_id, index=index
                )
        # Refuses (changing nothing) unless ``renewed`` is exactly the lost siblings.
        self.ledger.prepare_incomplete_retry(cut, record.group_id, attempt_uuids=renewed)
        self.ledger.mark_group_dispatched(cut, record.group_id, generation_indices=indices)

    def _apply_sibling_sealed(self, cut: MutationCut, record: records.SiblingSealed) -> None:
        seal = record.seal
        self.ledger.mark_sibling_sealed(
            cut,
            record.group_id,
            generation_index=seal.generation_index,
            gate_rollout_id=seal.rollout_id,
            receipt=seal.receipt,
            reward=seal.reward,
            mask_sample=seal.mask_sample,
            reward_checks=seal.reward_checks,
        )

    def _apply_group_sealed(self, cut: MutationCut, record: records.GroupSealed) -> None:
        self.ledger.mark_group_sealed(
            cut,
            record.group_id,
            {
                seal.generation_index: SiblingSealResult(
                    gate_rollout_id=seal.rollout_id,
                    receipt=seal.receipt,
                    reward=seal.reward,
                    mask_sample=seal.mask_sample,
                    reward_checks=seal.reward_checks,
                )
                for seal in record.seals
            },
        )

    def _apply_attempts_abandoned(
        self, cut: MutationCut, record: records.AttemptsAbandoned
    ) -> None:
        if by_restart(record):
            return  # the ``restored`` record before it abandoned them (prepare_for_restart)
        self.ledger.abandon_unsealed(cut, record.group_id)

    def _apply_prompt_dropped(self, cut: MutationCut, record: records.PromptDropped) -> None:
        group = self.ledger.get_group(record.group_id)
        self.ledger.discard_group(cut, record.group_id)
        # Its seals' rows are nobody's now (deferred while a checkpoint may need them).
        self.rows.clear(CaptureWriter.staging_partition, _sealed_staging_keys(group), cut=cut)

    def _apply_group_published(
        self,
        cut: MutationCut,
        record: records.GroupPublished,
        canonical_rows: Mapping[str, Row] | None,
    ) -> None:
        # Checks everything first; from the put on, a failure is FINALIZATION_UNKNOWN.
        publish_finalized_group(
            self.ledger,
            cut,
            record,
            replay_index=self.replay,
            data_plane=self.rows,
            rows=canonical_rows,
        )

    def _apply_step_trained(
        self, cut: MutationCut, record: records.StepTrained, *, rolled_back: bool
    ) -> None:
        if rolled_back:
            return  # its policy was lost with the process: the step runs again
        # The live train step claimed its groups before training; a replay claims them
        # here. Either way each must be unclaimed or claimed by this very step.
        replay = self.replay
        unclaimed = _unclaimed(replay, record)
        replay.claim(cut, record.step, unclaimed)
        replay.clear(cut, record.group_ids)

    def _apply_restored(self, cut: MutationCut, record: records.Restored) -> None:
        # What a restart does to the attempts a crash interrupted. The live restore has
        # done it already (it needs the result for the record's numbers); doing it again
        # changes nothing.
        self.ledger.prepare_for_restart(cut)


def _unclaimed(replay: ReplayIndex, record: records.StepTrained) -> Sequence[str]:
    unclaimed: list[str] = []
    for group_id in record.group_ids:
        claimed = replay.group(group_id).claimed_step
        if claimed is None:
            unclaimed.append(group_id)
        elif claimed != record.step:
            raise InvalidTransitionError(
                f"step {record.step} trained group {group_id!r}, which step {claimed} claimed",
                group_id=group_id,
            )
    return unclaimed
