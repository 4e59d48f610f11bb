"""DeferredDeletionDataPlane: a clear waits until no retained checkpoint can need the rows.

Epoch arithmetic: a deletion requested while ``e`` checkpoints have committed is performed
by the commit that makes ``epoch - keep >= e``, i.e. by the ``keep``-th commit after the
request. Everything else goes straight to the inner store.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rollout_recovery.control._deferred import DeferredDeletionDataPlane
from rollout_recovery.dataplane import (
    DataPlaneCheckpointBarrier,
    DataPlaneMutationCut,
    MemoryDataPlane,
    Row,
)
from rollout_recovery.errors import DeadCutError, InvalidRowError, MissingRowError

P = "staging"


def make_row(seed: int) -> Row:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    return Row(
        token_ids=rng.integers(0, 1000, n, dtype=np.int32),
        token_mask=np.ones(n, dtype=np.float32),
        logprobs=-rng.random(n, dtype=np.float32),
        metadata={"seed": seed},
    )


def seed_of(store: Any, partition: str, key: str) -> int:
    (row,) = store.get(partition, [key])
    return int(row.metadata["seed"])


class RaisingCut:
    """A cut double whose section has exited."""

    def __init__(self) -> None:
        self.checks = 0

    def require_live(self) -> None:
        self.checks += 1
        raise DeadCutError("data-plane mutation cut is no longer active")


class LiveCut:
    def __init__(self) -> None:
        self.checks = 0

    def require_live(self) -> None:
        self.checks += 1


def exited_barrier_cut() -> DataPlaneMutationCut:
    """A real cut whose mutation section has exited."""

    async def take() -> DataPlaneMutationCut:
        barrier = DataPlaneCheckpointBarrier()
        async with barrier.mutation("sample_clears") as cut:
            assert cut.is_live
        return cut

    cut = asyncio.run(take())
    assert not cut.is_live
    return cut


def store_with(
    keys: list[str], *, keep: int, committed_epochs: int = 0
) -> DeferredDeletionDataPlane:
    store = DeferredDeletionDataPlane(
        MemoryDataPlane(), keep=keep, committed_epochs=committed_epochs
    )
    store.put(P, {key: make_row(i) for i, key in enumerate(keys)})
    return store


# -- construction ---------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [0, -1, -10])
def test_keep_below_one_is_refused(keep: int) -> None:
    with pytest.raises(ValueError, match="keep must be >= 1"):
        DeferredDeletionDataPlane(MemoryDataPlane(), keep=keep)


def test_keep_of_one_is_accepted() -> None:
    store = DeferredDeletionDataPlane(MemoryDataPlane(), keep=1)
    assert store.pending_count == 0


# -- the deferral ---------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [1, 2, 3, 5])
@pytest.mark.parametrize("committed_epochs", [0, 4])
def test_clear_is_performed_by_the_keep_th_commit_after_the_request(
    keep: int, committed_epochs: int
) -> None:
    store = store_with(["a", "b"], keep=keep, committed_epochs=committed_epochs)
    store.clear(P, ["a"])
    assert store.pending_count == 1
    for _ in range(keep - 1):
        # Still owned by a retained checkpoint: readable through the wrapper and the inner.
        assert seed_of(store, P, "a") == 0
        assert store.inner.keys(P) == ["a", "b"]
        assert store.checkpoint_committed() == 0
    assert seed_of(store, P, "a") == 0
    assert store.checkpoint_committed() == 1
    assert store.pending_count == 0
    assert store.keys(P) == ["b"]
    with pytest.raises(MissingRowError):
        store.get(P, ["a"])
    # Nothing else goes on later commits.
    for _ in range(keep + 2):
        assert store.checkpoint_committed() == 0
    assert store.keys(P) == ["b"]


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_a_restore_deletes_at_once_only_what_no_retained_checkpoint_needs(keep: int) -> None:
    """Issue 24 item 4: rows only an older retained checkpoint needs wait until ``keep``
    checkpoints after the restore have committed (every checkpoint retained at the
    restore has then been pruned); the rest go at once."""
    store = store_with(["a", "b", "c", "d"], keep=keep)
    cut = LiveCut()
    deferred = store.clear_unowned(P, ["a", "b", "c"], retained={"b", "x"}, cut=cut)
    assert deferred == ["b"] and cut.checks >= 1
    assert store.inner.keys(P) == ["b", "d"]
    for _ in range(keep - 1):
        assert store.checkpoint_committed() == 0
        assert store.inner.keys(P) == ["b", "d"]
    assert store.checkpoint_committed() == 1
    assert store.inner.keys(P) == ["d"]


def test_a_restore_with_a_dead_cut_deletes_nothing() -> None:
    store = store_with(["a", "b"], keep=2)
    with pytest.raises(DeadCutError):
        store.clear_unowned(P, ["a", "b"], retained={"b"}, cut=exited_barrier_cut())
    assert store.inner.keys(P) == ["a", "b"] and store.pending_count == 0


def test_requests_at_different_epochs_fall_due_at_different_commits() -> None:
    store = store_with(["a", "b", "c"], keep=2)
    store.clear(P, ["a"])  # epoch 0: due at commit 2
    assert store.checkpoint_committed() == 0
    store.clear(P, ["b", "c"])  # epoch 1: due at commit 3
    assert store.keys(P) == ["a", "b", "c"]
    assert store.checkpoint_committed() == 1
    assert store.keys(P) == ["b", "c"]
    assert store.checkpoint_committed() == 2
    assert store.keys(P) == []
    assert store.pending_count == 0


def test_a_repeated_request_keeps_the_earliest_epoch() -> None:
    store = store_with(["a"], keep=2)
    store.clear(P, ["a"])  # epoch 0
    store.checkpoint_committed()  # epoch 1
    store.clear(P, ["a"])  # again: must not push the deletion back to epoch 1
    assert store.pending_count == 1
    assert store.checkpoint_committed() == 1
    assert store.keys(P) == []


def test_pending_is_per_partition() -> None:
    store = DeferredDeletionDataPlane(MemoryDataPlane(), keep=1)
    store.put("x", {"k": make_row(1)})
    store.put("y", {"k": make_row(2)})
    store.clear("x", ["k"])
    store.put("y", {"k": make_row(3)})  # a re-put in another partition does not cancel it
    assert store.pending_count == 1
    assert store.checkpoint_committed() == 1
    assert store.keys("x") == []
    assert seed_of(store, "y", "k") == 3


def test_clear_of_a_missing_key_is_harmless() -> None:
    store = store_with(["a"], keep=1)
    store.clear(P, ["never-stored"])
    store.clear("other-partition", ["a"])
    assert store.checkpoint_committed() == 2
    assert store.keys(P) == ["a"]


def test_clear_accepts_any_iterable_of_keys() -> None:
    store = store_with(["a", "b", "c"], keep=1)
    store.clear(P, (key for key in ["a", "c"]))
    assert store.pending_count == 2
    assert store.checkpoint_committed() == 2
    assert store.keys(P) == ["b"]


# -- a re-put row is live again ---------------------------------------------------------------


def test_a_re_put_key_is_no_longer_pending() -> None:
    store = store_with(["a", "b"], keep=2)
    store.clear(P, ["a", "b"])
    store.put(P, {"a": make_row(10)})
    assert store.pending_count == 1
    for _ in range(5):
        store.checkpoint_committed()
    assert store.keys(P) == ["a"]
    assert seed_of(store, P, "a") == 10


def test_a_re_put_key_cleared_again_waits_from_the_new_request() -> None:
    store = store_with(["a"], keep=2)
    store.clear(P, ["a"])  # epoch 0
    store.checkpoint_committed()  # epoch 1
    store.put(P, {"a": make_row(7)})
    store.clear(P, ["a"])  # epoch 1: due at commit 3, not 2
    assert store.checkpoint_committed() == 0
    assert seed_of(store, P, "a") == 7
    assert store.checkpoint_committed() == 1
    assert store.keys(P) == []


def test_a_refused_put_leaves_the_key_pending() -> None:
    store = store_with(["a"], keep=1)
    store.clear(P, ["a"])
    with pytest.raises(DeadCutError):
        store.put(P, {"a": make_row(5)}, cut=RaisingCut())
    assert store.pending_count == 1
    assert store.checkpoint_committed() == 1
    assert store.keys(P) == []


# -- cuts and argument checks ---------------------------------------------------------------


def test_a_dead_barrier_cut_is_refused_before_anything_is_recorded() -> None:
    cut = exited_barrier_cut()
    store = store_with(["a"], keep=1)
    with pytest.raises(DeadCutError):
        store.clear(P, ["a"], cut=cut)
    assert store.pending_count == 0
    assert store.checkpoint_committed() == 0
    assert store.keys(P) == ["a"]


def test_a_fake_dead_cut_is_refused_before_anything_is_recorded() -> None:
    cut = RaisingCut()
    store = store_with(["a"], keep=1)
    with pytest.raises(DeadCutError):
        store.clear(P, ["a"], cut=cut)
    assert cut.checks == 1
    assert store.pending_count == 0
    assert store.checkpoint_committed() == 0
    assert store.keys(P) == ["a"]


def test_a_live_barrier_cut_is_accepted() -> None:
    store = store_with(["a"], keep=1)

    async def clear_inside_a_section() -> None:
        barrier = DataPlaneCheckpointBarrier()
        async with barrier.mutation("sample_clears") as cut:
            store.clear(P, ["a"], cut=cut)

    asyncio.run(clear_inside_a_section())
    assert store.pending_count == 1
    assert store.checkpoint_committed() == 1


def test_the_cut_is_checked_on_clear_put_snapshot_and_restore(tmp_path: Any) -> None:
    store = store_with(["a"], keep=1)
    cut = LiveCut()
    store.clear(P, ["a"], cut=cut)
    store.put(P, {"b": make_row(2)}, cut=cut)
    store.snapshot(tmp_path / "snap", cut=cut)
    store.restore(tmp_path / "snap", cut=cut)
    assert cut.checks == 4


@pytest.mark.parametrize("keys", ["a", "ab"])
def test_a_bare_string_as_keys_is_refused(keys: str) -> None:
    store = store_with(["a", "b"], keep=1)
    with pytest.raises(TypeError, match="str"):
        store.clear(P, keys)
    assert store.pending_count == 0
    assert store.checkpoint_committed() == 0
    assert store.keys(P) == ["a", "b"]


@pytest.mark.parametrize("bad", ["", None])
def test_a_key_the_store_would_refuse_is_refused_at_clear(bad: Any) -> None:
    """BUG: ``clear`` records any key; the inner store refuses it only at the commit.

    ``DeferredDeletionDataPlane.clear`` (src/rollout_recovery/control/_deferred.py, the
    loop at the end of ``clear``) validates neither the partition nor the keys. An invalid
    key is accepted, and then every ``checkpoint_committed()`` raises ``InvalidRowError``
    from ``inner.clear`` -- after the checkpoint has committed -- and the valid keys of
    the same partition are never deleted. Every backend refuses such a clear at once.
    """
    store = store_with(["a"], keep=1)
    with pytest.raises(InvalidRowError):
        store.clear(P, ["a", bad])
    assert store.pending_count == 0
    store.clear(P, ["a"])
    assert store.checkpoint_committed() == 1


# -- pass-through -----------------------------------------------------------------------------


def test_restore_drops_pending_deletions_and_replaces_the_content(tmp_path: Any) -> None:
    store = store_with(["a", "b"], keep=1)
    store.snapshot(tmp_path / "snap")
    store.put(P, {"c": make_row(3)})
    store.clear(P, ["a"])
    store.restore(tmp_path / "snap")
    assert store.pending_count == 0
    assert store.checkpoint_committed() == 0
    assert store.keys(P) == ["a", "b"]


def test_reads_go_to_the_inner_store() -> None:
    inner = MemoryDataPlane()
    store = DeferredDeletionDataPlane(inner, keep=1)
    inner.put(P, {"z": make_row(9)})
    assert store.keys(P) == ["z"]
    assert seed_of(store, P, "z") == 9
    store.close()
    with pytest.raises(Exception, match="closed"):
        inner.keys(P)


# -- stateful model -------------------------------------------------------------------------

PARTITIONS = st.sampled_from(["p", "q"])
KEYS = st.sampled_from(["k0", "k1", "k2", "k3"])


class DeferredMachine(RuleBasedStateMachine):
    """Model: the rows each key holds, and a list of (partition, key, epoch) requests."""

    def __init__(self) -> None:
        super().__init__()
        self.store: DeferredDeletionDataPlane | None = None
        self.rows: dict[tuple[str, str], int] = {}
        self.requests: list[tuple[str, str, int]] = []
        self.epoch = 0
        self.keep = 1
        self.next_seed = 0

    @initialize(keep=st.integers(1, 3), start=st.integers(0, 3))
    def start(self, keep: int, start: int) -> None:
        self.keep = keep
        self.epoch = start
        self.store = DeferredDeletionDataPlane(MemoryDataPlane(), keep=keep, committed_epochs=start)

    @rule(partition=PARTITIONS, keys=st.lists(KEYS, min_size=1, max_size=3, unique=True))
    def put(self, partition: str, keys: list[str]) -> None:
        assert self.store is not None
        batch = {}
        for key in keys:
            self.next_seed += 1
            batch[key] = make_row(self.next_seed)
            self.rows[(partition, key)] = self.next_seed
        self.store.put(partition, batch)
        self.requests = [
            r for r in self.requests if (r[0], r[1]) not in {(partition, k) for k in keys}
        ]

    @rule(partition=PARTITIONS, keys=st.lists(KEYS, max_size=3))
    def clear(self, partition: str, keys: list[str]) -> None:
        assert self.store is not None
        self.store.clear(partition, keys)
        self.requests += [(partition, key, self.epoch) for key in keys]

    @rule()
    def commit(self) -> None:
        assert self.store is not None
        self.epoch += 1
        due = {(p, k) for p, k, e in self.requests if self.epoch - self.keep >= e}
        self.requests = [r for r in self.requests if (r[0], r[1]) not in due]
        for target in due:
            self.rows.pop(target, None)
        assert self.store.checkpoint_committed() == len(due)

    @precondition(lambda self: self.store is not None)
    @invariant()
    def inner_holds_exactly_the_model_rows(self) -> None:
        assert self.store is not None
        for partition in ("p", "q"):
            expected = sorted(k for p, k in self.rows if p == partition)
            assert self.store.inner.keys(partition) == expected
            for key in expected:
                assert seed_of(self.store.inner, partition, key) == self.rows[(partition, key)]
        assert self.store.pending_count == len({(p, k) for p, k, _ in self.requests})


DeferredMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDeferredMachine = DeferredMachine.TestCase


def test_a_row_cleared_while_its_checkpoint_is_being_written_outlives_that_checkpoint() -> None:
    # The checkpoint is numbered inside its hold, then written while the run goes on: a
    # row it captured and that is cleared during the write must survive its commit
    # (found by the auditor on a full-disk run: the write was slow, the rows went early).
    store = store_with(["a"], keep=1)
    number = store.checkpoint_captured()
    store.clear(P, ["a"])
    assert store.checkpoint_committed(number) == 0
    assert store.keys(P) == ["a"]
    assert store.checkpoint_committed() == 1
    assert store.keys(P) == []
