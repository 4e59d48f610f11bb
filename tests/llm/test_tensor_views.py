"""A safetensors file read as views of its bytes (issue 28: a resume's trainer state).

The views must give what ``safetensors.torch.load`` gives, refuse what it refuses, and copy
nothing; a trainer restored from them owns the moments AdamW writes into.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llm_support import fixed_batch
from safetensors import SafetensorError
from safetensors.torch import load, save

from rollout_recovery.errors import InvalidStateError
from rollout_recovery.llm import _trainer
from rollout_recovery.llm._tensor_views import tensor_views
from rollout_recovery.llm._trainer import (
    MODEL_STATE_FILE,
    OPTIMIZER_STATE_FILE,
    TorchGRPOTrainer,
)

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.uint8]


@st.composite
def _tensors(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    names = draw(st.lists(st.text("abc.", min_size=1, max_size=4), max_size=4, unique=True))
    out = {}
    for name in names:
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        dtype = draw(st.sampled_from(DTYPES))
        out[name] = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape).to(dtype)
    return out


def _address_range(data: bytes) -> tuple[int, int]:
    start = int(np.frombuffer(data, dtype=np.uint8).ctypes.data)
    return start, start + len(data)


@given(_tensors())
def test_views_equal_what_safetensors_loads_and_copy_nothing(tensors: dict[str, Any]) -> None:
    data = bytes(save(tensors))
    views = tensor_views(data, where="x")
    expected = load(data)
    assert views.keys() == expected.keys()
    low, high = _address_range(data)
    for name, view in views.items():
        assert view.dtype == expected[name].dtype and torch.equal(view, expected[name])
        if view.numel():
            assert low <= view.data_ptr() < high, name  # a view of the bytes, not a copy


def _valid() -> bytes:
    return bytes(save({"a": torch.ones(2, 3), "b": torch.zeros(4, dtype=torch.int64)}))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damage_safetensors_refuses_is_refused(data: st.DataObject) -> None:
    original = _valid()
    header_end = 8 + int.from_bytes(original[:8], "little")
    damaged = bytearray(original)
    how = data.draw(st.sampled_from(["flip", "cut", "grow"]))
    if how == "flip":
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, header_end - 1))
            damaged[at] = data.draw(st.integers(0, 255))
    elif how == "cut":
        del damaged[data.draw(st.integers(0, len(damaged) - 1)) :]
    else:
        damaged += b"\0" * data.draw(st.integers(1, 9))
    raw = bytes(damaged)
    try:
        expected: dict[str, torch.Tensor] | None = load(raw)
    except (SafetensorError, ValueError, OverflowError, TypeError):  # as the library fails
        expected = None
    try:
        views: dict[str, torch.Tensor] | None = tensor_views(raw, where="model.safetensors")
    except InvalidStateError as error:
        assert "unreadable model.safetensors" in str(error)
        views = None
    if expected is None:
        assert views is None  # never more lenient than safetensors
    elif views is not None:
        assert views.keys() == expected.keys()
        assert all(torch.equal(views[k], expected[k]) for k in views)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, "holds 4 bytes"),
        ({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}, "unknown dtype"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, "starts at byte 4"),
        ({"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, "bad shape"),
        ({"a": {"dtype": "F32", "shape": [1]}}, "exactly"),
        ({"__metadata__": {"k": 1}}, "__metadata__"),
        ([1], "not a JSON object"),
        # Empty (0 bytes, so the size check passes) but beyond torch's int64 sizes and
        # strides: torch would raise TypeError / RuntimeError, which the checkpoint search
        # does not pass over for the previous checkpoint.
        ({"a": {"dtype": "F32", "shape": [0, 2**70], "data_offsets": [0, 0]}}, "64-bit"),
        ({"a": {"dtype": "F32", "shape": [0, 2**40, 2**40], "data_offsets": [0, 0]}}, "64-bit"),
    ],
)
def test_a_bad_header_is_refused_naming_the_problem(header: object, message: str) -> None:
    text = json.dumps(header).encode()
    data = len(text).to_bytes(8, "little") + text + b"\0" * 4
    with pytest.raises(InvalidStateError, match=message):
        tensor_views(data, where="optimizer.safetensors")


def test_a_restored_trainer_decodes_no_copy_and_owns_its_moments(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    donor = TorchGRPOTrainer(tiny_model_dir, seed=3)
    donor.train_step(fixed_batch())
    files = donor.state_files()

    def copying_decoder(*args: object, **kwargs: object) -> None:
        raise AssertionError("the state was decoded into copies")

    # The library's decoder copies every tensor (1.6 GB for SmolLM2) before the trainer
    # copies it again; and a mask per tensor for the finite check would map as much.
    monkeypatch.setattr(_trainer, "load_safetensors", copying_decoder, raising=False)
    monkeypatch.setattr(torch, "isfinite", copying_decoder)
    resumed = TorchGRPOTrainer(tiny_model_dir, seed=9)
    resumed.load_state_files(files)
    monkeypatch.undo()
    assert resumed.state_files() == files
    low, high = _address_range(files[OPTIMIZER_STATE_FILE])
    model_low, model_high = _address_range(files[MODEL_STATE_FILE])
    for state in resumed._optimizer.state.values():
        for tensor in state.values():
            assert not low <= tensor.data_ptr() < high  # AdamW writes these
    for parameter in resumed._params.values():
        assert not model_low <= parameter.data_ptr() < model_high
    resumed.train_step(fixed_batch(), version=2)
    donor.train_step(fixed_batch(), version=2)
    assert resumed.state_files() == donor.state_files()
