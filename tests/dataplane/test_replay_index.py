"""ReplayIndex: lifecycle, cut discipline, refusals that change nothing, state and digest."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from dataplane_support import FakeCut, dead_cut, make_row
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_recovery.dataplane import MemoryDataPlane, ReplayIndex, SqliteDataPlane
from rollout_recovery.dataplane._replay import CANONICAL_PARTITION
from rollout_recovery.errors import (
    DeadCutError,
    InvalidStateError,
    InvalidTransitionError,
    UnknownGroupError,
)

N = 4


def row_keys(group_id: str) -> list[str]:
    return [f"{group_id}_g{i}" for i in range(N)]


def publish(
    index: ReplayIndex,
    store: MemoryDataPlane | SqliteDataPlane,
    cut: FakeCut,
    group_id: str,
    *,
    target_step: int = 0,
    versions: tuple[int, int] = (1, 2),
    metrics: dict[str, float] | None = None,
) -> None:
    """What the finalizer does under one group_commits cut: put rows, then commit."""
    index.reserve(cut, group_id)
    keys = row_keys(group_id)
    store.put(CANONICAL_PARTITION, {k: make_row(i) for i, k in enumerate(keys)}, cut=cut)
    index.commit(
        cut,
        group_id,
        keys,
        target_step=target_step,
        min_weight_version=versions[0],
        max_weight_version=versions[1],
        metrics=metrics,
    )


@pytest.fixture
def store() -> MemoryDataPlane:
    return MemoryDataPlane()


@pytest.fixture
def index(store: MemoryDataPlane) -> ReplayIndex:
    return ReplayIndex(data_plane=store, group_size=N)


@pytest.fixture
def cut() -> FakeCut:
    return FakeCut()


def snapshot_of(index: ReplayIndex) -> tuple[Any, ...]:
    return (
        index.state_dict(),
        index.reserved_group_ids(),
        [(g.group_id, g.claimed_step) for g in map(index.group, index.group_ids())],
    )


# ---- lifecycle ------------------------------------------------------------------------


def test_full_lifecycle(index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut) -> None:
    publish(index, store, cut, "p1", target_step=3, versions=(5, 7))
    publish(index, store, cut, "p0", target_step=3)
    publish(index, store, cut, "p2", target_step=4)
    assert index.group_ids() == ["p0", "p1", "p2"]
    assert [g.group_id for g in index.ready_groups(3)] == ["p0", "p1"]
    group = index.group("p1")
    assert group.row_keys == tuple(row_keys("p1"))
    assert (group.min_weight_version, group.max_weight_version) == (5, 7)

    claimed = index.claim(cut, 3, ["p1", "p0"])
    assert [g.claimed_step for g in claimed] == [3, 3]
    assert [g.group_id for g in index.ready_groups()] == ["p2"]
    assert len(index) == 3

    index.clear(cut, ["p0", "p1"])
    assert index.group_ids() == ["p2"]
    assert store.keys(CANONICAL_PARTITION) == row_keys("p2")
    assert index.row_keys() == row_keys("p2")


def test_release_returns_claims_to_ready(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut
) -> None:
    publish(index, store, cut, "p0")
    index.claim(cut, 0, ["p0"])
    index.release(cut, ["p0"])
    assert [g.group_id for g in index.ready_groups(0)] == ["p0"]
    with pytest.raises(InvalidTransitionError, match="not claimed"):
        index.release(cut, ["p0"])


def test_evict_removes_ready_groups_and_rows(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut
) -> None:
    publish(index, store, cut, "p0")
    publish(index, store, cut, "p1")
    index.claim(cut, 0, ["p1"])
    with pytest.raises(InvalidTransitionError, match="claimed"):
        index.evict(cut, ["p0", "p1"])
    assert index.group_ids() == ["p0", "p1"]
    index.evict(cut, ["p0"])
    assert index.group_ids() == ["p1"]
    assert store.keys(CANONICAL_PARTITION) == row_keys("p1")


def test_abort_drops_only_unready_slots(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut
) -> None:
    index.reserve(cut, "p0")
    publish(index, store, cut, "p1")
    assert index.abort(cut, "p0") is True
    assert index.abort(cut, "p0") is False
    assert index.abort(cut, "p1") is False
    assert index.abort(cut, "never") is False
    assert index.reserved_group_ids() == []
    assert index.group_ids() == ["p1"]
    index.reserve(cut, "p0")  # an aborted id may be reserved again


def test_clear_failure_keeps_ownership(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(index, store, cut, "p0")
    index.claim(cut, 0, ["p0"])

    def broken_clear(partition: str, keys: Iterable[str], *, cut: object = None) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(store, "clear", broken_clear)
    with pytest.raises(OSError):
        index.clear(cut, ["p0"])
    assert index.group("p0").claimed_step == 0
    monkeypatch.undo()
    index.clear(cut, ["p0"])  # a retry succeeds
    assert len(index) == 0 and store.keys(CANONICAL_PARTITION) == []


# ---- cuts and refusals ----------------------------------------------------------------


def test_every_mutation_requires_a_live_cut(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut
) -> None:
    publish(index, store, cut, "ready")
    publish(index, store, cut, "claimed")
    index.claim(cut, 0, ["claimed"])
    index.reserve(cut, "slot")
    before = snapshot_of(index)
    rows_before = store.keys(CANONICAL_PARTITION)
    dead = dead_cut()
    calls: list[Callable[[], object]] = [
        lambda: index.reserve(dead, "new"),
        lambda: index.commit(
            dead,
            "slot",
            row_keys("slot"),
            target_step=0,
            min_weight_version=0,
            max_weight_version=0,
        ),
        lambda: index.abort(dead, "slot"),
        lambda: index.claim(dead, 0, ["ready"]),
        lambda: index.release(dead, ["claimed"]),
        lambda: index.clear(dead, ["claimed"]),
        lambda: index.evict(dead, ["ready"]),
    ]
    for call in calls:
        with pytest.raises(DeadCutError):
            call()
    assert dead.checks == len(calls)
    assert snapshot_of(index) == before
    assert store.keys(CANONICAL_PARTITION) == rows_before


def test_clear_passes_the_cut_to_the_data_plane(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut
) -> None:
    publish(index, store, cut, "p0")
    index.claim(cut, 0, ["p0"])
    seen: list[object] = []
    original = store.clear

    def spy(partition: str, keys: Iterable[str], *, cut: Any = None) -> None:
        seen.append(cut)
        original(partition, keys, cut=cut)

    store.clear = spy  # type: ignore[method-assign]
    index.clear(cut, ["p0"])
    assert seen == [cut]


@pytest.mark.parametrize(
    ("keys", "kwargs", "match"),
    [
        (row_keys("slot")[:3], {}, "commits 3 row keys, expected exactly 4"),
        (["a", "b", "a", "c"], {}, "repeats row keys \\['a'\\]"),
        (row_keys("other"), {}, "already owned by other groups"),
        (["a", "", "b", "c"], {}, "non-empty str"),
        (
            row_keys("slot"),
            {"min_weight_version": 5, "max_weight_version": 4},
            "max_weight_version must be an int >= 5",
        ),
        (row_keys("slot"), {"target_step": -1}, "target_step must be an int >= 0"),
        (row_keys("slot"), {"metrics": {"x": "high"}}, "metrics must map str to float"),
    ],
)
def test_refused_commit_changes_nothing(
    index: ReplayIndex,
    store: MemoryDataPlane,
    cut: FakeCut,
    keys: list[str],
    kwargs: dict[str, Any],
    match: str,
) -> None:
    publish(index, store, cut, "other")
    index.reserve(cut, "slot")
    before = snapshot_of(index)
    arguments: dict[str, Any] = {
        "target_step": 0,
        "min_weight_version": 1,
        "max_weight_version": 1,
        **kwargs,
    }
    with pytest.raises(InvalidTransitionError, match=match) as caught:
        index.commit(cut, "slot", keys, **arguments)
    assert caught.value.group_id == "slot"
    assert snapshot_of(index) == before


def test_transition_refusals_name_the_group(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut
) -> None:
    publish(index, store, cut, "p0")
    with pytest.raises(InvalidTransitionError, match="duplicate live group_id='p0'"):
        index.reserve(cut, "p0")
    with pytest.raises(InvalidTransitionError, match=r"'p0'.*already committed"):
        index.commit(
            cut, "p0", row_keys("p0"), target_step=0, min_weight_version=0, max_weight_version=0
        )
    with pytest.raises(InvalidTransitionError, match=r"'p9'.*not reserved"):
        index.commit(
            cut, "p9", row_keys("p9"), target_step=0, min_weight_version=0, max_weight_version=0
        )
    with pytest.raises(UnknownGroupError, match="'nope'") as caught:
        index.claim(cut, 0, ["p0", "nope"])
    assert caught.value.group_id == "nope"
    assert index.group("p0").claimed_step is None  # all or nothing
    with pytest.raises(InvalidTransitionError, match="duplicate group ids"):
        index.claim(cut, 0, ["p0", "p0"])
    index.claim(cut, 0, ["p0"])
    with pytest.raises(InvalidTransitionError, match="already claimed"):
        index.claim(cut, 1, ["p0"])
    with pytest.raises(UnknownGroupError):
        index.group("nope")
    with pytest.raises(TypeError):
        index.clear(cut, "p0")


# ---- state, digest, restore -----------------------------------------------------------


def test_state_round_trip(index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut) -> None:
    publish(index, store, cut, "p1", target_step=2, versions=(3, 4), metrics={"reward": 0.5})
    publish(index, store, cut, "p0", target_step=1)
    index.reserve(cut, "unready")
    state = index.state_dict()
    assert state["schema_version"] == 1
    assert [g["group_id"] for g in state["groups"]] == ["p0", "p1"]  # no unready slots
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(state))
    restored = ReplayIndex.from_state_dict(wire, data_plane=store, group_size=N)
    assert restored.state_dict() == state
    assert restored.group("p1").metrics == {"reward": 0.5}
    assert restored.reserved_group_ids() == []
    restored.reserve(cut, "p2")  # fully usable afterwards
    restored.claim(cut, 1, ["p0"])


def test_claimed_groups_are_saved_as_ready(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut
) -> None:
    publish(index, store, cut, "p0")
    before = index.state_dict()
    index.claim(cut, 0, ["p0"])
    assert index.state_dict() == before
    restored = ReplayIndex.from_state_dict(index.state_dict(), data_plane=store)
    assert restored.group("p0").claimed_step is None


def test_digest_ignores_order_and_metrics(store: MemoryDataPlane, cut: FakeCut) -> None:
    first = ReplayIndex(data_plane=store, group_size=N)
    second = ReplayIndex(data_plane=MemoryDataPlane(), group_size=N)
    publish(first, store, cut, "a", metrics={"x": 1.0})
    publish(first, store, cut, "b")
    other_store = MemoryDataPlane()
    publish(second, other_store, cut, "b", metrics={"y": 2.0})
    publish(second, other_store, cut, "a")
    assert first.state_dict()["digest"] == second.state_dict()["digest"]
    # A hand-built state with shuffled key order and group order loads and keeps the digest.
    state = first.state_dict()
    shuffled = {key: state[key] for key in reversed(list(state))}
    shuffled["groups"] = [
        {key: group[key] for key in reversed(list(group))} for group in reversed(state["groups"])
    ]
    restored = ReplayIndex.from_state_dict(shuffled, data_plane=store)
    assert restored.state_dict()["digest"] == state["digest"]


def test_digest_changes_with_identity(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut
) -> None:
    publish(index, store, cut, "p0", target_step=1)
    state = index.state_dict()
    for path, value in [
        (("groups", 0, "target_step"), 2),
        (("groups", 0, "min_weight_version"), 0),
        (("groups", 0, "row_keys", 0), "p0_gX"),
        (("group_size",), 5),
    ]:
        tampered = copy.deepcopy(state)
        target: Any = tampered
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        with pytest.raises(InvalidStateError, match="digest mismatch") as caught:
            ReplayIndex.from_state_dict(tampered, data_plane=store)
        assert caught.value.path == "$.digest"


@pytest.mark.parametrize(
    ("mutate", "match", "path"),
    [
        (lambda s: s.pop("digest"), "digest", None),
        (lambda s: s.update(extra=1), "extra", None),
        (lambda s: s["groups"][0].update(row_keys="p0_g0"), "row_keys", "$.groups[0].row_keys"),
        (
            lambda s: s["groups"][0].update(target_step="1"),
            "target_step",
            "$.groups[0].target_step",
        ),
        (lambda s: s.update(schema_version=2), "schema_version 2", "$.schema_version"),
    ],
)
def test_malformed_state_is_refused_with_a_path(
    index: ReplayIndex,
    store: MemoryDataPlane,
    cut: FakeCut,
    mutate: Any,
    match: str,
    path: str | None,
) -> None:
    publish(index, store, cut, "p0")
    state = index.state_dict()
    mutate(state)
    with pytest.raises(InvalidStateError, match=match) as caught:
        ReplayIndex.from_state_dict(state, data_plane=store)
    if path is not None:
        assert caught.value.path == path


def test_group_size_mismatch(index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut) -> None:
    publish(index, store, cut, "p0")
    with pytest.raises(InvalidStateError, match="group_size=4, expected 8"):
        ReplayIndex.from_state_dict(index.state_dict(), data_plane=store, group_size=8)


def test_inventory_missing_rows_named(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut
) -> None:
    for i in range(4):
        publish(index, store, cut, f"p{i}")
    store.clear(CANONICAL_PARTITION, row_keys("p1") + row_keys("p2") + row_keys("p3"))
    with pytest.raises(InvalidStateError) as caught:
        ReplayIndex.from_state_dict(index.state_dict(), data_plane=store)
    message = str(caught.value)
    assert "missing rows" in message and "total=12" in message
    assert "p1_g0" in message and "p3_g1" in message and "p3_g2" not in message  # 10 listed
    assert "unindexed" not in message


def test_inventory_extra_rows_named(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut
) -> None:
    publish(index, store, cut, "p0")
    store.put(CANONICAL_PARTITION, {"orphan_g0": make_row(1)})
    store.put("staging", {"not/canonical": make_row(2)})  # other partitions do not count
    with pytest.raises(InvalidStateError, match=r"unindexed rows \['orphan_g0'\] \(total=1\)"):
        ReplayIndex.from_state_dict(index.state_dict(), data_plane=store)


def test_inventory_both_directions(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut
) -> None:
    publish(index, store, cut, "p0")
    store.clear(CANONICAL_PARTITION, ["p0_g3"])
    store.put(CANONICAL_PARTITION, {"stray": make_row(1)})
    with pytest.raises(InvalidStateError, match=r"missing rows \['p0_g3'\].*unindexed rows"):
        ReplayIndex.from_state_dict(index.state_dict(), data_plane=store)


def test_state_survives_a_sqlite_snapshot_restore(tmp_path: Path, cut: FakeCut) -> None:
    """The checkpoint path: index state and data-plane snapshot taken together, restored
    into a fresh process-like setup."""
    with SqliteDataPlane(tmp_path / "live.sqlite3") as live:
        index = ReplayIndex(data_plane=live, group_size=N)
        publish(index, live, cut, "p0")
        publish(index, live, cut, "p1")
        index.claim(cut, 0, ["p1"])
        state = msgspec.msgpack.encode(index.state_dict())
        live.snapshot(tmp_path / "snap", cut=cut)
        index.clear(cut, ["p1"])  # after the checkpoint; the restore rolls it back
    with SqliteDataPlane(tmp_path / "restarted.sqlite3") as fresh:
        fresh.restore(tmp_path / "snap", cut=cut)
        restored = ReplayIndex.from_state_dict(msgspec.msgpack.decode(state), data_plane=fresh)
        assert [g.group_id for g in restored.ready_groups()] == ["p0", "p1"]


def test_a_bare_string_of_row_keys_is_refused_not_taken_as_one_key(store: MemoryDataPlane) -> None:
    from rollout_recovery.errors import BareStringError

    index = ReplayIndex(data_plane=store, group_size=1)
    cut = FakeCut()
    index.reserve(cut, "g")
    before = snapshot_of(index)
    with pytest.raises(BareStringError, match="row_keys must be a collection of str"):
        index.commit(cut, "g", "g_g0", target_step=0, min_weight_version=0, max_weight_version=0)
    assert snapshot_of(index) == before


def test_metrics_by_group_is_the_sidecar_copy_of_what_the_index_owns(
    index: ReplayIndex, store: MemoryDataPlane, cut: FakeCut
) -> None:
    publish(index, store, cut, "p1", metrics={"reward": 0.5})
    publish(index, store, cut, "p0")
    copied = index.metrics_by_group()
    assert copied == {"p0": {}, "p1": {"reward": 0.5}}
    copied["p1"]["reward"] = 9.0  # a fresh copy: the index keeps its own
    assert index.metrics_by_group()["p1"] == {"reward": 0.5}
    restored = ReplayIndex.from_state_dict(index.state_dict(), data_plane=store, group_size=N)
    assert restored.metrics_by_group() == {"p0": {}, "p1": {"reward": 0.5}}


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["publish", "claim", "release", "clear", "evict", "encode"]),
            st.integers(0, 2),
            st.floats(allow_nan=True, allow_infinity=False),
        ),
        max_size=40,
    )
)
def test_encoded_state_is_the_state_dict_encoded(steps: list[tuple[str, int, float]]) -> None:
    """``encoded_state`` keeps each group's entries between calls (issue 28, item 5): after
    any sequence of calls its bytes are the encoded ``state_dict()``, digest included."""
    store, cut = MemoryDataPlane(), FakeCut()
    index = ReplayIndex(data_plane=store, group_size=N)
    for action, number, metric in steps:
        group_id = f"g{number}"
        if action == "encode":
            assert index.encoded_state() == msgspec.msgpack.encode(index.state_dict())
            continue
        with contextlib.suppress(InvalidTransitionError):
            if action == "publish":
                publish(index, store, cut, group_id, target_step=number % 3, metrics={"m": metric})
            elif action == "claim":
                index.claim(cut, number % 2, [group_id])
            elif action == "release":
                index.release(cut, [group_id])
            elif action == "clear":
                index.clear(cut, [group_id])
            else:
                index.evict(cut, [group_id])
    assert index.encoded_state() == msgspec.msgpack.encode(index.state_dict())


def test_a_group_committed_again_is_encoded_again(store: MemoryDataPlane, cut: FakeCut) -> None:
    index = ReplayIndex(data_plane=store, group_size=N)
    publish(index, store, cut, "g", metrics={"m": 1.0})
    index.encoded_state()
    index.claim(cut, 0, ["g"])
    index.clear(cut, ["g"])
    publish(index, store, cut, "g", target_step=5, metrics={"m": 2.0})
    assert index.encoded_state() == msgspec.msgpack.encode(index.state_dict())
