"""``VersionedMap``: its views are taken in O(1) and never see a later change.

The incremental sidecar hands out its groups' bytes and staging keys as views of these
maps, which the checkpoint's writer and row check iterate after the encoder went on. The
state machine changes a map and a plain dict alike, takes views at random, and checks
every view ever taken against the dict's values copied when it was taken, through
removals, re-insertions (which move a key to the end, as in a dict) and compactions.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rollout_recovery.checkpoint._versioned import (
    _MOVES_PER_CHANGE,
    _SLACK,
    MapView,
    VersionedMap,
)

KEYS_ALL = [f"g{i}" for i in range(12)]
KEYS = st.sampled_from(KEYS_ALL)


class VersionedMapMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.map: VersionedMap[str, int] = VersionedMap()
        self.model: dict[str, int] = {}
        self.views: list[tuple[MapView[int], list[int]]] = []
        self.counter = 0

    @rule(key=KEYS)
    def set(self, key: str) -> None:
        self.counter += 1
        self.map[key] = self.model[key] = self.counter

    @rule(key=KEYS)
    def pop(self, key: str) -> None:
        assert self.map.pop(key) == self.model.pop(key, None)

    @rule(key=KEYS)
    def move_to_end(self, key: str) -> None:
        """What the sidecar does with a group a record appended: out, then in at the end."""
        self.map.pop(key)
        self.model.pop(key, None)
        self.set(key)

    @rule()
    def view(self) -> None:
        self.views.append((self.map.view(), list(self.model.values())))

    @rule(changes=st.integers(min_value=1, max_value=3 * _SLACK))
    def churn(self, changes: int) -> None:
        """Enough changes to one key, each in a new version, to make the map compact."""
        for _ in range(changes):
            self.set("g0")
            self.map.view()

    @invariant()
    def every_view_is_as_taken(self) -> None:
        for taken, values in self.views:
            assert list(taken) == values
            assert len(taken) == len(values)

    @invariant()
    def the_map_is_the_dict(self) -> None:
        assert list(self.map.items()) == list(self.model.items())
        assert len(self.map) == len(self.model)
        assert all(self.map[key] == value and key in self.map for key, value in self.model.items())
        assert [self.map.get(key) for key in sorted(KEYS_ALL)] == [
            self.model.get(key) for key in sorted(KEYS_ALL)
        ]

    @invariant()
    def garbage_stays_bounded(self) -> None:
        held = len(self.map._cells) + len(self.map._moved or ())
        assert held <= 3 * len(KEYS_ALL) + 2 * _SLACK


TestVersionedMap = VersionedMapMachine.TestCase
TestVersionedMap.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_a_view_is_not_a_copy() -> None:
    """Taking a view costs nothing per key: it holds the map's own list of cells."""
    mapping = VersionedMap((f"g{i}", i) for i in range(1000))
    taken = mapping.view()
    ((cells, start, stop),) = taken._segments
    assert cells is mapping._cells and (start, stop) == (0, 1000)
    mapping["g5"] = -1
    mapping.pop("g6")
    mapping["g6"] = 6
    assert list(taken) == list(range(1000))
    assert list(mapping.view()) == [*range(5), -1, *range(7, 1000), 6]


def test_no_change_moves_more_than_a_few_keys() -> None:
    """The garbage is left behind a few keys per change, never all at once: no change (and
    so no snapshot) pays O(keys). A whole compaction in one change renewed every cell."""
    mapping = VersionedMap((f"g{i}", i) for i in range(300))
    moves = []
    for round_ in range(3 * (300 + _SLACK)):
        cells = {key: id(cell) for key, cell in mapping._index.items()}
        mapping.view()
        mapping["g7"] = round_
        moves.append(sum(id(cell) != cells[key] for key, cell in mapping._index.items()))
    assert max(moves) <= _MOVES_PER_CHANGE + 1  # g7's own new cell besides
    assert sum(moves) >= 2 * 300  # the live keys did move (twice), a few at a time
    assert list(mapping.view()) == [*range(7), 3 * (300 + _SLACK) - 1, *range(8, 300)]
