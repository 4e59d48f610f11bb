"""Deletions deferred until no retained checkpoint can need the rows.

Why: a checkpoint must not copy token rows under the exclusive barrier hold, or the hold
grows with the bytes stored. So a checkpoint copies no rows at all. It records which rows
it owns (the ledger's expected staging keys, the replay index's canonical keys), and the
durable store keeps every such row until no retained checkpoint references it. The live
store is then always a superset of what each retained checkpoint needs. A restore deletes
at once what no retained checkpoint needs, and defers (as :meth:`clear_unowned`) what only
an older retained one needs: if the restored checkpoint is lost before the next one
commits, the fallback to an older one still finds its rows.

Checkpoints are numbered as they are *captured* (inside the exclusive hold), not as they
commit: a checkpoint is written after its hold, while the run goes on clearing rows, and
every row it captured must outlive that write. A deletion requested after ``e`` captures
may be needed by any of those checkpoints. With ``keep`` checkpoints retained, once
capture ``m`` has committed the retained ones are ``m - keep + 1 .. m``, so a deletion of
epoch ``e`` is safe once ``e <= m - keep``. Pending deletions live in memory only: after
a crash the restore's inventory pass deletes what no retained checkpoint needs and
defers the rest again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

from .._checks import check_keys_argument, check_partition
from .._cut import MutationCut
from .._lifecycle import Resource
from ..dataplane import DataPlane, Row
from ..errors import InvalidArgumentError

__all__ = ["DeferredDeletionDataPlane"]


class DeferredDeletionDataPlane(Resource):
    """A :class:`DataPlane` whose ``clear`` waits for the checkpoints that need the rows.

    Reads, puts, snapshots and restores go straight to ``inner``. ``clear`` checks the cut
    like any backend, then only records the keys. :meth:`checkpoint_committed` performs the
    deletions that no retained checkpoint can need any more. ``inner`` stays reachable for
    the restore, which deletes unowned rows at once.
    """

    def __init__(self, inner: DataPlane, *, keep: int, committed_epochs: int = 0) -> None:
        if keep < 1:
            raise InvalidArgumentError(f"keep must be >= 1, got {keep!r}")
        self.inner = inner
        self._keep = keep
        self._epoch = committed_epochs
        # (partition, key) -> epoch of the request; a later request keeps the earliest.
        self._pending: dict[tuple[str, str], int] = {}

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def put(
        self, partition: str, rows: Mapping[str, Row], *, cut: MutationCut | None = None
    ) -> None:
        self.inner.put(partition, rows, cut=cut)
        for key in rows:  # a re-put row is live again
            self._pending.pop((partition, key), None)

    def get(self, partition: str, keys: Sequence[str]) -> list[Row]:
        return self.inner.get(partition, keys)

    def clear(self, partition: str, keys: Iterable[str], *, cut: MutationCut | None = None) -> None:
        if cut is not None:
            cut.require_live()
        # The inner store's own checks, now: a key it would refuse later would make every
        # later checkpoint_committed() fail after its checkpoint had already committed.
        check_partition(partition)
        for key in check_keys_argument(keys, operation="clear"):
            self._pending.setdefault((partition, key), self._epoch)

    def keys(self, partition: str) -> list[str]:
        return self.inner.keys(partition)

    def snapshot(self, directory: Path, *, cut: MutationCut | None = None) -> None:
        self.inner.snapshot(directory, cut=cut)

    def restore(self, directory: Path, *, cut: MutationCut | None = None) -> None:
        self.inner.restore(directory, cut=cut)
        self._pending.clear()

    def close(self) -> None:
        # Closes the store it wraps: the two are one resource to whoever holds this one.
        self.inner.close()

    def clear_unowned(
        self,
        partition: str,
        keys: Sequence[str],
        *,
        retained: Collection[str],
        cut: MutationCut,
    ) -> list[str]:
        """A restore's deletion of rows the restored checkpoint does not own: at once, but
        those ``retained`` names (rows an older retained checkpoint needs), which wait
        like any ``clear`` until ``keep`` later checkpoints have committed, when none of
        the checkpoints retained now is left. Returns the keys deferred."""
        cut.require_live()
        later = [key for key in keys if key in retained]
        now = [key for key in keys if key not in retained]
        if now:
            self.inner.clear(partition, now, cut=cut)
        if later:
            self.clear(partition, later, cut=cut)
        return later

    def checkpoint_captured(self) -> int:
        """Number one more checkpoint, inside its hold; returns its number for the commit."""
        self._epoch += 1
        return self._epoch

    def checkpoint_committed(self, captured: int | None = None) -> int:
        """Checkpoint ``captured`` committed: delete what no retained one can need.

        Returns how many rows were deleted. Without ``captured``, a checkpoint is captured
        and committed at once.
        """
        if captured is None:
            captured = self.checkpoint_captured()
        horizon = captured - self._keep
        due: dict[str, list[str]] = {}
        for (partition, key), epoch in self._pending.items():
            if epoch <= horizon:
                due.setdefault(partition, []).append(key)
        for partition, keys in due.items():
            self.inner.clear(partition, keys)
            for key in keys:
                del self._pending[(partition, key)]
        return sum(len(keys) for keys in due.values())
