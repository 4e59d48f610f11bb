"""A model is built from its files without a random initialisation first, and a trainer
restored from a checkpoint does not read them at all (issue 28).

Every parameter ``load_causal_lm`` builds is overwritten by the files' weights, so drawing
random ones first was waste: 4.3 of 4.4 s of building SmolLM2-135M on a loaded 2-core
machine, inside every resume's start. What must not change: the same parameters and
buffers as the initialised build, and a file that lacks a weight is still refused (so no
uninitialised memory is ever trained).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from llm_support import fixed_batch
from safetensors.torch import load_file, save_file

from rollout_recovery.errors import InvalidStateError
from rollout_recovery.llm import _model_files
from rollout_recovery.llm._model_files import (
    load_causal_lm,
    model_from_config,
    read_config,
    read_weight_files,
)
from rollout_recovery.llm._trainer import (
    MODEL_STATE_FILE,
    OPTIMIZER_STATE_FILE,
    TRAINER_STATE_FILE,
    TorchGRPOTrainer,
)


def test_building_draws_no_random_weights(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[str] = []

    def counting(name: str) -> Any:
        def init(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            drawn.append(name)
            return tensor

        return init

    for name in ("kaiming_uniform_", "normal_", "uniform_"):
        monkeypatch.setattr(torch.nn.init, name, counting(name))
    load_causal_lm(tiny_model_dir)
    assert drawn == []


def test_the_model_equals_the_initialised_build(tiny_model_dir: Path) -> None:
    built = load_causal_lm(tiny_model_dir)
    reference = model_from_config(read_config(tiny_model_dir), dtype=torch.float32)
    reference.load_state_dict(read_weight_files(tiny_model_dir), strict=False)
    reference.tie_weights()
    ours = dict(built.state_dict(keep_vars=True))
    for name, tensor in reference.state_dict(keep_vars=True).items():
        assert torch.equal(ours.pop(name), tensor), name
    assert ours == {}
    buffers = dict(reference.named_buffers())
    for name, buffer in built.named_buffers():  # non-persistent ones too (rotary)
        assert torch.equal(buffer, buffers.pop(name)), name
    assert buffers == {}
    assert built.lm_head.weight.data_ptr() == built.model.embed_tokens.weight.data_ptr()


def test_a_weight_missing_from_the_files_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_bytes((tiny_model_dir / "config.json").read_bytes())
    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    lost = "model.layers.0.mlp.up_proj.weight"
    del tensors[lost]
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(InvalidStateError, match=lost):
        load_causal_lm(out)


def test_a_restored_trainer_never_reads_the_models_weights(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume sets every parameter from its checkpoint: the model's weights (269 MB of
    bf16 for SmolLM2, cast to fp32) are not read only to be overwritten."""
    donor = TorchGRPOTrainer(tiny_model_dir, seed=3)
    donor.train_step(fixed_batch())
    files = donor.state_files()

    def unread(model_dir: Path) -> dict[str, torch.Tensor]:
        raise AssertionError(f"read the weights of {model_dir}")

    monkeypatch.setattr(_model_files, "read_weight_files", unread)
    resumed = TorchGRPOTrainer(tiny_model_dir, seed=9)
    bad = dict(files)
    bad[TRAINER_STATE_FILE] = b"{}"
    with pytest.raises(InvalidStateError):
        resumed.load_state_files(bad)  # refused: still nothing read, nothing set
    resumed.load_state_files(files)
    resumed.train_step(fixed_batch(), version=2)
    monkeypatch.undo()
    donor.train_step(fixed_batch(), version=2)
    assert resumed.state_files() == donor.state_files()


def test_a_trainer_not_restored_reads_the_weights_at_first_use(tiny_model_dir: Path) -> None:
    fresh = TorchGRPOTrainer(tiny_model_dir, seed=3)
    refused = TorchGRPOTrainer(tiny_model_dir, seed=3)
    with pytest.raises(InvalidStateError):
        refused.load_state_files({MODEL_STATE_FILE: b"", OPTIMIZER_STATE_FILE: b"", "x": b""})
    expected = dict(load_causal_lm(tiny_model_dir).named_parameters())
    for trainer in (fresh, refused):
        parameters = trainer.named_parameters()
        assert parameters.keys() == expected.keys()
        assert all(torch.equal(parameters[name], expected[name]) for name in expected)
