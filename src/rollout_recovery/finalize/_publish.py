"""Publish one finalized group inside the caller's ``group_commits`` cut (DESIGN §4 step 5).

The hand-over of a group from the ledger to the replay index, written once: the live
controller runs it with the canonical rows :func:`finalize_group` built, and a journal
replay runs it again from the ``group_published`` record, without rows (a replay touches
none; its data plane is a metadata-only stand-in). Order, all under the one cut the
caller holds (synchronous, so the cut cannot die midway)::

    check      group READY_TO_FINALIZE, admitted for the published target step; the
               replay index takes these row keys (its commit's own checks)
    ---------- nothing has changed up to here; a refusal leaves every store as it was
    start      ledger.mark_finalization_started               READY -> FINALIZING
    SUBMIT     data_plane.put(canonical partition, N rows, cut=cut)    (rows given only)
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

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .._crashpoints import crash_point
from .._cut import MutationCut
from ..capture import CaptureWriter
from ..dataplane import DataPlane, ReplayIndex, Row
from ..errors import FinalizationUnknownError, InvalidTransitionError
from ..ledger import PromptGroupStatus, RolloutAttemptStatus, RolloutRecoveryLedger

__all__ = ["Publication", "publish_finalized_group"]


class Publication(Protocol):
    """What a publish hands over: a :class:`FinalizedGroup`, or the ``group_published``
    record that journaled one."""

    @property
    def group_id(self) -> str: ...

    @property
    def target_step(self) -> int | None: ...

    @property
    def row_keys(self) -> Sequence[str]: ...

    @property
    def min_weight_version(self) -> int: ...

    @property
    def max_weight_version(self) -> int: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...


def publish_finalized_group(
    ledger: RolloutRecoveryLedger,
    cut: MutationCut,
    published: Publication,
    *,
    replay_index: ReplayIndex,
    data_plane: DataPlane,
    rows: Mapping[str, Row] | None = None,
    staging_partition: str = CaptureWriter.staging_partition,
) -> None:
    """Hand ``published``'s group from the ledger to the replay index.

    ``cut`` must come from ``barrier.mutation("group_commits")``; every step uses it and no
    section is opened here. ``rows`` (the finalized group's ``rows_by_key``) are put into
    ``replay_index.partition`` of ``data_plane``; without them nothing is put (a replay).
    The group's staged rows are cleared from ``data_plane`` either way.

    Raises before any change: ``DeadCutError``, ``UnknownGroupError``,
    ``InvalidTransitionError`` (not READY_TO_FINALIZE, no or another target step, row
    keys the replay index refuses, already published). Raises after submission:
    :class:`FinalizationUnknownError` from whatever failed, with the group left
    FINALIZATION_UNKNOWN.
    """
    cut.require_live()
    group_id = published.group_id
    group = ledger.get_group(group_id)
    if group.status is not PromptGroupStatus.READY_TO_FINALIZE:
        raise InvalidTransitionError(
            f"cannot publish group {group_id!r} from {group.status.value!r}", group_id=group_id
        )
    target_step = published.target_step
    if target_step is None or target_step != group.target_step:
        raise InvalidTransitionError(
            f"cannot publish group {group_id!r} for step {target_step}: it is admitted for "
            f"step {group.target_step}"
            + (" (never admitted)" if group.target_step is None else ""),
            group_id=group_id,
        )
    # Every argument check the replay commit will make, before anything is written: a
    # refusal after the canonical put would leave the outcome unknown, which is fatal.
    commit_arguments: dict[str, Any] = {
        "target_step": target_step,
        "min_weight_version": published.min_weight_version,
        "max_weight_version": published.max_weight_version,
        "metrics": published.metrics,
    }
    row_keys = replay_index.check_commit(group_id, published.row_keys, **commit_arguments)
    if rows is not None and tuple(rows) != row_keys:
        raise InvalidTransitionError(
            f"group {group_id!r}: the rows to put are {sorted(rows)[:4]}, not its row keys "
            f"{list(row_keys)[:4]}",
            group_id=group_id,
        )
    # Every staged row of the sealed attempts (valid or not, dead branches included).
    staging_keys = [
        key
        for sibling in group.siblings
        if sibling.current_attempt.status is RolloutAttemptStatus.SEALED
        for key in sibling.current_attempt.staging_keys
    ]
    ledger.mark_finalization_started(cut, group_id)
    try:
        if rows is not None:
            data_plane.put(replay_index.partition, rows, cut=cut)
            # The put is the publish's only durable effect (the controller's staging clear
            # is deferred), so a kill here leaves the disk as a kill anywhere up to the
            # journal's append would: canonical rows no checkpoint owns.
            crash_point("finalize.after_put")
        if group_id not in replay_index.reserved_group_ids():
            # Slots are in-memory only (never checkpointed), so a group restored as
            # READY_TO_FINALIZE arrives without one; taking it here keeps it in this cut.
            replay_index.reserve(cut, group_id)
        replay_index.commit(cut, group_id, row_keys, **commit_arguments)
        data_plane.clear(staging_partition, staging_keys, cut=cut)
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
