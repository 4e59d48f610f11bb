"""Publish one finalized group inside the caller's ``group_commits`` cut (DESIGN §4 step 5).

Order, all under the one cut the caller holds (synchronous, so the cut cannot die midway)::

    check      group is READY_TO_FINALIZE with a target step; the replay index has no
               committed group of that id and the same group size
    finalize   finalize_group(...)                           reads only
    ---------- nothing has changed up to here; a failure leaves every store as it was
    start      ledger.mark_finalization_started               READY -> FINALIZING
    SUBMIT     data_plane.put(canonical partition, N rows, cut=cut)
    commit     replay_index.reserve (if no slot yet) + commit  the index owns the N rows
    clear      data_plane.clear(staging partition, every staging key of the sealed attempts)
    discard    ledger.discard_group                           ownership moved to the index

Before SUBMIT the ledger is untouched (still READY_TO_FINALIZE): ``finalize_group`` is
side-effect free, so unlike upstream (whose finalizer actor computes and puts in one RPC)
we compute first and mark the start only right before the first write. From SUBMIT on, any
exception (the put itself included: a store that raised may still have written) marks the
group FINALIZATION_UNKNOWN and raises :class:`FinalizationUnknownError` (``fatal``) from it.
That state is fatal: the ledger refuses to
checkpoint (``CheckpointUnsafeError``) and nothing retries; the run must stop and resume
from the last checkpoint, which predates this publication.
"""

from __future__ import annotations

from typing import Any

from ..capture import CaptureWriter
from ..dataplane import DataPlane, ReplayIndex
from ..errors import FinalizationUnknownError, InvalidTransitionError
from ..ledger import MutationCut, PromptGroupStatus, RolloutRecoveryLedger
from ..rewards import CaptureRewardSettings
from ._group import finalize_group
from ._result import FinalizedGroup

__all__ = ["publish_finalized_group"]


def publish_finalized_group(
    ledger: RolloutRecoveryLedger,
    cut: MutationCut,
    *,
    data_plane: DataPlane,
    replay_index: ReplayIndex,
    group_id: str,
    settings: CaptureRewardSettings,
    staging_partition: str = CaptureWriter.staging_partition,
) -> FinalizedGroup:
    """Finalize ``group_id`` and hand its ownership from the ledger to the replay index.

    ``cut`` must come from ``barrier.mutation("group_commits")``; every step uses it and no
    section is opened here. The canonical rows go to ``replay_index.partition`` of
    ``data_plane`` (the store the index was built on). Returns the finalized group.

    Raises before any change: ``DeadCutError``, ``UnknownGroupError``,
    ``InvalidTransitionError`` (not READY_TO_FINALIZE, no target step, group size differs
    from the index, already published), and data-plane faults while reading staged rows.
    Raises after submission: :class:`FinalizationUnknownError` from whatever failed, with
    the group left FINALIZATION_UNKNOWN.
    """
    cut.require_live()
    group = ledger.get_group(group_id)
    if group.status is not PromptGroupStatus.READY_TO_FINALIZE:
        raise InvalidTransitionError(
            f"cannot publish group {group_id!r} from {group.status.value!r}", group_id=group_id
        )
    target_step = group.target_step
    if target_step is None:
        raise InvalidTransitionError(
            f"cannot publish group {group_id!r}: it has no target_step (never admitted)",
            group_id=group_id,
        )
    if group.expected_generations != replay_index.group_size:
        raise InvalidTransitionError(
            f"group {group_id!r} has {group.expected_generations} generations but the replay "
            f"index takes groups of {replay_index.group_size}",
            group_id=group_id,
        )
    if group_id in replay_index:
        raise InvalidTransitionError(
            f"group {group_id!r} is already committed to the replay index", group_id=group_id
        )
    finalized = finalize_group(
        group=group, data_plane=data_plane, settings=settings, staging_partition=staging_partition
    )

    # Every argument check the replay commit will make, before anything is written: a
    # refusal after the canonical put would leave the outcome unknown, which is fatal.
    commit_arguments: dict[str, Any] = {
        "target_step": target_step,
        "min_weight_version": finalized.min_weight_version,
        "max_weight_version": finalized.max_weight_version,
        "metrics": finalized.metrics,
    }
    replay_index.check_commit(group_id, finalized.row_keys, **commit_arguments)
    ledger.mark_finalization_started(cut, group_id)
    try:
        data_plane.put(replay_index.partition, finalized.rows_by_key, cut=cut)
        if group_id not in replay_index.reserved_group_ids():
            # Slots are in-memory only (never checkpointed), so a group restored as
            # READY_TO_FINALIZE arrives without one; taking it here keeps it in this cut.
            replay_index.reserve(cut, group_id)
        replay_index.commit(cut, group_id, finalized.row_keys, **commit_arguments)
        data_plane.clear(staging_partition, finalized.staging_keys, cut=cut)
        ledger.discard_group(cut, group_id)
    except BaseException as error:
        try:
            ledger.mark_finalization_unknown(cut, group_id)
        except Exception as marking_error:  # keep the original failure as the one raised
            error.add_note(
                f"rollout-recovery: also failed to mark group {group_id!r} "
                f"FINALIZATION_UNKNOWN: {marking_error!r}"
            )
        else:
            error.add_note(
                f"rollout-recovery: group {group_id!r} is FINALIZATION_UNKNOWN after a failure "
                "past canonical submission; the run must stop and resume from its last checkpoint"
            )
        if not isinstance(error, Exception):  # cancellation and exit propagate as they are
            raise
        raise FinalizationUnknownError(
            f"group {group_id!r} is FINALIZATION_UNKNOWN after a failure past canonical "
            f"submission ({type(error).__name__}: {error}); the run must stop and resume from "
            "its last checkpoint",
            group_id=group_id,
        ) from error
    return finalized
