"""Checkpoints as snapshots of the journal, and restores that replay what came after.

Capture. Under ``barrier.checkpoint()`` (every mutation drained) only the journal's
position is taken: O(1), whatever the size of the ledger or the bytes stored. Then, with
generation going on: the journal is made durable up to that position, the snapshot
builder replays it to there and encodes the ledger, the replay index and the controller
state, the trainer's state is copied (the trainer is idle: the train pump awaits its own
checkpoints; ``policy.npz`` from ``state()``, or a ``FileStateTrainer``'s own files such
as safetensors, each as ``trainer.<name>``), and everything is published as
``step_NNNNNN`` with the journal position in its manifest. No token row is read or
copied: rows a checkpoint owns stay in the durable store until no retained checkpoint
needs them (``_deferred.py``).

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
import io
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from .._crashpoints import crash_point
from .._settings import config_to_builtins, identity_fingerprint
from ..capture import CaptureWriter, StagedPrefix
from ..checkpoint import SidecarFormat
from ..dataplane import ReplayIndex
from ..errors import (
    CheckpointDirectoryError,
    InvalidStateError,
    InvalidTransitionError,
    JobMismatchError,
    RolloutRecoveryError,
    RunNotResumableError,
    StagingInventoryError,
)
from ..history import JournalScan
from ..history.records import AbandonedAttempt, AttemptsAbandoned, CheckpointCommitted, Restored
from ..ledger import (
    ParsedRolloutRecoveryState,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    parse_rollout_recovery_state,
)
from ..policy import FileStateTrainer
from ..rollout import FailureReason
from ..rundir import CheckpointStore, LoadedCheckpoint, SkippedCheckpoint
from ._config import RunConfig, config_differences, config_from_builtins
from ._controller import Controller
from ._inventory import reconcile_staging
from ._replay import JournalReplay, bind_placeholder_prompts, metadata_only_plane, whole_cuts
from ._resume import choose_prefixes, version_filter
from ._snapshot import Snapshot, SnapshotBuilder
from ._state import ControllerState, decode_controller_state

__all__ = [
    "CheckpointFiles",
    "CheckpointTiming",
    "ControllerCheckpoints",
    "RestoreReport",
    "RowNeeds",
    "VerifiedCheckpoint",
    "decode_checkpoint_files",
    "follow_journal",
    "restore_controller",
    "rows_older_checkpoints_need",
    "take_checkpoint",
    "verify_checkpoint",
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


class _AnyCut:
    """A cut for read-only dry runs on a throwaway ledger (verification)."""

    def require_live(self) -> None:
        return None


def follow_journal(controller: Controller[Any]) -> None:
    """Start the controller's snapshot builder at the journal's current end.

    Call once the controller's state is what the journal says up to there (a fresh start
    or a finished restore): from then on the builder follows the journal alone.
    """
    controller.snapshots = SnapshotBuilder(
        journal=controller.history.journal.path,
        position=controller.history.position,
        ledger=controller.ledger,
        replay=controller.replay,
        state=controller.state,
        group_size=controller.config.job.generations_per_prompt,
    )


async def take_checkpoint(
    controller: Controller[Any], store: CheckpointStore, *, delete_deferred: bool = True
) -> CheckpointTiming:
    """Snapshot the journal at its current position and publish it as ``step_NNNNNN``.

    ``delete_deferred=False`` (a drain's last checkpoint) deletes no rows on commit: the
    deferred deletions count checkpoints, and this one may replace a checkpoint of the
    same step, leaving one more older checkpoint retained than counted. The process ends
    after it; the next restore deletes what the newest checkpoint does not own.
    """
    config = controller.config
    builder = controller.snapshots
    if builder is None:
        raise InvalidStateError("take_checkpoint before follow_journal: no snapshot builder")
    requested = time.monotonic()
    async with controller.barrier.checkpoint(timeout=config.checkpoint.barrier_timeout_s):
        entered = time.monotonic()
        # The whole exclusive hold: a position in the journal (and the metrics sink).
        position = controller.history.position
        marks = controller.history.marks()
        number = controller.data_plane.checkpoint_captured()
        crash_point("snapshot.in_hold")
        released = time.monotonic()
    hold, stall = released - entered, released - requested
    # The trainer is idle (the train pump awaits this), so its state is the snapshot's.
    trainer_files = await _trainer_state_files(controller)
    await controller.history.flush()  # the snapshot's history is durable
    settings = controller.settings
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
    if snapshot.weight_version != controller.trainer.weight_version:
        raise InvalidStateError(
            f"the snapshot at journal position {position} is at weight version "
            f"{snapshot.weight_version} but the trainer holds {controller.trainer.weight_version}"
        )
    # The rows this checkpoint owns cannot be deleted before a later checkpoint commits,
    # so checking them now is as good as under the hold.
    _require_rows(controller, snapshot.expected_staging, snapshot.canonical_keys)
    crash_point("snapshot.before_write")
    files = {
        snapshot.sidecar_name: snapshot.sidecar,
        REPLAY_FILE: snapshot.replay_state,
        CONTROLLER_STATE_FILE: snapshot.controller_state,
        **trainer_files,
    }
    await asyncio.to_thread(controller.history.sync)
    saved = await asyncio.to_thread(store.save, snapshot.step, files, marks=marks)
    if delete_deferred:
        controller.data_plane.checkpoint_committed(number)
    controller.record(
        CheckpointCommitted(
            step=snapshot.step,
            name=saved.name,
            position=position,
            hold_us=int(hold * 1e6),
            stall_us=int(stall * 1e6),
        )
    )
    if controller.metrics is not None:
        controller.metrics.log_marker(
            snapshot.step, "checkpoint_committed", {"name": saved.name, "hold_us": int(hold * 1e6)}
        )
        await asyncio.to_thread(controller.metrics.flush)
    return CheckpointTiming(
        step=snapshot.step,
        hold_s=hold,
        stall_s=stall,
        write_s=time.monotonic() - released,
        position=position,
        name=saved.name,
    )


def _require_rows(
    controller: Controller[Any], expected_staging: frozenset[str], canonical_keys: frozenset[str]
) -> None:
    store = controller.data_plane
    missing_staging = expected_staging - set(store.keys(CaptureWriter.staging_partition))
    missing_canonical = canonical_keys - set(store.keys(ReplayIndex.canonical_partition))
    if missing_staging or missing_canonical:
        raise CheckpointDirectoryError(
            "refusing to publish a checkpoint whose rows are not in the data plane: "
            f"staging {sorted(missing_staging)[:10]} canonical {sorted(missing_canonical)[:10]}"
        )


async def _trainer_state_files(controller: Controller[Any]) -> dict[str, bytes]:
    """The trainer's state as checkpoint files: its own files (safetensors, JSON) under
    ``trainer.``, or its arrays as ``policy.npz``."""
    trainer = controller.trainer
    if isinstance(trainer, FileStateTrainer):
        # Serializing a real model's weights and moments takes a while: off the loop.
        own = await asyncio.to_thread(trainer.state_files)
        return {CHECKPOINT_FILES.trainer_file(name): bytes(data) for name, data in own.items()}
    arrays = {name: np.array(value, copy=True) for name, value in trainer.state().items()}
    return {POLICY_FILE: _npz_bytes(arrays)}


def _npz_bytes(arrays: Mapping[str, npt.NDArray[Any]]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


# ---------------------------------------------------------------------------- restore


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


def verify_checkpoint(
    loaded: LoadedCheckpoint, *, config: RunConfig, controller: Controller[Any]
) -> VerifiedCheckpoint:
    """Decode and check everything a restore will use; change nothing on disk.

    Raises ``InvalidStateError`` / ``CheckpointDirectoryError`` for a damaged checkpoint
    (the caller falls back to an older one) and ``JobMismatchError`` for another job's,
    or one written under other reward settings than the controller's. Its last check
    loads the trainer's state into ``controller.trainer`` (a refused load changes
    nothing), which a restore then uses: call it before the trainer trains.
    """
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
        parsed.reward_settings.require_compatible(controller.settings, checkpoint=where)
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
    elif not isinstance(controller.trainer, FileStateTrainer):
        raise InvalidStateError(
            f"{where} holds the trainer's state as files ({sorted(trainer_files)}), which "
            f"this job's trainer ({type(controller.trainer).__name__}) cannot load"
        )
    # The journal after the snapshot, read and verified (nothing is cut here).
    journal = controller.history.journal.path
    position = loaded.marks.get(journal.name)
    if position is None:
        raise CheckpointDirectoryError(
            f"records no journal position for {journal.name}", directory=where
        )
    scan = _journal_after(journal, position, config)
    needs, replayed = _rows_needed(files, scan, position=position, config=config, journal=journal)
    store = controller.data_plane
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
    _load_trainer_state(controller, policy, trainer_files)
    if controller.trainer.weight_version != state.weight_version:
        raise InvalidStateError(
            f"{where}: {CONTROLLER_STATE_FILE} is at weight version {state.weight_version} "
            f"but the trainer's state is at {controller.trainer.weight_version}"
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


@dataclass(frozen=True, slots=True)
class RowNeeds:
    """The data-plane rows a checkpoint and the journal after it need to be restored."""

    staging: frozenset[str] = frozenset()
    canonical: frozenset[str] = frozenset()

    def __or__(self, other: RowNeeds) -> RowNeeds:
        return RowNeeds(self.staging | other.staging, self.canonical | other.canonical)


def _journal_after(journal: Path, position: int, config: RunConfig) -> JournalScan:
    """The journal after ``position``, verified, a reservation batch cut short at its end
    counted with the torn tail (nothing is cut here)."""
    scan = JournalScan.read(journal, start=position)
    entries, torn_cut = whole_cuts(
        scan.entries, batch_size=config.job.prompts_per_step, journal=journal
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
    files: CheckpointFiles, scan: JournalScan, *, position: int, config: RunConfig, journal: Path
) -> tuple[RowNeeds, ControllerState]:
    """The rows a restore of this checkpoint needs at the end of its replay (not the
    snapshot's own: the journal may have published or dropped since), and the state the
    replay ends in: a dry run of the restore on throwaway copies. Raises
    ``ReplayError`` for a journal that does not apply."""
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
    JournalReplay(ledger=scratch, replay=replay, state=state, journal=journal).restore(
        _AnyCut(), scan.entries, snapshot_position=position, reuse=config.recovery.reuse
    )
    scratch.prepare_for_restart(_AnyCut())
    needs = RowNeeds(frozenset(scratch.expected_staging_keys()), frozenset(replay.row_keys()))
    return needs, state


def rows_older_checkpoints_need(
    controller: Controller[Any], store: CheckpointStore, restored: VerifiedCheckpoint
) -> RowNeeds:
    """The rows every committed checkpoint older than ``restored`` would need if it were
    restored now: what ``restored``'s restore must keep, so that falling back to one of
    them stays possible until they leave retention. A checkpoint that could not be
    restored anyway (damaged, another job's, a journal that does not apply) needs
    nothing. Reads their sidecars, controller states and replay indexes, not the
    trainers' files."""
    config = controller.config
    journal = controller.history.journal.path
    identity = identity_fingerprint(config)
    needs = RowNeeds()
    for committed in store.committed():
        if committed.step >= restored.step:
            continue
        try:
            loaded = store.load(committed, skip=_is_trainer_file)
            files = decode_checkpoint_files(loaded, trainer=False)
            position = loaded.marks.get(journal.name)
            if files.controller_state.identity != identity or position is None:
                continue
            scan = _journal_after(journal, position, config)
            needs |= _rows_needed(
                files, scan, position=position, config=config, journal=journal
            )[0]
        except (RolloutRecoveryError, ValueError, OSError):
            continue
    return needs


def _is_trainer_file(name: str) -> bool:
    return name == POLICY_FILE or bool(CHECKPOINT_FILES.trainer_files([name]))


@dataclass(frozen=True, slots=True)
class RestoreReport:
    step: int
    checkpoint: str
    groups_in_ledger: int
    sealed_siblings_kept: int
    canonical_groups: int
    shortfall: dict[int, int]
    staging_rows_cleared: int
    canonical_rows_cleared: int
    tokens_reused: int
    canonical_tokens_kept: int
    #: Journal records replayed after the snapshot.
    replayed_records: int = 0
    #: Bytes of a torn journal tail cut off (a write a crash interrupted).
    torn_tail_bytes: int = 0
    rolled_back_steps: tuple[int, ...] = ()
    #: Seals the reuse policy discarded, and their tokens.
    seals_discarded: int = 0
    tokens_discarded: int = 0
    #: Generated tokens staged by attempts the crash interrupted, generated again.
    tokens_in_flight_lost: int = 0
    #: Of those, the tokens of prompt-group cohorts (never continued).
    cohort_tokens_in_flight_lost: int = 0
    #: Staged calls of lost attempts kept for their siblings to continue, and their tokens.
    calls_resumable: int = 0
    tokens_resumable: int = 0
    resume_refused: tuple[str, ...] = ()


async def restore_controller(
    controller: Controller[Any], verified: VerifiedCheckpoint, *, retained: RowNeeds = RowNeeds()
) -> RestoreReport:
    """Restore ``verified`` and replay the journal after it, in DESIGN §4 step 8's order.

    Rows ``verified`` does not own are deleted, but those ``retained`` names (what the
    older retained checkpoints need: :func:`rows_older_checkpoints_need`), whose deletion
    is deferred until they have left retention."""
    ledger = controller.ledger
    store = controller.data_plane
    journal = controller.history.journal.path
    position, scan = verified.position, verified.scan
    if scan.torn_bytes:
        scan.cut_torn_tail(journal)
        controller.history.journal.truncate(scan.end)
    state = verified.controller_state
    reuse = controller.config.recovery.reuse
    async with controller.barrier.mutation("recovery_restore") as cut:
        ledger.load_state_dict(cut, verified.parsed.ledger_state)
        replay = ReplayIndex.from_state_dict(
            verified.replay_state,
            data_plane=metadata_only_plane(),
            check_rows=False,
            group_size=controller.config.job.generations_per_prompt,
        )
        replayer = JournalReplay(ledger=ledger, replay=replay, state=state, journal=journal)
        outcome = replayer.restore(cut, scan.entries, snapshot_position=position, reuse=reuse)
        _require_survivable_shortfall(controller, state, verified.name)
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
        controller.replay = ReplayIndex.from_state_dict(
            replay.state_dict(),
            data_plane=store,
            group_size=controller.config.job.generations_per_prompt,
            check_rows=False,
        )
        lacking = set(controller.replay.row_keys()) - set(
            store.keys(ReplayIndex.canonical_partition)
        )
        if lacking:  # verify_checkpoint found them: only a store changed under us
            raise InvalidStateError(
                f"{verified.name}: the data plane lacks canonical rows the replayed index "
                f"owns: {sorted(lacking)[:10]} (total={len(lacking)})"
            )
        canonical_tokens = sum(
            int(row.token_mask.sum())
            for row in store.get(ReplayIndex.canonical_partition, controller.replay.row_keys())
        )
        crash_point("restore.mid")
        resumable, refused = _resumable_calls(controller, state)
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
            ledger.bind_runtime_prompt(
                cut, group.group_id, controller.dataset[int(group.prompt_id)]
            )
        if controller.trainer.weight_version != state.weight_version:
            # verify_checkpoint loaded the trainer's state; nothing trained since.
            raise InvalidStateError(
                f"{verified.name}: the trainer is at weight version "
                f"{controller.trainer.weight_version}, not the checkpoint's "
                f"{state.weight_version}: restore only what verify_checkpoint just verified"
            )
        controller.state = state
        controller.history.truncate_metrics(
            verified.marks.get(controller.history.metrics_path.name, 0)
        )
        groups = ledger.groups()
        kept = sum(len(group.sealed_generation_indices) for group in groups)
        report = RestoreReport(
            step=state.step,
            checkpoint=verified.name,
            groups_in_ledger=len(groups),
            sealed_siblings_kept=kept,
            canonical_groups=len(controller.replay),
            shortfall=dict(state.shortfall),
            staging_rows_cleared=len(cleared),
            canonical_rows_cleared=len(unowned),
            tokens_reused=_sealed_tokens(ledger, store.inner),
            canonical_tokens_kept=canonical_tokens,
            replayed_records=outcome.replayed,
            torn_tail_bytes=scan.torn_bytes,
            rolled_back_steps=tuple(outcome.rolled_back_steps),
            seals_discarded=len(outcome.discarded),
            tokens_discarded=sum(seal.tokens for seal in outcome.discarded),
            tokens_in_flight_lost=in_flight_tokens,
            cohort_tokens_in_flight_lost=cohort_tokens,
            calls_resumable=sum(len(prefix.calls) for prefix in resumable),
            tokens_resumable=sum(prefix.tokens for prefix in resumable),
            resume_refused=tuple(refused),
        )
        # The record says what this restore did; a later replay that crosses it repeats
        # exactly that (prepare_for_restart, the rollback, the discards).
        controller.record(
            Restored(
                checkpoint=verified.name,
                step=state.step,
                snapshot_position=position,
                replayed_records=outcome.replayed,
                torn_tail_bytes=scan.torn_bytes,
                reuse=reuse,
                rolled_back_steps=list(outcome.rolled_back_steps),
                discarded=list(outcome.discarded),
                groups_in_ledger=report.groups_in_ledger,
                sealed_siblings_kept=report.sealed_siblings_kept,
                canonical_groups=report.canonical_groups,
                shortfall=report.shortfall,
                seals_lost=report.seals_discarded,
                tokens_lost=report.tokens_discarded,
                tokens_reused=report.tokens_reused,
                canonical_tokens_kept=canonical_tokens,
                tokens_in_flight_lost=in_flight_tokens,
                cohort_tokens_in_flight_lost=cohort_tokens,
                calls_resumable=report.calls_resumable,
                tokens_resumable=report.tokens_resumable,
                resume_refused=list(report.resume_refused),
            ),
            cut=cut,
        )
        for group_id, entries in interrupted.items():
            whole_group = (
                ledger.get_group(group_id).recovery_granularity is RecoveryGranularity.PROMPT_GROUP
            )
            controller.record(
                AttemptsAbandoned(
                    group_id=group_id,
                    attempts=[
                        AbandonedAttempt(index, rollout_id, FailureReason.RESTART)
                        for index, rollout_id in entries
                    ],
                    whole_group=whole_group,
                ),
                cut=cut,
            )
    await controller.history.flush()
    controller.backend.update_weights(
        controller.trainer.weight_version, controller.trainer.weights()
    )
    return report


def _load_trainer_state(
    controller: Controller[Any],
    policy: Mapping[str, npt.NDArray[Any]],
    trainer_files: Mapping[str, bytes],
) -> None:
    trainer = controller.trainer
    if trainer_files:
        # verify_checkpoint refused files this trainer cannot load.
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
    controller: Controller[Any], state: ControllerState
) -> tuple[list[StagedPrefix], list[str]]:
    """The staged calls of lost attempts the restore keeps for their siblings' next
    attempts (call-level resume; the reuse policy applied by the weights the restore
    lost), and what it refused. Runs after ``prepare_for_restart``: every unsealed
    sibling's current attempt is a lost one."""
    recovery = controller.config.recovery
    if recovery.resume != "call":
        return [], []
    store = controller.data_plane.inner
    keeps = version_filter(recovery.reuse, lineage=state.lineage, restore=True)
    keys = sorted(store.keys(CaptureWriter.staging_partition))
    prefixes: list[StagedPrefix] = []
    refused: list[str] = []
    for group in controller.ledger.groups():
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


def _require_survivable_shortfall(
    controller: Controller[Any], state: ControllerState, name: str
) -> None:
    """Refuse a checkpoint whose drops leave a step below its minimum: it can never train.

    Such a checkpoint is written only by an older version (drops are refused before they
    make a step unsurvivable); the message says what would let the run continue.
    """
    job = controller.config.job
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


class ControllerCheckpoints:
    """One controller's checkpoints in one store, as a job uses them: find the newest one
    that can be restored, restore it, follow the journal from there, take new ones.

    It keeps what it did, for the job's result: the newer checkpoints the search passed
    over, the restore, and the timing of every checkpoint taken."""

    def __init__(self, controller: Controller[Any], store: CheckpointStore) -> None:
        self.controller = controller
        self.store = store
        #: The newer checkpoints :meth:`newest_restorable` passed over, with why.
        self.skipped: list[SkippedCheckpoint] = []
        #: What :meth:`restore` did (None: nothing restored, a fresh start).
        self.restored: RestoreReport | None = None
        #: Every checkpoint :meth:`take` committed, in order.
        self.timings: list[CheckpointTiming] = []
        # What the checkpoints older than the one found need, for its restore to keep.
        self._older_needs = RowNeeds()

    def newest_restorable(self) -> VerifiedCheckpoint | None:
        """The newest committed checkpoint that verifies (see :func:`verify_checkpoint`),
        the newer ones skipped kept in ``skipped``; None when the store holds none. Changes
        nothing on disk; a ``CheckpointDirectoryError`` when checkpoints exist but none
        verifies. The job checks the history against every checkpoint first
        (``AuditTrail.require_synced_history``)."""
        controller = self.controller
        found = self.store.newest_loadable(
            lambda loaded: verify_checkpoint(
                loaded, config=controller.config, controller=controller
            )
        )
        if found is None:
            return None
        _, verified, self.skipped = found
        self._older_needs = rows_older_checkpoints_need(controller, self.store, verified)
        return verified

    async def restore(self, verified: VerifiedCheckpoint) -> RestoreReport:
        """Restore ``verified`` and replay the journal after it (:func:`restore_controller`).

        Whatever can make a checkpoint unusable is checked by its verification, so the
        search skips it for the previous one. A refusal from the restore itself (it has
        begun changing the store and the journal, so it cannot fall back in process) is a
        ``RunNotResumableError`` naming the checkpoint: the same start would refuse it
        again. Transient failures (a full disk) stay what they are: a rerun resumes."""
        try:
            self.restored = await restore_controller(
                self.controller, verified, retained=self._older_needs
            )
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
        return self.restored

    def follow_journal(self) -> None:
        """Start the snapshot builder at the journal's end (:func:`follow_journal`)."""
        follow_journal(self.controller)

    async def take(self, *, delete_deferred: bool = True) -> CheckpointTiming:
        """Snapshot the journal and publish it (:func:`take_checkpoint`)."""
        timing = await take_checkpoint(self.controller, self.store, delete_deferred=delete_deferred)
        self.timings.append(timing)
        return timing
