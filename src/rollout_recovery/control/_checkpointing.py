"""Checkpoint and restore of a whole run: one consistent cut, written after the hold.

Capture. Inside ``barrier.checkpoint()`` (every mutation drained) we take only what is
O(ledger): the sidecar bytes straight from ledger storage, the replay index's metadata,
the controller state with the audit files' lengths, and a copy of the policy arrays. No
token row is read or copied: rows the checkpoint owns stay in the durable store until no
retained checkpoint needs them (``_deferred.py``), so the hold does not grow with the
bytes stored. Encoding the rest, fsyncing and publishing happen after the hold, while
generation goes on.

Restore. Each committed checkpoint, newest first, is verified without changing anything:
checksums, every file decoded and validated, the job's configuration, and the durable
store holding every row the checkpoint owns. The first that passes is restored in one
``recovery_restore`` cut, in DESIGN §4 step 8's order.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ..capture import STAGING_PARTITION
from ..checkpoint import (
    SIDECAR_FILENAMES,
    decode_sidecar,
    encode_native_checkpoint,
    encode_sidecar,
    sidecar_filename,
)
from ..dataplane import CANONICAL_PARTITION, ReplayIndex, reconcile_staging
from ..errors import CheckpointDirectoryError, InvalidStateError, JobMismatchError
from ..ledger import (
    ParsedRolloutRecoveryState,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    build_rollout_recovery_state,
    parse_rollout_recovery_state,
)
from ._checkpoint_dir import CheckpointStore, LoadedCheckpoint
from ._config import (
    RunConfig,
    config_differences,
    config_fingerprint,
    config_from_builtins,
    config_to_builtins,
)
from ._controller import COUNTERS, Controller
from ._crashpoints import crash_point
from ._state import (
    CONTROLLER_STATE_FILE,
    ControllerState,
    decode_controller_state,
    encode_controller_state,
)

__all__ = [
    "POLICY_FILE",
    "REPLAY_FILE",
    "CheckpointFiles",
    "CheckpointTiming",
    "RestoreReport",
    "VerifiedCheckpoint",
    "decode_checkpoint_files",
    "restore_controller",
    "take_checkpoint",
    "verify_checkpoint",
]

REPLAY_FILE = "replay_index.msgpack"
POLICY_FILE = "policy.npz"


@dataclass(frozen=True, slots=True)
class CheckpointTiming:
    step: int
    #: The exclusive hold: from entering the checkpoint section to leaving it.
    hold_s: float
    #: What mutations felt: from asking for the section (drain included) to leaving it.
    stall_s: float
    #: Encoding, fsync and publication after the hold.
    write_s: float


class _AnyCut:
    """A cut for read-only dry runs on a throwaway ledger (verification)."""

    def require_live(self) -> None:
        return None


async def take_checkpoint(controller: Controller, store: CheckpointStore) -> CheckpointTiming:
    """Capture one consistent cut of the run and publish it as ``step_NNNNNN``."""
    config = controller.config
    requested = time.monotonic()
    async with controller.barrier.checkpoint(timeout=config.checkpoint.barrier_timeout_s):
        entered = time.monotonic()
        # Written inside the cut, so the event is in the history exactly when this
        # checkpoint is: a resume from an older one cuts it off with everything else.
        controller.audit.event("checkpoint_committed", step=controller.step)
        canonical_ids = set(controller.replay.group_ids())
        sidecar_fields: dict[str, Any] = {
            "batch_shortfall": dict(controller.shortfall),
            "sampler_stamps_target_steps": True,
            # The replay index owns finalizer metrics; the sidecar's field is a copy.
            "finalizer_metrics_by_group": controller.replay.metrics_by_group(),
            "reward_settings": controller.settings,
            "canonical_group_ids": canonical_ids,
        }
        sidecar: bytes | dict[str, Any]
        if config.checkpoint.format == "native":
            sidecar = encode_native_checkpoint(controller.ledger, **sidecar_fields)
        else:
            sidecar = dict(build_rollout_recovery_state(controller.ledger, **sidecar_fields))
        expected_staging = controller.ledger.expected_staging_keys()
        canonical_keys = controller.replay.row_keys()
        replay_state = controller.replay.state_dict()
        counters = dict(controller.counters)
        counters["checkpoints"] += 1
        state = ControllerState(
            step=controller.step,
            prompts_taken=controller.prompts_taken,
            rounds_used=dict(controller.rounds_used),
            audit_offsets=controller.audit.offsets(),
            counters=counters,
            config=config_to_builtins(config),
            config_fingerprint=config_fingerprint(config),
        )
        policy = {
            name: np.array(value, copy=True) for name, value in controller.trainer.state().items()
        }
        step = controller.step
        number = controller.data_plane.checkpoint_captured()
        released = time.monotonic()
    hold, stall = released - entered, released - requested
    # The rows this checkpoint owns cannot be deleted before a later checkpoint commits,
    # so checking them after the hold is as good as under it, and keeps the hold short.
    _require_rows(controller, expected_staging, canonical_keys)
    controller.audit.sync()
    files = {
        sidecar_filename(config.checkpoint.format): (
            sidecar
            if isinstance(sidecar, bytes)
            else encode_sidecar(sidecar, format=config.checkpoint.format)
        ),
        REPLAY_FILE: msgspec.msgpack.encode(replay_state),
        CONTROLLER_STATE_FILE: encode_controller_state(state),
        POLICY_FILE: _npz_bytes(policy),
    }
    await asyncio.to_thread(store.save, step, files)
    controller.data_plane.checkpoint_committed(number)
    controller.counters["checkpoints"] += 1
    for name, seconds in (
        ("longest_checkpoint_stall_us", stall),
        ("longest_checkpoint_hold_us", hold),
    ):
        controller.counters[name] = max(controller.counters[name], int(seconds * 1e6))
    return CheckpointTiming(
        step=step, hold_s=hold, stall_s=stall, write_s=time.monotonic() - released
    )


def _require_rows(
    controller: Controller, expected_staging: set[str], canonical_keys: list[str]
) -> None:
    store = controller.data_plane
    missing_staging = expected_staging - set(store.keys(STAGING_PARTITION))
    missing_canonical = set(canonical_keys) - set(store.keys(CANONICAL_PARTITION))
    if missing_staging or missing_canonical:
        raise CheckpointDirectoryError(
            "refusing to publish a checkpoint whose rows are not in the data plane: "
            f"staging {sorted(missing_staging)[:10]} canonical {sorted(missing_canonical)[:10]}"
        )


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
    policy: dict[str, npt.NDArray[Any]]


@dataclass(frozen=True, slots=True)
class CheckpointFiles:
    """A checkpoint's sidecar, controller state and replay index, decoded and checked."""

    parsed: ParsedRolloutRecoveryState
    controller_state: ControllerState
    replay_state: dict[str, Any]


def decode_checkpoint_files(loaded: LoadedCheckpoint) -> CheckpointFiles:
    """Decode what every reader of a checkpoint needs (the restore and the auditor).

    Raises ``CheckpointDirectoryError`` for a missing or doubled file and
    ``InvalidStateError`` for one that does not decode; changes nothing.
    """
    where = str(loaded.directory)
    names = [name for name in SIDECAR_FILENAMES if name in loaded.files]
    if len(names) != 1:
        raise CheckpointDirectoryError(
            f"expected exactly one sidecar of {list(SIDECAR_FILENAMES)}, found {names}",
            directory=where,
        )
    for required in (REPLAY_FILE, CONTROLLER_STATE_FILE, POLICY_FILE):
        if required not in loaded.files:
            raise CheckpointDirectoryError(f"missing {required}", directory=where)
    _, sidecar_state = decode_sidecar(loaded.files[names[0]])
    parsed = parse_rollout_recovery_state(sidecar_state)
    state = decode_controller_state(loaded.files[CONTROLLER_STATE_FILE])
    try:
        replay_state = msgspec.msgpack.decode(loaded.files[REPLAY_FILE], type=dict[str, Any])
    except msgspec.DecodeError as error:
        raise InvalidStateError(f"{where}: unreadable {REPLAY_FILE}: {error}") from None
    return CheckpointFiles(parsed=parsed, controller_state=state, replay_state=replay_state)


def verify_checkpoint(
    loaded: LoadedCheckpoint, *, config: RunConfig, controller: Controller
) -> VerifiedCheckpoint:
    """Decode and check everything a restore will use; change nothing.

    Raises ``InvalidStateError`` / ``CheckpointDirectoryError`` for a damaged checkpoint
    (the caller falls back to an older one) and ``JobMismatchError`` for another job's.
    """
    where = str(loaded.directory)
    files = decode_checkpoint_files(loaded)
    parsed, state, replay_state = files.parsed, files.controller_state, files.replay_state
    saved_config = config_from_builtins(state.config)
    differences = config_differences(saved_config, config)
    if differences:
        raise JobMismatchError(
            f"{where} belongs to another job: " + "; ".join(differences),
            differences=differences,
        )
    try:
        with np.load(io.BytesIO(loaded.files[POLICY_FILE]), allow_pickle=False) as npz:
            policy = {name: npz[name] for name in npz.files}
    except (ValueError, OSError) as error:
        raise InvalidStateError(f"{where}: unreadable {POLICY_FILE}: {error}") from None
    # Dry run of the restore's inventory checks on a throwaway ledger.
    scratch = RolloutRecoveryLedger.from_state_dict(parsed.ledger_state)
    scratch.prepare_for_restart(_AnyCut())
    owned_rows = {key for group in replay_state.get("groups", []) for key in group["row_keys"]}
    store = controller.data_plane
    missing_staging = scratch.expected_staging_keys() - set(store.keys(STAGING_PARTITION))
    missing_canonical = owned_rows - set(store.keys(CANONICAL_PARTITION))
    if missing_staging or missing_canonical:
        raise CheckpointDirectoryError(
            "the data plane lacks rows this checkpoint owns: "
            f"staging {sorted(missing_staging)[:10]} (total={len(missing_staging)}), "
            f"canonical {sorted(missing_canonical)[:10]} (total={len(missing_canonical)})",
            directory=where,
        )
    return VerifiedCheckpoint(
        step=state.step,
        name=loaded.directory.name,
        parsed=parsed,
        replay_state=replay_state,
        controller_state=state,
        policy=policy,
    )


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


async def restore_controller(controller: Controller, verified: VerifiedCheckpoint) -> RestoreReport:
    """Restore ``verified`` into a fresh controller, in DESIGN §4 step 8's order."""
    ledger = controller.ledger
    store = controller.data_plane
    state = verified.controller_state
    async with controller.barrier.mutation("recovery_restore") as cut:
        ledger.load_state_dict(cut, verified.parsed.ledger_state)
        interrupted = _dispatched_attempts(ledger)
        ledger.prepare_for_restart(cut)
        controller.shortfall = dict(verified.parsed.batch_shortfall)
        canonical_ids = {group["group_id"] for group in verified.replay_state["groups"]}
        ledger.discard_canonical_groups(cut, sorted(canonical_ids))
        owned_rows = {key for group in verified.replay_state["groups"] for key in group["row_keys"]}
        # Canonical rows published after the checkpoint: the restored index does not own
        # them, and their groups are back in the ledger to be published again.
        unowned = sorted(set(store.keys(CANONICAL_PARTITION)) - owned_rows)
        store.inner.clear(CANONICAL_PARTITION, unowned, cut=cut)
        controller.replay = ReplayIndex.from_state_dict(
            verified.replay_state,
            data_plane=store,
            group_size=controller.config.job.generations_per_prompt,
        )
        # Finished groups waiting to train: a restart that discards buffered work (what
        # other frameworks do) would regenerate these tokens too.
        canonical_tokens = sum(
            int(row.token_mask.sum())
            for row in store.get(CANONICAL_PARTITION, controller.replay.row_keys())
        )
        crash_point("restore.mid")
        # Against the inner store: deletions at restore are immediate, nothing needs them.
        cleared = reconcile_staging(
            ledger, store.inner, cut, partition=STAGING_PARTITION, clear_unreferenced=True
        )
        for group in ledger.groups():
            ledger.bind_runtime_prompt(
                cut, group.group_id, controller.dataset[int(group.prompt_id)]
            )
        controller.trainer.load_state(verified.policy)
        if controller.trainer.weight_version != state.step:
            raise InvalidStateError(
                f"{verified.name}: controller step {state.step} disagrees with the policy's "
                f"weight version {controller.trainer.weight_version}"
            )
        controller.step = state.step
        controller.prompts_taken = state.prompts_taken
        controller.rounds_used = dict(state.rounds_used)
        controller.counters = {name: state.counters.get(name, 0) for name in COUNTERS}
        cut_off = controller.audit.truncate_to(state.audit_offsets)
        groups = ledger.groups()
        kept = {
            group.gate_rollout_id(index)
            for group in groups
            for index in group.sealed_generation_indices
        }
        controller.counters["siblings_reused"] += len(kept)
        for group_id, entries in interrupted.items():
            granularity = ledger.get_group(group_id).recovery_granularity
            controller.audit.attempts_abandoned(
                group_id,
                entries,
                reason="restart",
                whole_group=granularity is RecoveryGranularity.PROMPT_GROUP,
            )
        tokens_reused = controller.audit.sealed_tokens(kept)
        report = RestoreReport(
            step=state.step,
            checkpoint=verified.name,
            groups_in_ledger=len(groups),
            sealed_siblings_kept=len(kept),
            canonical_groups=len(controller.replay),
            shortfall=dict(controller.shortfall),
            staging_rows_cleared=len(cleared),
            canonical_rows_cleared=len(unowned),
            tokens_reused=tokens_reused,
            canonical_tokens_kept=canonical_tokens,
        )
        controller.audit.event(
            "restored",
            step=report.step,
            checkpoint=report.checkpoint,
            groups_in_ledger=report.groups_in_ledger,
            sealed_siblings_kept=report.sealed_siblings_kept,
            canonical_groups=report.canonical_groups,
            shortfall={str(k): v for k, v in report.shortfall.items()},
            seals_lost=cut_off.seals_lost,
            tokens_lost=cut_off.tokens_lost,
            tokens_reused=tokens_reused,
            canonical_tokens_kept=canonical_tokens,
            trained_rows_cut=cut_off.trained_rows,
        )
    controller.backend.update_weights(
        controller.trainer.weight_version, controller.trainer.weights()
    )
    return report


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
