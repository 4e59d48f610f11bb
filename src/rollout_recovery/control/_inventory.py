"""The staging inventory pass: staged rows must match what the ledger owns.

Rows of abandoned attempts, of prompt-group cohorts dropped by ``prepare_for_restart`` and
of calls a crash interrupted are owned by nobody; a live run cannot tell them from rows of
calls still in flight, so they are reclaimed here, at restore, when nothing is in flight.
The other direction is fatal: a sealed attempt whose staged row is gone cannot be
finalized, and must not be trained as if it were complete. Rows the caller names in
``keep`` (the staged calls of lost attempts that their siblings' next attempts will
continue) stay, referenced by that intent rather than by a receipt.
"""

from __future__ import annotations

from collections.abc import Collection

from .._cut import MutationCut
from ..dataplane import DataPlane, ReplayIndex
from ..errors import InvalidTransitionError, StagingInventoryError
from ..ledger import RolloutRecoveryLedger

__all__ = ["reconcile_staging"]


def reconcile_staging(
    ledger: RolloutRecoveryLedger,
    data_plane: DataPlane,
    cut: MutationCut,
    *,
    partition: str,
    clear_unreferenced: bool,
    keep: Collection[str] = (),
) -> list[str]:
    """Check the staging partition against ``ledger.expected_staging_keys()``.

    Returns the staged keys the ledger does not own and ``keep`` does not name. Raises
    :class:`StagingInventoryError` (deleting nothing) when an expected row is missing.
    With ``clear_unreferenced`` (at restore, after ``prepare_for_restart``) those rows are
    deleted, so the partition then holds exactly the expected keys; without it (at
    checkpoint time, when calls may be in flight) they are tolerated and nothing changes.
    """
    cut.require_live()
    if partition == ReplayIndex.canonical_partition:
        raise InvalidTransitionError(
            f"reconcile_staging checks a staging partition; {partition!r} holds canonical "
            "rows, which the replay index owns"
        )
    in_flight = ledger.dispatched_attempt_count()
    if clear_unreferenced and in_flight:
        # Their rows are staged but not yet named by any receipt: clearing would destroy
        # calls still being made. Restores run prepare_for_restart first.
        raise InvalidTransitionError(
            f"cannot clear unreferenced staging rows while {in_flight} attempts are "
            "dispatched; run prepare_for_restart first"
        )
    expected = ledger.expected_staging_keys()
    actual = set(data_plane.keys(partition))
    missing = sorted(expected - actual)
    if missing:
        raise StagingInventoryError(missing)
    unreferenced = sorted(actual - expected - set(keep))
    if clear_unreferenced and unreferenced:
        data_plane.clear(partition, unreferenced, cut=cut)
    return unreferenced
