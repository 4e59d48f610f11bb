"""Corrupt or foreign bytes in a stored row get InvalidStateError/InvalidRowError, never a
bare UnicodeDecodeError or RecursionError, and never a silently odd value (found by review)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import msgspec
import numpy as np
import pytest

from rollout_recovery.dataplane import MemoryDataPlane, ReplayIndex, Row, SqliteDataPlane
from rollout_recovery.errors import InvalidStateError, InvalidTransitionError

GOOD = msgspec.msgpack.encode({"a": "hello"})
CORRUPT_METADATA = {
    "bad-utf8": GOOD.replace(b"hello", b"hel\xffo"),
    "deep": b"\x81\xa1a" + b"\x91" * 200_000 + b"\xc0",
    "extension": b"\x81\xa1a\xd4\x05\x00",
    "timestamp": b"\x81\xa1a\xd6\xff\x00\x00\x00\x01",
}


@pytest.mark.parametrize("name", list(CORRUPT_METADATA))
def test_restore_refuses_a_snapshot_with_corrupt_row_metadata(tmp_path: Path, name: str) -> None:
    store = SqliteDataPlane(tmp_path / "a.sqlite")
    row = Row(
        token_ids=np.arange(3, dtype=np.int32),
        token_mask=np.ones(3, np.float32),
        logprobs=np.zeros(3, np.float32),
        metadata={"a": "hello"},
    )
    store.put("staging", {"k": row})
    store.snapshot(tmp_path / "snap")
    store.close()
    corrupt = tmp_path / f"snap-{name}"
    shutil.copytree(tmp_path / "snap", corrupt)
    (database,) = corrupt.glob("*.sqlite3")
    with sqlite3.connect(database) as conn:
        conn.execute("UPDATE rows SET metadata = ?", (CORRUPT_METADATA[name],))
    target = SqliteDataPlane(tmp_path / f"t-{name}.sqlite")
    with pytest.raises(InvalidStateError, match="stored row 'k' is corrupt"):
        target.restore(corrupt)
    assert target.keys("staging") == []  # a refused restore changes nothing
    target.close()


def test_check_commit_refuses_without_effect() -> None:
    index = ReplayIndex(data_plane=MemoryDataPlane(), group_size=2)
    with pytest.raises(InvalidTransitionError, match="max_weight_version"):
        index.check_commit(
            "g", ["g_g0", "g_g1"], target_step=0, min_weight_version=3, max_weight_version=1
        )
    with pytest.raises(InvalidTransitionError, match="repeats row keys"):
        index.check_commit(
            "g", ["g_g0", "g_g0"], target_step=0, min_weight_version=0, max_weight_version=0
        )
    assert index.check_commit(
        "g", ["g_g0", "g_g1"], target_step=0, min_weight_version=0, max_weight_version=1
    ) == ("g_g0", "g_g1")
    assert index.group_ids() == []
