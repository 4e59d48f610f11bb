"""The DataPlane contract, written once and run against every backend.

A backend's test module subclasses :class:`StoreContract` and provides a ``new_store``
fixture (a factory of empty stores), and subclasses :class:`StoreMachine` with a
``make_store`` method for the stateful property test against a dict model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dataplane_support import FakeCut, assert_rows_equal, dead_cut, listify, make_row
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
)

from rollout_recovery.dataplane import DataPlane, Row
from rollout_recovery.dataplane._sqlite import SNAPSHOT_FILE
from rollout_recovery.errors import (
    BareStringError,
    DataPlaneClosedError,
    DeadCutError,
    InvalidRowError,
    InvalidStateError,
    MissingRowError,
    RolloutRecoveryError,
)

StoreFactory = Callable[[], DataPlane]


def _content(store: DataPlane, partitions: tuple[str, ...] = ("a", "b")) -> dict[str, Any]:
    """Everything a store holds in the given partitions, as comparable plain data."""
    out: dict[str, Any] = {}
    for partition in partitions:
        keys = store.keys(partition)
        for key, row in zip(keys, store.get(partition, keys), strict=True):
            out[f"{partition}/{key}"] = (
                row.token_ids.tobytes(),
                row.token_mask.tobytes(),
                row.logprobs.tobytes(),
                dict(row.metadata),
            )
    return out


def _leftovers(directory: Path) -> list[str]:
    """Temporary snapshot directories (``.{name}.tmp-*``) left behind."""
    return [p.name for p in directory.iterdir() if p.name.startswith(".")]


class StoreContract:
    @pytest.fixture
    def store(self, new_store: StoreFactory) -> Iterator[DataPlane]:
        store = new_store()
        yield store
        store.close()

    # ---- put / get / clear / keys ----------------------------------------------------

    def test_round_trip_in_request_order(self, store: DataPlane) -> None:
        rows = {f"k{i}": make_row(i) for i in range(5)}
        store.put("a", rows)
        order = ["k3", "k0", "k3", "k4"]
        for key, got in zip(order, store.get("a", order), strict=True):
            assert_rows_equal(got, rows[key])
        assert store.get("a", []) == []

    def test_put_replaces_existing_key(self, store: DataPlane) -> None:
        store.put("a", {"k": make_row(1)})
        store.put("a", {"k": make_row(2)})
        (got,) = store.get("a", ["k"])
        assert_rows_equal(got, make_row(2))
        assert store.keys("a") == ["k"]

    def test_partitions_are_separate(self, store: DataPlane) -> None:
        store.put("a", {"k": make_row(1)})
        store.put("b", {"k": make_row(2)})
        assert_rows_equal(store.get("a", ["k"])[0], make_row(1))
        assert_rows_equal(store.get("b", ["k"])[0], make_row(2))
        store.clear("a", ["k"])
        assert store.keys("a") == []
        assert store.keys("b") == ["k"]

    def test_missing_key_is_a_key_error_naming_it(self, store: DataPlane) -> None:
        store.put("a", {"here": make_row(1)})
        with pytest.raises(MissingRowError) as caught:
            store.get("a", ["here", "gone/1", "gone/0"])
        error = caught.value
        assert isinstance(error, KeyError)
        assert isinstance(error, RolloutRecoveryError)
        assert error.partition == "a"
        assert error.keys == ["gone/1", "gone/0"]
        assert "gone/0" in str(error) and "'a'" in str(error) and "total=2" in str(error)
        with pytest.raises(KeyError, match="here"):
            store.get("b", ["here"])

    def test_missing_key_message_caps_listed_keys(self, store: DataPlane) -> None:
        keys = [f"m{i:02d}" for i in range(25)]
        with pytest.raises(MissingRowError) as caught:
            store.get("a", keys)
        assert len(caught.value.keys) == 25
        assert "m09" in str(caught.value) and "m10" not in str(caught.value)
        assert "total=25" in str(caught.value)

    def test_clear_is_idempotent_and_keys_sorted(self, store: DataPlane) -> None:
        keys = ["b/2", "a/10", "a/9", "é", "Z", "a/1"]
        store.put("a", {key: make_row(i) for i, key in enumerate(keys)})
        assert store.keys("a") == sorted(keys)
        store.clear("a", ["a/9", "never", "a/9"])
        store.clear("a", ["a/9"])
        store.clear("nowhere", ["x"])
        assert store.keys("a") == sorted(set(keys) - {"a/9"})
        assert store.keys("unknown") == []

    def test_empty_put_and_clear_are_no_ops(self, store: DataPlane) -> None:
        store.put("a", {})
        store.clear("a", [])
        assert store.keys("a") == []

    def test_zero_length_and_strided_arrays(self, store: DataPlane) -> None:
        empty = Row(
            token_ids=np.zeros(0, np.int32),
            token_mask=np.zeros(0, np.float32),
            logprobs=np.zeros(0, np.float32),
        )
        base = np.arange(20, dtype=np.int32)
        strided = Row(
            token_ids=base[::2],
            token_mask=np.ones(20, np.float32)[::2],
            logprobs=np.linspace(-1, 0, 20, dtype=np.float32)[::2],
        )
        store.put("a", {"empty": empty, "strided": strided})
        got_empty, got_strided = store.get("a", ["empty", "strided"])
        assert_rows_equal(got_empty, empty)
        assert got_strided.token_ids.tolist() == list(range(0, 20, 2))

    def test_metadata_round_trips_json_like_values(self, store: DataPlane) -> None:
        metadata: dict[str, Any] = {
            "rollout_id": "g_g0_a" + "0" * 32,
            "calls": [{"id": "c1", "weight_version": 3}, {"id": "c2", "weight_version": None}],
            "span": (0, 17),
            "reward": -0.25,
            "ok": True,
            "big": 2**63 - 1,
            "unicode": "ü✓",
        }
        store.put("a", {"k": make_row(1, **metadata)})
        (got,) = store.get("a", ["k"])
        assert got.metadata["span"] == [0, 17]
        assert_rows_equal(got, make_row(1, **metadata))

    # ---- no aliasing -----------------------------------------------------------------

    def test_caller_arrays_are_copied_in_and_out(self, store: DataPlane) -> None:
        row = make_row(7, length=16)
        original = row.token_ids.copy()
        metadata = {"nested": {"x": [1]}}
        store.put(
            "a",
            {
                "k": Row(
                    token_ids=row.token_ids,
                    token_mask=row.token_mask,
                    logprobs=row.logprobs,
                    metadata=metadata,
                )
            },
        )
        row.token_ids[:] = 0
        metadata["nested"]["x"].append(2)
        (first,) = store.get("a", ["k"])
        assert first.token_ids.tolist() == original.tolist()
        assert first.metadata == {"nested": {"x": [1]}}
        assert first.token_ids.flags.writeable and first.logprobs.flags.writeable
        first.token_ids[:] = -1
        first.metadata["nested"]["x"].clear()
        (second,) = store.get("a", ["k"])
        assert second.token_ids.tolist() == original.tolist()
        assert second.metadata == {"nested": {"x": [1]}}

    # ---- refusals change nothing -----------------------------------------------------

    @pytest.mark.parametrize(
        ("bad", "field"),
        [
            (
                lambda r: Row(
                    token_ids=r.token_ids.astype(np.int64),
                    token_mask=r.token_mask,
                    logprobs=r.logprobs,
                ),
                "token_ids",
            ),
            (
                lambda r: Row(
                    token_ids=r.token_ids.astype(">i4"),
                    token_mask=r.token_mask,
                    logprobs=r.logprobs,
                ),
                "token_ids",
            ),
            (
                lambda r: Row(
                    token_ids=r.token_ids,
                    token_mask=r.token_mask.reshape(2, -1),
                    logprobs=r.logprobs,
                ),
                "token_mask",
            ),
            (
                lambda r: Row(
                    token_ids=r.token_ids, token_mask=r.token_mask, logprobs=r.logprobs.tolist()
                ),
                "logprobs",
            ),
            (
                lambda r: Row(
                    token_ids=r.token_ids,
                    token_mask=r.token_mask,
                    logprobs=r.logprobs,
                    metadata={"x": np.float64(1.0)},
                ),
                "metadata['x']",
            ),
            (
                lambda r: Row(
                    token_ids=r.token_ids,
                    token_mask=r.token_mask,
                    logprobs=r.logprobs,
                    metadata={"x": [1, {2: "a"}]},
                ),
                "metadata['x'][1]",
            ),
            (
                lambda r: Row(
                    token_ids=r.token_ids,
                    token_mask=r.token_mask,
                    logprobs=r.logprobs,
                    metadata={"x": {1, 2}},
                ),
                "metadata['x']",
            ),
            (
                lambda r: Row(
                    token_ids=r.token_ids,
                    token_mask=r.token_mask,
                    logprobs=r.logprobs,
                    metadata={"x": 2**64},
                ),
                "metadata",
            ),
            (lambda r: r.metadata, None),
        ],
    )
    def test_invalid_row_refused_and_nothing_stored(
        self, store: DataPlane, bad: Callable[[Row], Any], field: str | None
    ) -> None:
        store.put("a", {"keep": make_row(0)})
        before = _content(store)
        batch = {"good": make_row(1, length=8), "bad": bad(make_row(2, length=8))}
        with pytest.raises(InvalidRowError) as caught:
            store.put("a", batch)
        assert caught.value.key == "bad"
        assert caught.value.field == field
        assert "'bad'" in str(caught.value)
        assert _content(store) == before

    def test_bad_keys_and_partitions_refused(self, store: DataPlane) -> None:
        with pytest.raises(InvalidRowError, match="row key"):
            store.put("a", {"": make_row(1)})
        with pytest.raises(InvalidRowError, match="row key"):
            store.put("a", {7: make_row(1)})  # type: ignore[dict-item]
        with pytest.raises(InvalidRowError, match="UTF-8"):
            store.put("a", {"\ud800": make_row(1)})
        with pytest.raises(InvalidRowError, match="partition"):
            store.put("", {"k": make_row(1)})
        with pytest.raises(BareStringError, match="single str"):
            store.get("a", "abc")
        with pytest.raises(BareStringError, match="single str"):
            store.clear("a", "abc")
        assert store.keys("a") == []

    @pytest.mark.parametrize("case", ["surrogate-value", "surrogate-key", "deep", "cycle"])
    def test_hostile_metadata_is_an_invalid_row(self, store: DataPlane, case: str) -> None:
        metadata: dict[str, Any]
        if case == "surrogate-value":
            metadata = {"calls": ["ok", "bad \ud800"]}
        elif case == "surrogate-key":
            metadata = {"\udc80": 1}
        elif case == "deep":
            metadata = {}
            node = metadata
            for _ in range(200):
                node["a"] = {}
                node = node["a"]
        else:
            metadata = {"loop": []}
            metadata["loop"].append(metadata)
        row = dataclasses.replace(make_row(1), metadata=metadata)
        with pytest.raises(InvalidRowError) as caught:
            store.put("a", {"k": row})
        assert caught.value.key == "k"
        assert caught.value.field is not None and caught.value.field.startswith("metadata")
        assert store.keys("a") == []

    def test_metadata_as_deep_as_a_receipt_may_be_is_stored(self, store: DataPlane) -> None:
        metadata: dict[str, Any] = {}
        node = metadata
        for _ in range(63):  # 64 levels, the metadata dict included
            node["a"] = {}
            node = node["a"]
        row = dataclasses.replace(make_row(1), metadata=metadata)
        store.put("a", {"k": row})
        assert store.get("a", ["k"])[0].metadata == metadata

    # ---- cuts ------------------------------------------------------------------------

    def test_live_cut_is_checked_and_no_cut_is_allowed(
        self, store: DataPlane, tmp_path: Path
    ) -> None:
        cut = FakeCut()
        store.put("a", {"k": make_row(1)}, cut=cut)
        store.clear("a", ["k"], cut=cut)
        store.snapshot(tmp_path / "snap", cut=cut)
        store.restore(tmp_path / "snap", cut=cut)
        assert cut.checks == 4
        store.put("a", {"worker": make_row(2)})  # staging puts carry no cut
        assert store.keys("a") == ["worker"]

    def test_dead_cut_refuses_every_mutation(self, store: DataPlane, tmp_path: Path) -> None:
        store.put("a", {"k": make_row(1)})
        store.snapshot(tmp_path / "snap")
        store.put("a", {"after": make_row(2)})
        before = _content(store)
        with pytest.raises(DeadCutError):
            store.put("a", {"x": make_row(3)}, cut=dead_cut())
        with pytest.raises(DeadCutError):
            store.clear("a", ["k"], cut=dead_cut())
        with pytest.raises(DeadCutError):
            store.restore(tmp_path / "snap", cut=dead_cut())
        with pytest.raises(DeadCutError):
            store.snapshot(tmp_path / "snap2", cut=dead_cut())
        assert _content(store) == before
        assert not (tmp_path / "snap2").exists()

    # ---- snapshot / restore ----------------------------------------------------------

    def test_snapshot_then_restore_replaces_everything(
        self, store: DataPlane, tmp_path: Path
    ) -> None:
        store.put("a", {f"k{i}": make_row(i) for i in range(4)})
        store.put("b", {"x": make_row(9)})
        saved = _content(store)
        store.snapshot(tmp_path / "snap")
        assert _leftovers(tmp_path) == []
        assert [p.name for p in (tmp_path / "snap").iterdir()] == [SNAPSHOT_FILE]
        store.put("a", {"k0": make_row(100), "new": make_row(101)})
        store.clear("b", ["x"])
        store.put("c", {"only-after": make_row(102)})
        store.restore(tmp_path / "snap")
        assert _content(store) == saved
        assert store.keys("c") == []
        store.restore(tmp_path / "snap")  # restoring twice is harmless
        assert _content(store) == saved

    def test_snapshot_of_empty_store(self, store: DataPlane, tmp_path: Path) -> None:
        store.snapshot(tmp_path / "snap")
        store.put("a", {"k": make_row(1)})
        store.restore(tmp_path / "snap")
        assert store.keys("a") == []

    def test_snapshot_refuses_existing_directory(self, store: DataPlane, tmp_path: Path) -> None:
        (tmp_path / "snap").mkdir()
        with pytest.raises(FileExistsError, match="snap"):
            store.snapshot(tmp_path / "snap")
        assert list((tmp_path / "snap").iterdir()) == []
        assert _leftovers(tmp_path) == []

    @pytest.mark.parametrize("damage", ["missing", "garbage", "truncated", "foreign"])
    def test_bad_snapshot_refused_and_nothing_changed(
        self, store: DataPlane, new_store: StoreFactory, tmp_path: Path, damage: str
    ) -> None:
        donor = new_store()
        donor.put("a", {f"k{i}": make_row(i, length=5000) for i in range(8)})
        donor.snapshot(tmp_path / "snap")
        donor.close()
        file = tmp_path / "snap" / SNAPSHOT_FILE
        if damage == "missing":
            file.unlink()
        elif damage == "garbage":
            file.write_bytes(b"not a database at all" * 100)
        elif damage == "truncated":
            file.write_bytes(file.read_bytes()[: file.stat().st_size // 3])
        else:
            file.unlink()
            conn = sqlite3.connect(file)
            conn.execute("CREATE TABLE rows (x)")
            conn.commit()
            conn.close()
        store.put("a", {"mine": make_row(1)})
        before = _content(store)
        with pytest.raises(InvalidStateError) as caught:
            store.restore(tmp_path / "snap")
        assert SNAPSHOT_FILE in str(caught.value)
        assert _content(store) == before

    def test_snapshot_with_corrupt_row_layout_refused(
        self, store: DataPlane, new_store: StoreFactory, tmp_path: Path
    ) -> None:
        donor = new_store()
        donor.put("a", {"ok": make_row(1), "torn": make_row(2, length=10)})
        donor.snapshot(tmp_path / "snap")
        donor.close()
        conn = sqlite3.connect(tmp_path / "snap" / SNAPSHOT_FILE)
        conn.execute("UPDATE rows SET token_ids = substr(token_ids, 1, 8) WHERE key = 'torn'")
        conn.commit()
        conn.close()
        with pytest.raises(InvalidStateError, match=r"'torn'.*token_ids"):
            store.restore(tmp_path / "snap")
        assert store.keys("a") == []

    # ---- lifecycle and threads -------------------------------------------------------

    def test_closed_store_refuses_calls(self, new_store: StoreFactory, tmp_path: Path) -> None:
        store = new_store()
        store.close()
        store.close()  # idempotent
        for call in (
            lambda: store.put("a", {"k": make_row(1)}),
            lambda: store.get("a", ["k"]),
            lambda: store.clear("a", ["k"]),
            lambda: store.keys("a"),
            lambda: store.snapshot(tmp_path / "snap"),
        ):
            with pytest.raises(DataPlaneClosedError):
                call()
        assert not (tmp_path / "snap").exists()

    def test_concurrent_puts_from_threads(self, store: DataPlane) -> None:
        async def main() -> None:
            await asyncio.gather(
                *(asyncio.to_thread(store.put, "a", {f"t{i:03d}": make_row(i)}) for i in range(64)),
                *(asyncio.to_thread(store.keys, "a") for _ in range(16)),
            )

        asyncio.run(main())
        keys = [f"t{i:03d}" for i in range(64)]
        assert store.keys("a") == keys
        for i, got in enumerate(store.get("a", keys)):
            assert_rows_equal(got, make_row(i))


# ---- stateful property test against a dict model ----------------------------------------

_KEYS = st.sampled_from(["k", "k/0", "k/1", "a", "é/✓", "z\x00z", "B"])
_PARTITIONS = st.sampled_from(["staging", "canonical"])
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def _rows(draw: st.DrawFn) -> Row:
    n = draw(st.integers(0, 12))
    ids = draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=n, max_size=n))
    floats = st.floats(width=32, allow_nan=True)
    mask = draw(st.lists(floats, min_size=n, max_size=n))
    logprobs = draw(st.lists(floats, min_size=n, max_size=n))
    return Row(
        token_ids=np.array(ids, dtype=np.int32),
        token_mask=np.array(mask, dtype=np.float32),
        logprobs=np.array(logprobs, dtype=np.float32),
        metadata=draw(st.dictionaries(st.text(max_size=4), _JSON, max_size=3)),
    )


def _model_value(row: Row) -> tuple[bytes, bytes, bytes, Any]:
    return (
        row.token_ids.tobytes(),
        row.token_mask.tobytes(),
        row.logprobs.tobytes(),
        listify(dict(row.metadata)),
    )


class StoreMachine(RuleBasedStateMachine):
    """Drives a store with random puts, gets, clears and snapshot/restore cycles and checks
    it against a plain dict after every step."""

    snapshots = Bundle("snapshots")

    def make_store(self, directory: Path) -> DataPlane:
        raise NotImplementedError

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="store-machine-"))
        self.store = self.make_store(self.directory)
        self.model: dict[tuple[str, str], tuple[bytes, bytes, bytes, Any]] = {}
        self.saved: dict[str, dict[tuple[str, str], tuple[bytes, bytes, bytes, Any]]] = {}

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    @rule(partition=_PARTITIONS, rows=st.dictionaries(_KEYS, _rows(), max_size=3))
    def put(self, partition: str, rows: dict[str, Row]) -> None:
        self.store.put(partition, rows)
        for key, row in rows.items():
            self.model[(partition, key)] = _model_value(row)

    @rule(partition=_PARTITIONS, keys=st.lists(_KEYS, max_size=4))
    def get(self, partition: str, keys: list[str]) -> None:
        missing = [key for key in dict.fromkeys(keys) if (partition, key) not in self.model]
        if missing:
            with pytest.raises(MissingRowError) as caught:
                self.store.get(partition, keys)
            assert caught.value.keys == missing
            return
        got = self.store.get(partition, keys)
        assert [_model_value(row) for row in got] == [self.model[(partition, k)] for k in keys]

    @rule(partition=_PARTITIONS, keys=st.lists(_KEYS, max_size=4))
    def clear(self, partition: str, keys: list[str]) -> None:
        self.store.clear(partition, keys)
        for key in keys:
            self.model.pop((partition, key), None)

    @rule(target=snapshots)
    def snapshot(self) -> str:
        name = f"snap{len(self.saved)}"
        self.store.snapshot(self.directory / name)
        self.saved[name] = dict(self.model)
        return name

    @rule(name=snapshots)
    def restore(self, name: str) -> None:
        self.store.restore(self.directory / name)
        self.model = dict(self.saved[name])

    @invariant()
    def keys_match_model(self) -> None:
        for partition in ("staging", "canonical"):
            expected = sorted(k for p, k in self.model if p == partition)
            assert self.store.keys(partition) == expected


MACHINE_SETTINGS = settings(max_examples=25, stateful_step_count=25, deadline=None)
