"""The snapshot builder follows the journal reading only what is new at each snapshot.

A checkpoint every two steps must not re-read the whole history (that would make a run's
snapshot cost grow with the square of its length): the builder tracks the line number at
its position and asks the journal for the bytes after it alone.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.control._replay import metadata_only_plane
from rollout_recovery.control._snapshot import SnapshotBuilder
from rollout_recovery.control._state import ControllerState
from rollout_recovery.dataplane import ReplayIndex
from rollout_recovery.history import _journal
from rollout_recovery.history._journal import JournalWriter
from rollout_recovery.history.records import PromptTaken
from rollout_recovery.ledger import RolloutRecoveryLedger

N = 2


def taken(number: int) -> PromptTaken:
    group = f"g{number:07d}"
    return PromptTaken(
        group_id=group,
        prompt_idx=number,
        position=number,
        batch=number,
        attempts=[f"{group}_g{i}_a{uuid.UUID(int=number * N + i + 1).hex}" for i in range(N)],
    )


def test_each_advance_reads_only_the_records_after_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.jsonl"
    writer = JournalWriter(path)
    builder = SnapshotBuilder(
        journal=path,
        position=0,
        ledger=RolloutRecoveryLedger(),
        replay=ReplayIndex(data_plane=metadata_only_plane(), group_size=N),
        state=ControllerState.initial(0),
        group_size=N,
    )
    read = 0
    real_open = open

    class Counting:
        def __init__(self, name: Path, mode: str) -> None:
            self.handle = real_open(name, mode)

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.handle, name)

        def read(self, size: int = -1) -> bytes:
            nonlocal read
            data: bytes = self.handle.read(size)
            read += len(data)
            return data

    monkeypatch.setattr(_journal, "open", Counting, raising=False)
    for number in range(40):
        writer.append(taken(number))
        if number % 4 == 3:  # a snapshot every four records
            builder.advance_to(writer.position)
    writer.close()
    assert builder.position == path.stat().st_size
    assert builder.records_followed == 40
    assert len(builder.ledger.groups()) == 40
    assert read == builder.position  # each byte once, not the history at each snapshot
