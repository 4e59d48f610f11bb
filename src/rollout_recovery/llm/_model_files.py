"""A Hugging Face causal LM directory (``config.json`` + safetensors) in and out, no hub.

Everything goes through local files: :func:`load_causal_lm` reads a directory that holds
``config.json`` and either ``model.safetensors`` or sharded ``model-*.safetensors`` with
their ``model.safetensors.index.json``; :func:`write_model_dir` writes one (used where
``save_pretrained`` refuses, e.g. a model dequantized from GGUF). Weights are read with
safetensors, never with pickle.

:func:`instantiate` builds a second model around tensors it is given without copying
them (``load_state_dict(assign=True)`` on a model made on the meta device): what lets the
in-process generation backend hold one model per weight version at the cost of the
snapshot alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.initialization import no_init_weights

from .._durable import publish_directory
from ..errors import InvalidArgumentError, InvalidStateError
from ._weight_index import INDEX, SINGLE, model_file, weight_file_names

__all__ = [
    "buffers_of",
    "causal_lm_to_fill",
    "fill_from_files",
    "instantiate",
    "load_causal_lm",
    "model_from_config",
    "read_config",
    "read_weight_files",
    "tied_parameter_names",
    "vocab_size_of",
    "write_model_dir",
]


def model_from_config(config: PretrainedConfig, *, dtype: torch.dtype) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_config``, typed (transformers leaves it unannotated)."""
    factory: Callable[..., PreTrainedModel] = AutoModelForCausalLM.from_config
    return factory(config, dtype=dtype)


def vocab_size_of(model: PreTrainedModel) -> int:
    """The rows of the input embedding: the ids the model can read and the trainer scores."""
    embedding = model.get_input_embeddings()
    if isinstance(embedding, torch.nn.Embedding):
        return int(embedding.num_embeddings)
    return int(model.config.vocab_size)


def read_config(model_dir: Path) -> PretrainedConfig:
    """The model's config from ``model_dir/config.json`` (a local path: no hub lookup)."""
    if not (model_dir / "config.json").is_file():
        raise InvalidArgumentError(f"{model_dir} has no config.json: not a model directory")
    config: PretrainedConfig = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    return config


def read_weight_files(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the model's safetensors file(s), by checkpoint name, as stored
    (each file a regular file inside ``model_dir``: ``_weight_index``)."""
    tensors: dict[str, torch.Tensor] = {}
    for name in weight_file_names(model_dir):
        if name != INDEX:
            tensors.update(load_file(str(model_file(model_dir, name))))
    return tensors


def tied_parameter_names(model: PreTrainedModel) -> set[str]:
    """Names a checkpoint may leave out because they are tied to another parameter."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    if not getattr(model.config, "tie_word_embeddings", False):
        return set()
    return set(tied)


def _load_into(
    model: PreTrainedModel, tensors: Mapping[str, torch.Tensor], *, assign: bool, where: str
) -> None:
    result = model.load_state_dict(dict(tensors), strict=False, assign=assign)
    missing = set(result.missing_keys) - tied_parameter_names(model)
    if missing or result.unexpected_keys:
        raise InvalidStateError(
            f"{where}: weights do not fit the model (missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(result.unexpected_keys)[:5]})"
        )
    if tied_parameter_names(model):
        model.tie_weights()


def load_causal_lm(model_dir: Path, *, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The model in ``model_dir`` with every parameter in ``dtype`` (fp32: master weights)."""
    model = causal_lm_to_fill(model_dir, dtype=dtype)
    fill_from_files(model, model_dir, dtype=dtype)
    return model


def causal_lm_to_fill(model_dir: Path, *, dtype: torch.dtype) -> PreTrainedModel:
    """``model_dir``'s model with its parameters allocated, not yet set: for
    :func:`fill_from_files`, or for a trainer that restores every parameter from a
    checkpoint (a resume need not read the model's weights only to overwrite them).

    Built without the random initialisation (4.3 of 4.4 s of building SmolLM2-135M on a
    loaded 2-core machine): transformers' own switch for a model it loads; its
    non-persistent buffers (rotary frequencies) are still computed. Refused
    (``InvalidStateError``) unless the weight files' headers (no tensor is read) name every
    entry of the model's state in its shape, and nothing else."""
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    with no_init_weights():
        model = model_from_config(config, dtype=dtype)
    if tied_parameter_names(model):
        # Tied now (without the initialisation, transformers did not): the parameters a
        # caller lists are the model's own, one per tensor.
        model.tie_weights()
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    stored = _stored_shapes(model_dir)
    missing = set(expected) - set(stored) - tied_parameter_names(model)
    unexpected = set(stored) - set(expected)
    if missing or unexpected:
        raise InvalidStateError(
            f"{model_dir}: weights do not fit the model (missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]})"
        )
    differing = sorted(name for name, shape in stored.items() if expected[name] != shape)
    if differing:
        raise InvalidStateError(
            f"{model_dir}: weights do not fit the model (shapes differ at {differing[:5]})"
        )
    return model


def fill_from_files(model: PreTrainedModel, model_dir: Path, *, dtype: torch.dtype) -> None:
    """Set every parameter (and persistent buffer) of ``model`` from ``model_dir``'s files,
    cast to ``dtype``."""
    tensors = {name: t.to(dtype) for name, t in read_weight_files(Path(model_dir)).items()}
    _load_into(model, tensors, assign=False, where=str(model_dir))


def _stored_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Every weight's shape from the safetensors headers of ``model_dir`` (no data read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name in weight_file_names(model_dir):
        if name != INDEX:
            with safe_open(str(model_file(model_dir, name)), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
    return shapes


def buffers_of(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The model's buffers (rotary frequencies and the like): what :func:`instantiate` needs
    besides the parameters, since a model made on the meta device has none of their data."""
    return {name: buffer.detach().clone() for name, buffer in model.named_buffers()}


def instantiate(
    config: PretrainedConfig,
    parameters: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
) -> PreTrainedModel:
    """An eval-mode model whose parameters ARE ``parameters`` (no copy), buffers copied.

    The caller must not change ``parameters`` while the model is in use: the snapshot a
    backend samples from is immutable by contract (:class:`TorchWeights`).
    """
    with torch.device("meta"):
        model = model_from_config(config, dtype=torch.float32)
    _load_into(model, parameters, assign=True, where="weights snapshot")
    for name, buffer in buffers.items():
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner)
        persistent = leaf not in module._non_persistent_buffers_set
        module.register_buffer(leaf, buffer.clone(), persistent=persistent)
    on_meta = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if on_meta:
        raise InvalidStateError(f"weights snapshot left tensors without data: {on_meta[:5]}")
    model.train(False)
    model.requires_grad_(False)
    return model


def write_model_dir(
    out: Path,
    config: PretrainedConfig,
    tensors: Mapping[str, torch.Tensor],
    *,
    extra_files: Mapping[str, bytes] | None = None,
) -> None:
    """Publish ``out`` whole: ``config.json``, ``model.safetensors`` and ``extra_files``.

    Written to a temporary sibling, fsynced and renamed (a crash leaves no half model).
    Tensors are made contiguous; tied duplicates must already be left out.
    """
    contiguous = {name: t.detach().contiguous() for name, t in tensors.items()}
    metadata: dict[str, Any] = {"format": "pt"}

    def fill(directory: Path) -> None:
        (directory / "config.json").write_text(config.to_json_string(use_diff=False))
        save_file(contiguous, str(directory / SINGLE), metadata=metadata)
        for name, data in (extra_files or {}).items():
            (directory / name).write_bytes(data)

    publish_directory(Path(out), fill)
