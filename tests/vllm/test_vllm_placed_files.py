"""The torch trainer's snapshot placed as its version's weights file (``VllmWeightSync.place``,
``TorchWeights.capture_into``): the cases a hostile review found (review 35b). Each would
leave a push failing, loading another timeline's bytes, or a file nothing removes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from rollout_recovery.llm._weights import TorchWeights  # noqa: E402
from rollout_recovery.vllm._sync import VllmWeightSync, weights_file_name  # noqa: E402


def _weights(sync: VllmWeightSync, version: int, value: float) -> TorchWeights:
    """The trainer's snapshot of ``version`` (every weight ``value``), placed as its file
    where the sync allows, else a copy."""
    return TorchWeights.capture_into(sync, version, {"w": torch.full((1024,), value)}.items())


def _pushed(sync: VllmWeightSync, version: int, weights: TorchWeights) -> float:
    """What a push of ``version`` loads (the file ``weights_file`` gives it)."""
    path = asyncio.run(sync.weights_file(version, weights))
    return float(safetensors_torch.load_file(str(path))["w"][0])


def test_a_placed_file_that_would_leave_no_room_for_one_more_is_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pool holds version 1's snapshot (its file's pages) while version 2 is placed; a
    # background checkpoint or a lagging server can hold one more: a directory sized for
    # two files would be full, and the push's own write would fail.
    sync = VllmWeightSync(tmp_path / "w", dtype="float32", keep=1)
    first = _weights(sync, 1, 1.0)
    size = (sync.directory / weights_file_name(1)).stat().st_size
    room = SimpleNamespace(f_bavail=size + size // 2, f_frsize=1)
    monkeypatch.setattr(os, "statvfs", lambda path: room)
    second = _weights(sync, 2, 2.0)
    assert not (sync.directory / weights_file_name(2)).exists(), "placed with no room left"
    assert float(second.tensors["w"][0]) == 2.0  # the trainer kept a copy
    assert _pushed(sync, 2, second) == 2.0  # and the push wrote its own file from it
    assert float(first.tensors["w"][0]) == 1.0
    sync.close()


def test_after_a_rollback_a_version_number_trained_again_is_pushed_with_its_new_bytes(
    tmp_path: Path,
) -> None:
    # Versions 5 and 6 placed; a restore goes back to 4 and trains another 5 and 6. The
    # new 6 cannot be placed (no room: a copy); its push must not find the old 6's file.
    sync = VllmWeightSync(tmp_path / "w", dtype="float32", keep=1)
    old = [_weights(sync, 5, 5.0), _weights(sync, 6, 6.0)]
    del old
    restored, five = _weights(sync, 4, 4.0), _weights(sync, 5, 50.0)
    writing = sync._write

    def no_room(*args: object) -> object:
        raise OSError(28, "No space left on device")

    sync._write = no_room  # type: ignore[method-assign,assignment]
    six = _weights(sync, 6, 60.0)  # place failed: a copy
    sync._write = writing  # type: ignore[method-assign]
    assert _pushed(sync, 6, six) == 60.0
    del restored, five
    sync.close()


def test_a_closed_sync_places_nothing(tmp_path: Path) -> None:
    # The job's end removed the directory; a trainer that still names the sync and steps
    # again must not leave a file in shared memory that nothing removes.
    sync = VllmWeightSync(tmp_path / "w", dtype="float32", keep=1)
    first = _weights(sync, 1, 1.0)
    sync.close()
    later = _weights(sync, 2, 2.0)
    assert float(later.tensors["w"][0]) == 2.0
    assert not sync.directory.exists() or not any(sync.directory.iterdir())
    del first
