"""MemoryDataPlane: the shared contract plus what is specific to keeping rows in a dict."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dataplane_support import make_row
from store_contract import MACHINE_SETTINGS, StoreContract, StoreFactory, StoreMachine

from rollout_recovery.dataplane import DataPlane, MemoryDataPlane, Row


class TestMemoryContract(StoreContract):
    @pytest.fixture
    def new_store(self) -> StoreFactory:
        return MemoryDataPlane


class MemoryMachine(StoreMachine):
    def make_store(self, directory: Path) -> DataPlane:
        return MemoryDataPlane()


TestMemoryMachine = MemoryMachine.TestCase
TestMemoryMachine.settings = MACHINE_SETTINGS


def test_satisfies_the_protocol() -> None:
    store: DataPlane = MemoryDataPlane()
    assert repr(store) == "MemoryDataPlane({})"


def test_put_does_not_keep_a_view_of_caller_memory() -> None:
    store = MemoryDataPlane()
    buffer = np.arange(8, dtype=np.int32)
    store.put(
        "a",
        {
            "k": Row(
                token_ids=buffer,
                token_mask=np.ones(8, np.float32),
                logprobs=np.zeros(8, np.float32),
            )
        },
    )
    buffer += 100
    (got,) = store.get("a", ["k"])
    assert got.token_ids.tolist() == list(range(8))
    assert not np.shares_memory(got.token_ids, buffer)


def test_close_drops_rows() -> None:
    store = MemoryDataPlane()
    store.put("a", {"k": make_row(1)})
    store.close()
    assert repr(store) == "MemoryDataPlane({})"
