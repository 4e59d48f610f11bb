"""The DataPlane contract on Ray shard actors, plus what sharding adds: routing by group,
durability across a SIGKILLed shard, and fences on dead writers."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster_support import kill_and_await_death, layout
from dataplane_support import assert_rows_equal, make_row
from hypothesis import given
from hypothesis import strategies as st
from store_contract import MACHINE_SETTINGS, StoreContract, StoreFactory, StoreMachine

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.cluster._routing import shard_of
from rollout_recovery.cluster._sharded_plane import RayShardedDataPlane
from rollout_recovery.dataplane import DataPlane, Row, SqliteDataPlane
from rollout_recovery.dataplane._replay import CANONICAL_PARTITION
from rollout_recovery.errors import FencedWriterError, InvalidArgumentError

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NewPlane = Callable[..., RayShardedDataPlane]


class TestRayContract(StoreContract):
    @pytest.fixture
    def new_store(self, new_plane: NewPlane) -> StoreFactory:
        return new_plane


class RayMachine(StoreMachine):
    def make_store(self, directory: Path) -> DataPlane:
        # The same two shard actors for every example, on fresh files.
        plane = RayShardedDataPlane.start(layout(directory / "shards", 2, prefix="machine"))
        _MACHINE_PLANES.append(plane)  # keep the owning handles alive
        return plane


_MACHINE_PLANES: list[RayShardedDataPlane] = []


TestRayMachine = RayMachine.TestCase
TestRayMachine.settings = MACHINE_SETTINGS


# ------------------------------------------------------------------------------ routing


@given(
    group=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,12}\Z"),
    index=st.integers(0, 63),
    attempt=st.from_regex(r"\A[0-9a-f]{1,12}\Z"),
    call=st.from_regex(r"\A[a-z]{1,6}-[0-9a-f]{4}\Z"),
    shards=st.integers(1, 16),
)
def test_every_row_of_a_group_routes_to_one_shard(
    group: str, index: int, attempt: str, call: str, shards: int
) -> None:
    canonical = f"{group}_g{index}"
    staged = f"{group}_g{index}_a{attempt}/{call}"
    sibling = f"{group}_g{index + 1}"
    assert shard_of(canonical, shards) == shard_of(staged, shards) == shard_of(sibling, shards)


def test_rows_spread_over_shards_and_are_on_disk_per_shard(new_plane: NewPlane) -> None:
    plane = new_plane(3)
    rows = {f"grp{i}_g0": make_row(i) for i in range(30)}
    plane.put(CANONICAL_PARTITION, rows)
    per_file = []
    for index in range(3):
        plane._call(index, "close")  # release the file; the next call restarts the shard
        with SqliteDataPlane(plane.layout.path(index)) as store:
            per_file.append(set(store.keys(CANONICAL_PARTITION)))
    assert set().union(*per_file) == set(rows)
    assert all(per_file) and sum(len(keys) for keys in per_file) == len(rows)


# ------------------------------------------------------------------------- durability


def test_a_put_that_returned_survives_a_sigkill_of_its_shard(new_plane: NewPlane) -> None:
    plane = new_plane(2)
    rows = {f"g{i}_g0": make_row(i) for i in range(10)}
    plane.put(CANONICAL_PARTITION, rows)
    for index in range(2):
        os.kill(plane.shard_pid(index), signal.SIGKILL)
    # The next call finds the shard dead, restarts it on its file, and retries.
    _assert_all_equal(plane.get(CANONICAL_PARTITION, list(rows)), list(rows.values()))
    assert plane.restarts >= 1


def test_a_killed_shard_is_restarted_by_the_health_check(new_plane: NewPlane) -> None:
    plane = new_plane(2)
    plane.put(CANONICAL_PARTITION, {"a_g0": make_row(1)})
    kill_and_await_death(plane._handle(shard_of("a_g0", 2)))
    dead = plane.ping_shards(timeout=5.0)
    assert dead == [shard_of("a_g0", 2)]
    plane.restart_shard(dead[0])
    assert plane.ping_shards(timeout=30.0) == []  # live, if slow on a loaded machine
    _assert_all_equal(plane.get(CANONICAL_PARTITION, ["a_g0"]), [make_row(1)])


# ----------------------------------------------------------------------------- fences


def test_a_fenced_writer_is_refused_even_after_a_shard_restart(new_plane: NewPlane) -> None:
    plane = new_plane(2)
    worker = RayShardedDataPlane(plane.layout, writer="gen-7")
    worker.put(CaptureWriter.staging_partition, {"g1_g0_a1/c0": make_row(1)})
    plane.fence("gen-7")
    for index in range(2):
        os.kill(plane.shard_pid(index), signal.SIGKILL)
        plane.restart_shard(index)
    with pytest.raises(FencedWriterError) as caught:
        worker.put(CaptureWriter.staging_partition, {"g1_g0_a1/c1": make_row(2)})
    assert caught.value.writer == "gen-7"
    assert plane.keys(CaptureWriter.staging_partition) == ["g1_g0_a1/c0"]
    # Another writer is unaffected.
    RayShardedDataPlane(plane.layout, writer="gen-8").put(
        CaptureWriter.staging_partition, {"g2_g0_a1/c0": make_row(3)}
    )


def test_workers_may_only_stage(new_plane: NewPlane) -> None:
    plane = new_plane(1)
    worker = RayShardedDataPlane(plane.layout, writer="gen-1")
    with pytest.raises(InvalidArgumentError, match="may only stage"):
        worker.put(CANONICAL_PARTITION, {"g1_g0": make_row(1)})
    assert plane.keys(CANONICAL_PARTITION) == []


def test_snapshot_is_readable_by_the_embedded_store(new_plane: NewPlane) -> None:
    plane = new_plane(3)
    rows = {f"g{i}_g0": make_row(i) for i in range(12)}
    plane.put(CANONICAL_PARTITION, rows)
    target = Path(tempfile.mkdtemp()) / "snap"
    plane.snapshot(target)
    with SqliteDataPlane(Path(tempfile.mkdtemp()) / "x.sqlite") as store:
        store.restore(target)
        _assert_all_equal(store.get(CANONICAL_PARTITION, list(rows)), list(rows.values()))


def _assert_all_equal(got: list[Row], expected: list[Row]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert_rows_equal(a, b)
