"""Checkpoints as snapshots of the journal, and restores that replay what came after.

:class:`ControllerCheckpoints` is the controller's collaborator for both. It is built by
the controller with exactly what it reads (the checkpoint store, the run config, the
ledger, the token store, the trainer, the audit trail, the barrier, the reward settings,
the dataset) and never reads or sets the controller: it returns what it did (a
:class:`CheckpointTiming`, a :class:`RestoredRun`) and the controller applies it (records
``checkpoint_committed``; takes the restored replay index and state and records
``restored`` and the restart's abandons).

Capture and commit. Under ``barrier.checkpoint()`` (every mutation drained) only the
journal's position is taken: O(1), whatever the size of the ledger or the bytes stored.
Then the trainer's state is copied to memory (the trainer is idle: the train pump awaits
the capture; ``_trainer_state.py``). That is all the step pays (:meth:`capture`). The
commit (:meth:`commit`) may run in the background while the next steps train: the
trainer's copy is encoded (``policy.npz`` from ``state()``, or a ``FileStateTrainer``'s
own files such as safetensors, each as ``trainer.<name>``), the journal is made durable
up to the position, the snapshot builder replays it to there and encodes the ledger, the
replay index and the controller state, and everything is published as ``step_NNNNNN``
with the journal position in its manifest. No token row is read or copied: rows a
checkpoint owns stay in the durable store until no retained checkpoint needs them
(``_deferred.py``).

Restore. Each committed checkpoint, newest first, is verified without changing anything:
checksums, every file decoded and validated, the job's identity, and the durable store
holding every row the checkpoint owns. The first that passes is loaded and the journal
after its position is replayed (DESIGN §4 step 8), all in one ``recovery_restore`` cut:
every seal acknowledged before the crash is back, training after the snapshot is rolled
back (the policy lives only in checkpoints), and new weight versions continue above the
highest ever journaled.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import numpy.typing as npt

from .._crashpoints import crash_point
from .._cut import MutationCut
from .._settings import config_to_builtins, identity_fingerprint
from ..capture import CaptureWriter, StagedPrefix
from ..checkpoint import SidecarFormat
from ..dataplane import DataPlaneCheckpointBarrier, ReplayIndex
from ..errors import (
    CheckpointDirectoryError,
    InvalidStateError,
    InvalidTransitionError,
    JobMismatchError,
    RolloutRecoveryError,
    RunNotResumableError,
    StagingInventoryError,
)
from ..history import AuditTrail, JournalScan
from ..history.records import AbandonedAttempt, AttemptsAbandoned, CheckpointCommitted, Restored
from ..ledger import (
    ParsedRolloutRecoveryState,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    parse_rollout_recovery_state,
)
from ..policy import FileStateTrainer, Trainer
from ..rewards import CaptureRewardSettings
from ..rollout import FailureReason
from ..rundir import CheckpointStore, LoadedCheckpoint, SkippedCheckpoint
from ._config import JobConfig, RecoveryConfig, RunConfig, config_differences, config_from_builtins
from ._deferred import DeferredDeletionDataPlane
from ._inventory import reconcile_staging
from ._replay import JournalReplay, bind_placeholder_prompts, metadata_only_plane, whole_cuts
from ._resume import choose_prefixes, version_filter
from ._snapshot import Snapshot, SnapshotBuilder
from ._state import ControllerState, decode_controller_state
from ._trainer_state import StagedTrainerState, stage_trainer_state

if TYPE_CHECKING:
    from ._controller import PromptDataset

__all__ = [
    "CapturedCheckpoint",
    "CheckpointFiles",
    "CheckpointTiming",
    "ControllerCheckpoints",
    "RestoredRun",
    "RowNeeds",
    "VerifiedCheckpoint",
    "decode_checkpoint_files",
    "restart_abandons",
]

CHECKPOINT_FILES = CheckpointStore.FILES
REPLAY_FILE = CHECKPOINT_FILES.replay_index
POLICY_FILE = CHECKPOINT_FILES.trainer_state
CONTROLLER_STATE_FILE = CHECKPOINT_FILES.controller_state


@dataclass(frozen=True, slots=True)
class CheckpointTiming:
    step: int
    #: The exclusive hold: from entering the checkpoint section to leaving it.
    hold_s: float
    #: What mutations felt: from asking for the section (drain included) to leaving it.
    stall_s: float
    #: Journal sync, snapshot, encoding and publication after the hold.
    write_s: float
    #: The journal position the checkpoint snapshots.
    position: int = 0
    #: Its directory's name (``step_NNNNNN``).
    name: str = ""
    #: What the step paid: from asking for the hold to the trainer's state in memory.
    captured_s: float = 0.0

    def committed(self) -> CheckpointCommitted:
        """The ``checkpoint_committed`` record of this checkpoint (the controller's to
        journal)."""
        return CheckpointCommitted(
            step=self.step,
            name=self.name,
            position=self.position,
            hold_us=int(self.hold_s * 1e6),
            stall_us=int(self.stall_s * 1e6),
        )


@dataclass(frozen=True, slots=True)
class CapturedCheckpoint:
    """A checkpoint as its step captured it (:meth:`ControllerCheckpoints.capture`), for
    :meth:`ControllerCheckpoints.commit` to write, maybe while the next steps train."""

    #: Its number for the deferred deletions (``rows.checkpoint_captured()``).
    number: int
    #: The journal position the snapshot is built at, and the history files' lengths.
    position: int
    marks: dict[str, int]
    #: The trainer's state at the capture, in memory.
    trainer: StagedTrainerState
    hold_s: float
    stall_s: float
    #: When the hold was released (``time.monotonic()``).
    released: float
    captured_s: float


class _AnyCut:
    """A cut for read-only dry runs on a throwaway ledger (verification)."""

    def require_live(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class VerifiedCheckpoint:
    """A committed checkpoint whose every file decoded and whose rows are all present."""

    step: int
    name: str
    parsed: ParsedRolloutRecoveryState
    replay_state: dict[str, Any]
    controller_state: ControllerState
    #: The trainer's state: ``policy.npz``'s arrays, or (empty then) its own files by the
    #: trainer's names (``model.safetensors``, ...).
    policy: dict[str, npt.NDArray[Any]]
    trainer_files: dict[str, bytes]
    #: The history files' lengths the checkpoint includes.
    marks: dict[str, int]
    #: Where the snapshot's history ends in the journal, and the journal after it.
    position: int
    scan: JournalScan
    #: Prompts the run has taken, the journal after the snapshot replayed (the cursor).
    prompts_taken: int = 0


@dataclass(frozen=True, slots=True)
class CheckpointFiles:
    """A checkpoint's sidecar, controller state and replay index, decoded and checked."""

    parsed: ParsedRolloutRecoveryState
    controller_state: ControllerState
    replay_state: dict[str, Any]


def decode_checkpoint_files(loaded: LoadedCheckpoint, *, trainer: bool = True) -> CheckpointFiles:
    """Decode what every reader of a checkpoint needs (the restore and the auditor);
    ``trainer=False`` for one loaded without the trainer's files (rows only).

    Raises ``CheckpointDirectoryError`` for a missing or doubled file and
    ``InvalidStateError`` for one that does not decode; changes nothing.
    """
    where = str(loaded.directory)
    names = [name for name in SidecarFormat.filenames() if name in loaded.files]
    if len(names) != 1:
        raise CheckpointDirectoryError(
            f"expected exactly one sidecar of {list(SidecarFormat.filenames())}, found {names}",
            directory=where,
        )
    for required in (REPLAY_FILE, CONTROLLER_STATE_FILE):
        if required not in loaded.files:
            raise CheckpointDirectoryError(f"missing {required}", directory=where)
    trainer_files = CHECKPOINT_FILES.trainer_files(loaded.files)
    if trainer and (POLICY_FILE in loaded.files) == bool(trainer_files):
        found = sorted(trainer_files) + ([POLICY_FILE] if POLICY_FILE in loaded.files else [])
        raise CheckpointDirectoryError(
            f"expected the trainer's state as {POLICY_FILE} or as "
            f"{CHECKPOINT_FILES.trainer_file('*')} files, found {found or 'neither'}",
            directory=where,
        )
    _, sidecar_state = SidecarFormat.decode(loaded.files[names[0]])
    parsed = parse_rollout_recovery_state(sidecar_state)
    state = decode_controller_state(loaded.files[CONTROLLER_STATE_FILE])
    try:
        replay_state = msgspec.msgpack.decode(loaded.files[REPLAY_FILE], type=dict[str, Any])
    except msgspec.DecodeError as error:
        raise InvalidStateError(f"{where}: unreadable {REPLAY_FILE}: {error}") from None
    return CheckpointFiles(parsed=parsed, controller_state=state, replay_state=replay_state)


@dataclass(frozen=True, slots=True)
class RowNeeds:
    """The data-plane rows a checkpoint and the journal after it need to be restored."""

    staging: frozenset[str] = frozenset()
    canonical: frozenset[str] = frozenset()

    def __or__(self, other: RowNeeds) -> RowNeeds:
        return RowNeeds(self.staging | other.staging, self.canonical | other.canonical)


@dataclass(frozen=True, slots=True)
class RestoredRun:
    """What :meth:`ControllerCheckpoints.restore` hands the controller to apply, in the
    restore's cut: the replay index and the state to run on (the ledger was restored in
    place), then the records to journal through their transitions, in this order."""

    replay: ReplayIndex
    state: ControllerState
    #: What the restore did: the ``restored`` record, which is also its report.
    record: Restored
    #: One ``attempts_abandoned`` (reason ``restart``) per group the crash interrupted.
    abandoned: list[AttemptsAbandoned] = field(default_factory=list)


@dataclass(kw_only=True, eq=False)
class ControllerCheckpoints:
    """One controller's checkpoints in one store: find the newest one that can be
    restored, restore it, follow the journal from there, take new ones.

    The controller builds it with what it reads (the fields up to ``dataset``) and calls
    it; it never touches the controller, and keeps what it did for the job's result: the
    newer checkpoints the search passed over and the timing of every checkpoint taken."""

    store: CheckpointStore
    #: The whole config: a checkpoint's identity is its fingerprint.
    config: RunConfig
    #: The controller's ledger, restored in place.
    ledger: RolloutRecoveryLedger
    #: The token store: rows checked before a commit, deferred deletions advanced after it,
    #: unowned rows deleted by a restore.
    rows: DeferredDeletionDataPlane
    trainer: Trainer[Any]
    #: The journal (position, marks, sync, a torn tail cut) and the metrics file.
    history: AuditTrail
    barrier: DataPlaneCheckpointBarrier
    #: The reward settings every checkpoint records and every restore must match.
    settings: CaptureRewardSettings
    #: The prompts a restore binds to its groups again.
    dataset: PromptDataset
    #: Follows the journal to build snapshots outside the hold (:meth:`follow_journal`).
    snapshots: SnapshotBuilder | None = field(default=None, init=False)
    #: The newer checkpoints :meth:`newest_restorable` passed over, with why.
    skipped: list[SkippedCheckpoint] = field(default_factory=list, init=False)
    #: Every checkpoint :meth:`take` committed, in order.
    timings: list[CheckpointTiming] = field(default_factory=list, init=False)
    # What the checkpoints older than the one found need, for its restore to keep.
    _older_needs: RowNeeds = field(default_factory=RowNeeds, init=False)

    @property
    def _journal(self) -> Path:
        return self.history.journal.path

    # ---------------------------------------------------------------------- capture

    def follow_journal(self, *, replay: ReplayIndex, state: ControllerState) -> None:
        """Start the snapshot builder at the journal's current end, from the ledger and
        the given replay index and state.

        Call once they are what the journal says up to there (a fresh start or a finished
        restore): from then on the builder follows the journal alone.
        """
        self.snapshots = SnapshotBuilder(
            journal=self._journal,
            position=self.history.position,
            ledger=self.ledger,
            replay=replay,
            state=state,
            group_size=self.config.job.generations_per_prompt,
        )

    async def take(self, *, delete_deferred: bool = True) -> CheckpointTiming:
        """:meth:`capture` then :meth:`commit`: the whole checkpoint, awaited."""
        return await self.commit(await self.capture(), delete_deferred=delete_deferred)

    async def capture(self) -> CapturedCheckpoint:
        """The part of a checkpoint its step pays: the journal's position (and the history
        marks) in the exclusive hold, then the trainer's state copied to memory. Call with
        the trainer idle (the train pump awaits this); :meth:`commit` does the rest, which
        may run while the trainer trains on. At most one captured checkpoint may wait for
        its commit (the caller awaits the previous commit first): the deferred deletions
        count checkpoints in the order they commit."""
        if self.snapshots is None:
            raise InvalidStateError("a checkpoint before follow_journal: no snapshot builder")
        history, rows = self.history, self.rows
        requested = time.monotonic()
        async with self.barrier.checkpoint(timeout=self.config.checkpoint.barrier_timeout_s):
            entered = time.monotonic()
            # The whole exclusive hold: a position in the journal (and the metrics sink).
            position = history.position
            marks = history.marks()
            number = rows.checkpoint_captured()
            crash_point("snapshot.in_hold")
            released = time.monotonic()
        trainer = await stage_trainer_state(self.trainer)
        return CapturedCheckpoint(
            number=number,
            position=position,
            marks=marks,
            trainer=trainer,
            hold_s=released - entered,
            stall_s=released - requested,
            released=released,
            captured_s=time.monotonic() - requested,
        )

    async def commit(
        self, captured: CapturedCheckpoint, *, delete_deferred: bool = True
    ) -> CheckpointTiming:
        """Write ``captured`` and publish it as ``step_NNNNNN``: encode the trainer's
        state, build the snapshot of the journal at its position, write, fsync, publish,
        then let the deferred deletions advance. The caller journals its
        ``checkpoint_committed`` (:meth:`CheckpointTiming.committed`).

        Safe while the run goes on (later steps trained and journaled): everything is
        read from the capture, the journal up to its position and the rows it owns, which
        no deletion can reach before the next checkpoint commits (``_deferred.py``). A
        crash before the publication leaves the previous checkpoint the newest.

        ``delete_deferred=False`` (a drain's last checkpoint) deletes no rows on commit: the
        deferred deletions count checkpoints, and this one may replace a checkpoint of the
        same step, leaving one more older checkpoint retained than counted. The process ends
        after it; the next restore deletes what the newest checkpoint does not own.
        """
        crash_point("checkpoint.captured")
        config, history, builder = self.config, self.history, self.snapshots
        assert builder is not None  # capture() checked
        position = captured.position
        trainer_files = await asyncio.to_thread(captured.trainer.encode)
        await history.flush()  # the snapshot's history is durable
        settings = self.settings
        identity = identity_fingerprint(config)

        def build() -> Snapshot:
            builder.advance_to(position)
            return builder.snapshot(
                sidecar_format=config.checkpoint.format,
                settings=settings,
                config=config_to_builtins(config),
                identity=identity,
            )

        snapshot = await asyncio.to_thread(build)
        # The trainer's version at the capture: the live one may have trained on since.
        if snapshot.weight_version != captured.trainer.weight_version:
            raise InvalidStateError(
                f"the snapshot at journal position {position} is at weight version "
                f"{snapshot.weight_version} but the trainer held "
                f"{captured.trainer.weight_version} when it was captured"
            )
        # The rows this checkpoint owns cannot be deleted before a later checkpoint commits,
        # so checking them now is as good as under the hold.
        self._require_rows(snapshot.expected_staging, snapshot.canonical_keys)
        crash_point("snapshot.before_write")
        files = {
            snapshot.sidecar_name: snapshot.sidecar,
            REPLAY_FILE: snapshot.replay_state,
            CONTROLLER_STATE_FILE: snapshot.controller_state,
            **trainer_files,
        }
        await asyncio.to_thread(history.sync)
        saved = await asyncio.to_thread(self.store.save, snapshot.step, files, marks=captured.marks)
        if delete_deferred:
            self.rows.checkpoint_committed(captured.number)
        timing = CheckpointTiming(
            step=snapshot.step,
            hold_s=captured.hold_s,
            stall_s=captured.stall_s,
            write_s=time.monotonic() - captured.released,
            position=position,
            name=saved.name,
            captured_s=captured.captured_s,
        )
        self.timings.append(timing)
        return timing

    def _require_rows(
        self, expected_staging: Iterable[str], canonical_keys: frozenset[str]
    ) -> None:
        store = self.rows
        missing_staging = set(expected_staging) - set(store.keys(CaptureWriter.staging_partition))
        missing_canonical = canonical_keys - set(store.keys(ReplayIndex.canonical_partition))
        if missing_staging or missing_canonical:
            raise CheckpointDirectoryError(
                "refusing to publish a checkpoint whose rows are not in the data plane: "
                f"staging {sorted(missing_staging)[:10]} canonical {sorted(missing_canonical)[:10]}"
            )

    # ----------------------------------------------------------------- verification

    def newest_restorable(self) -> VerifiedCheckpoint | None:
        """The newest committed checkpoint that verifies (see :meth:`verify`), the newer
        ones skipped kept in ``skipped``; None when the store holds none. Changes nothing on
        disk; a ``CheckpointDirectoryError`` when checkpoints exist but none verifies. The
        job checks the history against every checkpoint first
        (``AuditTrail.require_synced_history``)."""
        found = self.store.newest_loadable(self.verify)
        if found is None:
            return None
        _, verified, self.skipped = found
        self._older_needs = self._rows_older_checkpoints_need(verified)
        return verified

    def verify(self, loaded: LoadedCheckpoint) -> VerifiedCheckpoint:
        """Decode and check everything a restore will use; change nothing on disk.

        Raises ``InvalidStateError`` / ``CheckpointDirectoryError`` for a damaged checkpoint
        (the caller falls back to an older one) and ``JobMismatchError`` for another job's,
        or one written under other reward settings than the run's. Its last check loads the
        trainer's state into the trainer (a refused load changes nothing), which a restore
        then uses: call it before the trainer trains.
        """
        config, trainer = self.config, self.trainer
        where = str(loaded.directory)
        files = decode_checkpoint_files(loaded)
        parsed, state, replay_state = files.parsed, files.controller_state, files.replay_state
        if state.identity != identity_fingerprint(config):
            differences = config_differences(
                config_from_builtins(state.config), config, which="identity"
            )
            raise JobMismatchError(
                f"{where} belongs to another job: "
                + ("; ".join(differences) or "its identity fingerprint differs"),
                differences=differences,
            )
        if parsed.reward_settings is not None:
            parsed.reward_settings.require_compatible(self.settings, checkpoint=where)
        policy: dict[str, npt.NDArray[Any]] = {}
        trainer_files = {
            own: loaded.files[name]
            for name, own in CHECKPOINT_FILES.trainer_files(loaded.files).items()
        }
        if not trainer_files:
            try:
                with np.load(io.BytesIO(loaded.files[POLICY_FILE]), allow_pickle=False) as npz:
                    policy = {name: npz[name] for name in npz.files}
            except (ValueError, OSError) as error:
                raise InvalidStateError(f"{where}: unreadable {POLICY_FILE}: {error}") from None
        elif not isinstance(trainer, FileStateTrainer):
            raise InvalidStateError(
                f"{where} holds the trainer's state as files ({sorted(trainer_files)}), which "
                f"this job's trainer ({type(trainer).__name__}) cannot load"
            )
        # The journal after the snapshot, read and verified (nothing is cut here).
        journal = self._journal
        position = loaded.marks.get(journal.name)
        if position is None:
            raise CheckpointDirectoryError(
                f"records no journal position for {journal.name}", directory=where
            )
        scan = self._journal_after(position)
        needs, replayed = self._rows_needed(files, scan, position=position)
        store = self.rows
        missing_staging = needs.staging - set(store.keys(CaptureWriter.staging_partition))
        missing_canonical = needs.canonical - set(store.keys(ReplayIndex.canonical_partition))
        if missing_staging or missing_canonical:
            raise CheckpointDirectoryError(
                "the data plane lacks rows this checkpoint and the journal after it need: "
                f"staging {sorted(missing_staging)[:10]} (total={len(missing_staging)}), "
                f"canonical {sorted(missing_canonical)[:10]} (total={len(missing_canonical)})",
                directory=where,
            )
        # Last, the trainer's state. Loading it is its check (a refused load changes nothing):
        # a state the trainer refuses (an edited RNG word, a version past int64) skips this
        # checkpoint for the previous one like any other damage. The job's trainer has not
        # trained yet, so it then holds this checkpoint's state for the restore (a later
        # candidate's load replaces it whole).
        _load_trainer_state(trainer, policy, trainer_files)
        if trainer.weight_version != state.weight_version:
            raise InvalidStateError(
                f"{where}: {CONTROLLER_STATE_FILE} is at weight version {state.weight_version} "
                f"but the trainer's state is at {trainer.weight_version}"
            )
        return VerifiedCheckpoint(
            step=state.step,
            name=loaded.directory.name,
            parsed=parsed,
            replay_state=replay_state,
            controller_state=state,
            policy=policy,
            trainer_files=trainer_files,
            marks=dict(loaded.marks),
            position=position,
            scan=scan,
            prompts_taken=replayed.prompts_taken,
        )

    def _journal_after(self, position: int) -> JournalScan:
        """The journal after ``position``, verified, a reservation batch cut short at its
        end counted with the torn tail (nothing is cut here)."""
        journal = self._journal
        scan = JournalScan.read(journal, start=position)
        entries, torn_cut = whole_cuts(
            scan.entries, batch_size=self.config.job.prompts_per_step, journal=journal
        )
        if torn_cut is None:
            return scan
        return JournalScan(
            entries=entries,
            end=torn_cut,
            torn_bytes=scan.end + scan.torn_bytes - torn_cut,
            torn_reason="a reservation batch cut short at the end of the journal",
        )

    def _rows_needed(
        self, files: CheckpointFiles, scan: JournalScan, *, position: int
    ) -> tuple[RowNeeds, ControllerState]:
        """The rows a restore of this checkpoint needs at the end of its replay (not the
        snapshot's own: the journal may have published or dropped since), and the state
        the replay ends in: a dry run of the restore on throwaway copies. Raises
        ``ReplayError`` for a journal that does not apply."""
        config = self.config
        scratch = RolloutRecoveryLedger.from_state_dict(files.parsed.ledger_state)
        bind_placeholder_prompts(_AnyCut(), scratch)
        replay = ReplayIndex.from_state_dict(
            files.replay_state,
            data_plane=metadata_only_plane(),
            group_size=config.job.generations_per_prompt,
            check_rows=False,
        )
        state = msgspec.msgpack.decode(
            msgspec.msgpack.encode(files.controller_state), type=ControllerState
        )
        JournalReplay(ledger=scratch, replay=replay, state=state, journal=self._journal).restore(
            _AnyCut(), scan.entries, snapshot_position=position, reuse=config.recovery.reuse
        )
        scratch.prepare_for_restart(_AnyCut())
        needs = RowNeeds(frozenset(scratch.expected_staging_keys()), frozenset(replay.row_keys()))
        return needs, state

    def _rows_older_checkpoints_need(self, restored: VerifiedCheckpoint) -> RowNeeds:
        """The rows every committed checkpoint older than ``restored`` would need if it
        were restored now: what ``restored``'s restore must keep, so that falling back to
        one of them stays possible until they leave retention. A checkpoint that could not
        be restored anyway (damaged, another job's, a journal that does not apply) needs
        nothing. Reads their sidecars, controller states and replay indexes, not the
        trainers' files."""
        identity = identity_fingerprint(self.config)
        needs = RowNeeds()
        for committed in self.store.committed():
            if committed.step >= restored.step:
                continue
            try:
                loaded = self.store.load(committed, skip=_is_trainer_file)
                files = decode_checkpoint_files(loaded, trainer=False)
                position = loaded.marks.get(self._journal.name)
                if files.controller_state.identity != identity or position is None:
                    continue
                scan = self._journal_after(position)
                needs |= self._rows_needed(files, scan, position=position)[0]
            except (RolloutRecoveryError, ValueError, OSError):
                continue
        return needs

    # ---------------------------------------------------------------------- restore

    @contextlib.contextmanager
    def refusing(self, verified: VerifiedCheckpoint) -> Iterator[None]:
        """Around a restore of ``verified``: a refusal from it is a ``RunNotResumableError``
        naming the checkpoint.

        Whatever can make a checkpoint unusable is checked by its verification, so the
        search skips it for the previous one. A refusal from the restore itself (it has
        begun changing the store and the journal, so it cannot fall back in process) is
        final: the same start would refuse it again. Transient failures (a full disk) stay
        what they are: a rerun resumes."""
        try:
            yield
        except (
            CheckpointDirectoryError,
            InvalidStateError,
            InvalidTransitionError,
            StagingInventoryError,
        ) as error:
            raise RunNotResumableError(
                f"checkpoint {verified.name} passed its verification but its restore was "
                f"refused: {type(error).__name__}: {error}",
                remedy=f"Move {self.store.directory / verified.name} out of "
                f"{self.store.directory} to resume from the previous checkpoint, or start a "
                "new run in another directory.",
            ) from error

    def restore(self, cut: MutationCut, verified: VerifiedCheckpoint) -> RestoredRun:
        """Restore ``verified`` into the ledger and replay the journal after it, in DESIGN
        §4 step 8's order, inside the caller's ``recovery_restore`` cut; the caller applies
        the :class:`RestoredRun` in the same cut.

        Rows ``verified`` does not own are deleted, but those the older retained
        checkpoints need (found by :meth:`newest_restorable`), whose deletion is deferred
        until they have left retention."""
        config, ledger, store, history = self.config, self.ledger, self.rows, self.history
        retained = self._older_needs
        journal = self._journal
        position, scan = verified.position, verified.scan
        if scan.torn_bytes:
            scan.cut_torn_tail(journal)
            history.journal.truncate(scan.end)
        state = verified.controller_state
        reuse = config.recovery.reuse
        group_size = config.job.generations_per_prompt
        ledger.load_state_dict(cut, verified.parsed.ledger_state)
        replay = ReplayIndex.from_state_dict(
            verified.replay_state,
            data_plane=metadata_only_plane(),
            check_rows=False,
            group_size=group_size,
        )
        replayer = JournalReplay(ledger=ledger, replay=replay, state=state, journal=journal)
        outcome = replayer.restore(cut, scan.entries, snapshot_position=position, reuse=reuse)
        _require_survivable_shortfall(config.job, state, verified.name)
        interrupted = _dispatched_attempts(ledger)
        ledger.prepare_for_restart(cut)
        ledger.discard_canonical_groups(cut, replay.group_ids())
        owned_rows = set(replay.row_keys())
        # Canonical rows whose publish never reached the journal: their groups are in the
        # ledger, to be published again.
        unowned = sorted(set(store.keys(ReplayIndex.canonical_partition)) - owned_rows)
        store.clear_unowned(
            ReplayIndex.canonical_partition, unowned, retained=retained.canonical, cut=cut
        )
        # The partition may hold more than the index owns (rows an older retained
        # checkpoint needs, deferred), never less.
        live_replay = ReplayIndex.from_state_dict(
            replay.state_dict(), data_plane=store, group_size=group_size, check_rows=False
        )
        lacking = set(live_replay.row_keys()) - set(store.keys(ReplayIndex.canonical_partition))
        if lacking:  # verify found them: only a store changed under us
            raise InvalidStateError(
                f"{verified.name}: the data plane lacks canonical rows the replayed index "
                f"owns: {sorted(lacking)[:10]} (total={len(lacking)})"
            )
        canonical_tokens = sum(
            int(row.token_mask.sum())
            for row in store.get(ReplayIndex.canonical_partition, live_replay.row_keys())
        )
        crash_point("restore.mid")
        resumable, refused = _resumable_calls(config.recovery, ledger, store.inner, state)
        keep = {key for prefix in resumable for key in prefix.staging_keys}
        in_flight_tokens, cohort_tokens = _interrupted_tokens(
            ledger, store.inner, interrupted, keep
        )
        # Every row the restored state owns is there (or StagingInventoryError); what it
        # does not own goes at once, unless an older retained checkpoint needs it.
        cleared = reconcile_staging(
            ledger,
            store.inner,
            cut,
            partition=CaptureWriter.staging_partition,
            clear_unreferenced=False,
            keep=keep,
        )
        store.clear_unowned(
            CaptureWriter.staging_partition, cleared, retained=retained.staging, cut=cut
        )
        for group in ledger.groups():
            ledger.bind_runtime_prompt(cut, group.group_id, self.dataset[int(group.prompt_id)])
        if self.trainer.weight_version != state.weight_version:
            # verify loaded the trainer's state; nothing trained since.
            raise InvalidStateError(
                f"{verified.name}: the trainer is at weight version "
                f"{self.trainer.weight_version}, not the checkpoint's "
                f"{state.weight_version}: restore only what verify just verified"
            )
        history.truncate_metrics(verified.marks.get(history.metrics_path.name, 0))
        # The record says what this restore did; a later replay that crosses it repeats
        # exactly that (prepare_for_restart, the rollback, the discards).
        record = msgspec.structs.replace(
            outcome.restored(
                checkpoint=verified.name,
                position=position,
                reuse=reuse,
                ledger=ledger,
                replay=live_replay,
                state=state,
            ),
            torn_tail_bytes=scan.torn_bytes,
            tokens_reused=_sealed_tokens(ledger, store.inner),
            canonical_tokens_kept=canonical_tokens,
            tokens_in_flight_lost=in_flight_tokens,
            cohort_tokens_in_flight_lost=cohort_tokens,
            calls_resumable=sum(len(prefix.calls) for prefix in resumable),
            tokens_resumable=sum(prefix.tokens for prefix in resumable),
            resume_refused=list(refused),
        )
        abandoned = restart_abandons(ledger, interrupted)
        return RestoredRun(replay=live_replay, state=state, record=record, abandoned=abandoned)


def _is_trainer_file(name: str) -> bool:
    return name == POLICY_FILE or bool(CHECKPOINT_FILES.trainer_files([name]))


def _load_trainer_state(
    trainer: Trainer[Any],
    policy: Mapping[str, npt.NDArray[Any]],
    trainer_files: Mapping[str, bytes],
) -> None:
    if trainer_files:
        # verify refused files this trainer cannot load.
        assert isinstance(trainer, FileStateTrainer)
        trainer.load_state_files(trainer_files)
    else:
        trainer.load_state(policy)


def _sealed_tokens(ledger: RolloutRecoveryLedger, store: Any) -> int:
    """Generated tokens of the siblings the ledger holds sealed (what the restore reused)."""
    keys = sorted(ledger.expected_staging_keys())
    rows = store.get(CaptureWriter.staging_partition, keys) if keys else []
    return sum(int(row.token_mask.sum()) for row in rows)


def _resumable_calls(
    recovery: RecoveryConfig, ledger: RolloutRecoveryLedger, store: Any, state: ControllerState
) -> tuple[list[StagedPrefix], list[str]]:
    """The staged calls of lost attempts the restore keeps for their siblings' next
    attempts (call-level resume; the reuse policy applied by the weights the restore
    lost), and what it refused. Runs after ``prepare_for_restart``: every unsealed
    sibling's current attempt is a lost one."""
    if recovery.resume != "call":
        return [], []
    keeps = version_filter(recovery.reuse, lineage=state.lineage, restore=True)
    keys = sorted(store.keys(CaptureWriter.staging_partition))
    prefixes: list[StagedPrefix] = []
    refused: list[str] = []
    for group in ledger.groups():
        if group.status is not PromptGroupStatus.GENERATING:
            continue
        unsealed = [
            sibling.generation_index
            for sibling in group.siblings
            if sibling.current_attempt.status is not RolloutAttemptStatus.SEALED
        ]
        choices = choose_prefixes(
            group, unsealed, store, keeps=keeps, include_current=True, sorted_keys=keys
        )
        for choice in choices.values():
            refused.extend(choice.refused)
            if choice.prefix is not None:
                prefixes.append(choice.prefix)
    return prefixes, refused


def _interrupted_tokens(
    ledger: RolloutRecoveryLedger,
    store: Any,
    interrupted: Mapping[str, list[tuple[int, str]]],
    keep: set[str],
) -> tuple[int, int]:
    """Generated tokens the crash costs: those staged by the attempts it interrupted that
    no seal names and the restore does not keep for resumption; and the part of them of
    prompt-group cohorts.

    A row whose call survives in a kept row (an interrupted attempt that was still
    copying an earlier attempt's calls when the kill came) costs nothing: the same tokens
    (the same cumulative hash) are continued.
    """
    lost = {rollout_id for entries in interrupted.values() for _, rollout_id in entries}
    cohorts = {
        rollout_id
        for group_id, entries in interrupted.items()
        if ledger.get_group(group_id).recovery_granularity is RecoveryGranularity.PROMPT_GROUP
        for _, rollout_id in entries
    }
    orphans = sorted(
        key
        for key in set(store.keys(CaptureWriter.staging_partition))
        - ledger.expected_staging_keys()
        - keep
        if key.partition("/")[0] in lost
    )
    if not orphans:
        return 0, 0

    def call_of(key: str, row: Any) -> tuple[str, object]:
        # The sibling ({group}_g{i} of {group}_g{i}_a{attempt}) and the call's content.
        return key.partition("/")[0].rpartition("_a")[0], row.metadata.get("cumulative_hash")

    ordered = sorted(keep)
    kept = store.get(CaptureWriter.staging_partition, ordered) if ordered else []
    continued = {call_of(key, row) for key, row in zip(ordered, kept, strict=True)}
    total = in_cohorts = 0
    for key, row in zip(orphans, store.get(CaptureWriter.staging_partition, orphans), strict=True):
        if call_of(key, row) in continued:
            continue
        tokens = int(row.token_mask.sum())
        total += tokens
        if key.partition("/")[0] in cohorts:
            in_cohorts += tokens
    return total, in_cohorts


def _require_survivable_shortfall(job: JobConfig, state: ControllerState, name: str) -> None:
    """Refuse a checkpoint whose drops leave a step below its minimum: it can never train.

    Such a checkpoint is written only by an older version (drops are refused before they
    make a step unsurvivable); the message says what would let the run continue.
    """
    minimum = math.ceil(job.min_step_fraction * job.prompts_per_step)
    for step, dropped in sorted(state.shortfall.items()):
        available = job.prompts_per_step - dropped
        if available < minimum:
            raise RunNotResumableError(
                f"checkpoint {name} has step {step} with {dropped} of its "
                f"{job.prompts_per_step} prompts dropped, fewer than the {minimum} a step "
                "needs",
                remedy=(
                    "Lowering job.min_step_fraction (an operational setting) to "
                    f"{available / job.prompts_per_step:g} or less lets it continue."
                ),
            )


def _dispatched_attempts(ledger: RolloutRecoveryLedger) -> dict[str, list[tuple[int, str]]]:
    """Attempts a crash interrupted: DISPATCHED in the checkpoint, abandoned by the restart."""
    found: dict[str, list[tuple[int, str]]] = {}
    for group in ledger.groups():
        if group.status is not PromptGroupStatus.GENERATING:
            continue
        for sibling in group.siblings:
            if sibling.current_attempt.status is RolloutAttemptStatus.DISPATCHED:
                found.setdefault(group.group_id, []).append(
                    (sibling.generation_index, group.gate_rollout_id(sibling.generation_index))
                )
    return found


def restart_abandons(
    ledger: RolloutRecoveryLedger, interrupted: Mapping[str, list[tuple[int, str]]]
) -> list[AttemptsAbandoned]:
    """The ``attempts_abandoned`` (reason ``restart``) of the attempts a crash interrupted
    (:func:`_dispatched_attempts`), one per group: the controller's restore and the
    recorder's opening journal the same fact, so both build it here (a cohort group's
    abandon says ``whole_group``, which the auditor checks)."""
    return [
        AttemptsAbandoned(
            group_id=group_id,
            attempts=[
                AbandonedAttempt(index, rollout_id, FailureReason.RESTART)
                for index, rollout_id in entries
            ],
            whole_group=ledger.get_group(group_id).recovery_granularity
            is RecoveryGranularity.PROMPT_GROUP,
        )
        for group_id, entries in interrupted.items()
    ]
