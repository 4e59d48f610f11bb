"""An ordered map whose views are taken in O(1) and never see a later change.

The incremental sidecar keeps one entry per group (its encoded bytes, its staging keys)
and hands out what it holds at each checkpoint, to be iterated later by the checkpoint's
writer and row check while the encoder goes on. A copy of the values (even a tuple of
references) is O(groups) per checkpoint; a view of the live dict would see the next
encode's changes. :class:`VersionedMap` is the persistent middle: :meth:`view` is O(1), and
each change costs O(1) amortized, so the work per checkpoint follows what changed.

How: the map is a list of cells in the keys' order, each cell the list of its key's values
as ``(version, value)``, oldest first; a removed key's cell ends with ``_GONE`` and a key
set again gets a new cell at the end (a dict's order: ``d.pop(k); d[k] = v`` moves ``k`` to
the end). A view remembers the list, its length and the version it was taken at, and
yields for each cell the newest value of a version not after its own. Cells and the list
are only ever appended to, except the newest entry of a cell at the current version, which
no view can see. A change after a view starts a new version, which views ignore.

The superseded values and dead cells are garbage: once there are more of them than live
keys, :meth:`_compact` builds a new list of fresh cells (O(keys), paid for by as many
changes before it), leaving the old list and cells to the views that still hold them.
Not thread-safe for writers (one owner changes it); views may be iterated from other
threads while it changes (lists are only appended to, entries replaced whole).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Generic, TypeVar

__all__ = ["MapView", "VersionedMap"]

K = TypeVar("K")
V = TypeVar("V")

_GONE = object()  # a removed key's last entry
# Garbage tolerated before a compaction, besides one entry per live key: small maps
# compact rarely.
_SLACK = 64

_Cell = list[tuple[int, object]]  # (version, value or _GONE), oldest first


class MapView(Generic[V]):
    """The values of a :class:`VersionedMap` as of one :meth:`VersionedMap.view`, in its
    order; unchanged by anything done to the map later. Iterable more than once."""

    __slots__ = ("_cells", "_count", "_length", "_version")

    def __init__(self, cells: list[_Cell], count: int, length: int, version: int) -> None:
        self._cells = cells
        self._count = count  # cells that existed when the view was taken
        self._length = length  # live keys then
        self._version = version

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[V]:
        version = self._version
        for cell in islice(self._cells, self._count):
            at, value = cell[-1]
            if at > version:  # changed since: the newest entry the view may see
                value = next((v for a, v in reversed(cell) if a <= version), _GONE)
            if value is not _GONE:
                yield value  # type: ignore[misc]  # not _GONE: a V

    def __repr__(self) -> str:
        return f"MapView(values={self._length}, version={self._version})"


class VersionedMap(Generic[K, V]):
    """A mapping with a dict's order whose :meth:`view` is O(1) and persistent."""

    __slots__ = ("_cells", "_garbage", "_index", "_version")

    def __init__(self, items: Iterable[tuple[K, V]] = ()) -> None:
        self._version = 0
        self._cells: list[_Cell] = []
        self._index: dict[K, _Cell] = {}  # live keys, in the cells' order
        self._garbage = 0  # superseded entries and dead cells in ``_cells``
        for key, value in items:
            self[key] = value

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __getitem__(self, key: K) -> V:
        return self._index[key][-1][1]  # type: ignore[return-value]  # live: a V

    def get(self, key: K) -> V | None:
        cell = self._index.get(key)
        return None if cell is None else cell[-1][1]  # type: ignore[return-value]  # a V

    def __setitem__(self, key: K, value: V) -> None:
        cell = self._index.get(key)
        if cell is None:
            cell = [(self._version, value)]
            self._cells.append(cell)
            self._index[key] = cell
        elif cell[-1][0] == self._version:
            cell[-1] = (self._version, value)  # no view has seen this version
        else:
            cell.append((self._version, value))
            self._garbage += 1
            self._compact_if_due()

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Remove ``key``; its value, or ``default`` if it was not there."""
        cell = self._index.pop(key, None)
        if cell is None:
            return default
        value: V = cell[-1][1]  # type: ignore[assignment]  # live: a V
        if cell[-1][0] == self._version:
            cell[-1] = (self._version, _GONE)
        else:
            cell.append((self._version, _GONE))
            self._garbage += 1
        self._garbage += 1  # the dead cell
        self._compact_if_due()
        return value

    def items(self) -> Iterator[tuple[K, V]]:
        """The live keys and values, in order (not a view: for the owner, now)."""
        for key, cell in self._index.items():
            yield key, cell[-1][1]  # type: ignore[misc]  # live: a V

    def view(self) -> MapView[V]:
        """The values as they are now, in O(1); later changes start a new version."""
        taken = MapView[V](self._cells, len(self._cells), len(self._index), self._version)
        self._version += 1
        return taken

    def _compact_if_due(self) -> None:
        if self._garbage > len(self._index) + _SLACK:
            self._compact()

    def _compact(self) -> None:
        """Fresh cells for the live keys in a new list; the views keep the old ones."""
        version = self._version
        self._index = {key: [(version, cell[-1][1])] for key, cell in self._index.items()}
        self._cells = list(self._index.values())
        self._garbage = 0

    def __repr__(self) -> str:
        return f"VersionedMap(keys={len(self._index)}, garbage={self._garbage})"
