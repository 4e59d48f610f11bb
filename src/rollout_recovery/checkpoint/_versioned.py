"""An ordered map whose views are taken in O(1) and never see a later change.

The incremental sidecar keeps one entry per group (its encoded bytes, its staging keys)
and hands out what it holds at each checkpoint, to be iterated later by the checkpoint's
writer and row check while the encoder goes on. A copy of the values (even a tuple of
references) is O(groups) per checkpoint; a view of the live dict would see the next
encode's changes. :class:`VersionedMap` is the persistent middle: :meth:`view` is O(1), and
each change costs O(1), so the work per checkpoint follows what changed.

How: the map is a list of cells in the keys' order, each cell the list of its key's values
as ``(version, value)``, oldest first; a removed key's cell ends with ``_GONE`` and a key
set again gets a new cell at the end (a dict's order: ``d.pop(k); d[k] = v`` moves ``k`` to
the end). A view remembers the list, its length and the version it was taken at, and
yields for each cell the newest value of a version not after its own. Cells and the list
are only ever appended to, except the newest entry of a cell at the current version, which
no view can see. A change after a view starts a new version, which views ignore.

The superseded values and dead cells are garbage: once there are more of them than live
keys, the map moves its live keys into a new list of fresh cells, a few with each change
after (:meth:`_migrate`), leaving the old list and cells to the views that still hold them.
Spread this way, no change and no view pays O(keys) at once (a whole compaction in one
call took 16 to 60 ms at 50,000 keys, measured apart, in one snapshot of a few thousand
whose median is 0.5 ms), and the garbage stays bounded: the move ends before the old
list can double.
While it runs, the map's order is the moved cells (the new list) then the old list from
the first cell not yet moved, new keys appended to the old list; a view holds both parts.
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

# Old cells moved per change while the map moves its live keys into a new list: more than
# one, so the move outruns the keys appended meanwhile and ends within a third of the
# old list's length in changes.
_MOVES_PER_CHANGE = 4

_Cell = list[tuple[int, object]]  # (version, value or _GONE), oldest first
_Segment = tuple[list[_Cell], int, int]  # cells, start, stop


class MapView(Generic[V]):
    """The values of a :class:`VersionedMap` as of one :meth:`VersionedMap.view`, in its
    order; unchanged by anything done to the map later. Iterable more than once."""

    __slots__ = ("_length", "_segments", "_version")

    def __init__(self, segments: tuple[_Segment, ...], length: int, version: int) -> None:
        # (cells, start, stop): the slices of the map's lists that held its cells then.
        self._segments = segments
        self._length = length  # live keys then
        self._version = version

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[V]:
        version = self._version
        for cells, start, stop in self._segments:
            for cell in islice(cells, start, stop):
                at, value = cell[-1]
                if at > version:  # changed since: the newest entry the view may see
                    value = next((v for a, v in reversed(cell) if a <= version), _GONE)
                if value is not _GONE:
                    yield value  # type: ignore[misc]  # not _GONE: a V

    def __repr__(self) -> str:
        return f"MapView(values={self._length}, version={self._version})"


class VersionedMap(Generic[K, V]):
    """A mapping with a dict's order whose :meth:`view` is O(1) and persistent."""

    __slots__ = (
        "_cells",
        "_cursor",
        "_garbage",
        "_garbage_left",
        "_index",
        "_keys",
        "_moved",
        "_moved_keys",
        "_version",
    )

    def __init__(self, items: Iterable[tuple[K, V]] = ()) -> None:
        self._version = 0
        self._cells: list[_Cell] = []
        self._keys: list[K] = []  # the key of each cell of ``_cells``
        self._index: dict[K, _Cell] = {}  # live keys, in the map's order
        self._garbage = 0  # superseded entries and dead cells held
        # While the live keys move to a new list: it, its keys, the next old cell to move
        # and the garbage the old list held when the move began (left behind with it).
        self._moved: list[_Cell] | None = None
        self._moved_keys: list[K] = []
        self._cursor = 0
        self._garbage_left = 0
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
            self._cells.append(cell)  # the old list while a move runs: it ends the order
            self._keys.append(key)
            self._index[key] = cell
        elif cell[-1][0] == self._version:
            cell[-1] = (self._version, value)  # no view has seen this version
        else:
            cell.append((self._version, value))
            self._garbage += 1
        self._changed()

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
        self._changed()
        return value

    def items(self) -> Iterator[tuple[K, V]]:
        """The live keys and values, in order (not a view: for the owner, now)."""
        for key, cell in self._index.items():
            yield key, cell[-1][1]  # type: ignore[misc]  # live: a V

    def view(self) -> MapView[V]:
        """The values as they are now, in O(1); later changes start a new version."""
        old: _Segment = (self._cells, self._cursor, len(self._cells))
        moved = self._moved
        segments = (old,) if moved is None else ((moved, 0, len(moved)), old)
        taken = MapView[V](segments, len(self._index), self._version)
        self._version += 1
        return taken

    def _changed(self) -> None:
        if self._moved is not None:
            self._migrate(_MOVES_PER_CHANGE)
        elif self._garbage > len(self._index) + _SLACK:
            self._moved, self._moved_keys = [], []
            self._cursor, self._garbage_left = 0, self._garbage
            self._migrate(_MOVES_PER_CHANGE)

    def _migrate(self, moves: int) -> None:
        """Move up to ``moves`` old cells: a live key's value into a fresh cell at the end
        of the new list (a view taken before keeps the old cell, which no longer changes);
        a dead cell is left behind. The new list replaces the old once all have moved."""
        cells, keys, index, moved = self._cells, self._keys, self._index, self._moved
        assert moved is not None
        cursor, end = self._cursor, min(len(cells), self._cursor + moves)
        while cursor < end:
            cell, key = cells[cursor], keys[cursor]
            cursor += 1
            if index.get(key) is cell:
                fresh: _Cell = [(self._version, cell[-1][1])]
                moved.append(fresh)
                self._moved_keys.append(key)
                index[key] = fresh  # same key: its place in the order stays
        self._cursor = cursor
        if cursor == len(cells):
            self._cells, self._keys = moved, self._moved_keys
            self._moved, self._moved_keys, self._cursor = None, [], 0
            self._garbage = max(0, self._garbage - self._garbage_left)

    def __repr__(self) -> str:
        moving = "" if self._moved is None else f", moving={self._cursor}/{len(self._cells)}"
        return f"VersionedMap(keys={len(self._index)}, garbage={self._garbage}{moving})"
