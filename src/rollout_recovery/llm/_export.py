"""The trained model out of a checkpoint: a Hugging Face model directory.

``rollout-recovery export DIR OUT`` (``cli/_export.py``) reads a committed checkpoint of a
torch job and hands its trainer's parameters here. :func:`export_model` writes what
``transformers.AutoModelForCausalLM.from_pretrained`` and ``vllm serve`` load:
``config.json`` (the job's model's, its ``dtype`` the exported one), ``model.safetensors``
(the checkpoint's fp32 master weights, cast only when ``dtype`` asks: float32 keeps them
bit for bit), and the model's tokenizer, chat template and generation config. The
directory is published whole (``_durable``): a killed export leaves no half model.

The base files come from the job's own ``[model]``, whose digest the run recorded: files
that changed since are refused, so an export never pairs the weights with another
model's config.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from .._datasets import tokenizer_files
from ..errors import ConfigError, InvalidStateError
from ._extra import require_llm
from ._model_source import model_digest, prepare_model

if TYPE_CHECKING:  # the section exports with this module: its type, for the type checker
    from ._config import ModelConfig

__all__ = ["EXPORT_DTYPES", "WEIGHTS_FILE", "export_model"]

#: The checkpoint file holding a torch trainer's parameters (``trainer.<name>`` is how a
#: checkpoint names a FileStateTrainer's files; ``_trainer.MODEL_STATE_FILE``).
WEIGHTS_FILE: Final = "trainer.model.safetensors"
EXPORT_DTYPES: Final = ("float32", "bfloat16", "float16")


def export_model(
    model: ModelConfig,
    files: Mapping[str, bytes],
    out: Path,
    *,
    dtype: str = "float32",
    log: Callable[[str], None] = lambda _: None,
) -> Path:
    """Write the checkpoint ``files``' model to ``out`` (see the module docstring).

    ``ConfigError`` for a checkpoint without torch weights, model files whose digest is
    not the run's, or a ``dtype`` not in :data:`EXPORT_DTYPES`; ``InvalidStateError`` for
    weights that do not fit the model.
    """
    require_llm()
    import torch
    from safetensors.torch import load as load_safetensors

    from ._model_files import model_from_config, read_config, write_model_dir

    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join(EXPORT_DTYPES)}")
    if WEIGHTS_FILE not in files:
        raise ConfigError(
            f"the checkpoint has no {WEIGHTS_FILE}: it is not a torch trainer's (the numpy "
            f"policy has no Hugging Face model to export); it holds {sorted(files)}"
        )
    base = prepare_model(model)
    if model.digest and model_digest(base) != model.digest:
        raise ConfigError(
            f"the model files in {str(base)!r} are not the ones this run trained (digest "
            f"{model.digest}): restore them to export",
            path="$.model.digest",
        )
    config = read_config(base)
    tensors = dict(load_safetensors(bytes(files[WEIGHTS_FILE])))
    with torch.device("meta"):
        skeleton = model_from_config(config, dtype=torch.float32)
    expected = {name: tuple(p.shape) for name, p in skeleton.named_parameters()}
    found = {name: tuple(t.shape) for name, t in tensors.items()}
    if found != expected:
        differing = sorted(set(found) ^ set(expected)) or sorted(
            name for name in found if found[name] != expected[name]
        )
        raise InvalidStateError(
            f"{WEIGHTS_FILE} does not fit the model in {base}: names or shapes differ at "
            f"{differing[:5]}"
        )
    target = getattr(torch, dtype)
    tensors = {name: tensor.to(target) for name, tensor in tensors.items()}
    config.dtype = dtype  # what from_pretrained(dtype="auto") and vLLM read
    extra = {path.name: path.read_bytes() for path in tokenizer_files(base)}
    out = Path(out)
    if out.exists() or out.is_symlink():
        if not out.is_dir() or any(out.iterdir()):
            raise ConfigError(f"{out} exists and is not an empty directory: choose a new OUT")
        out.rmdir()  # the model directory is published whole, by a rename into place
    out.parent.mkdir(parents=True, exist_ok=True)
    write_model_dir(out, config, tensors, extra_files=extra)
    _share_like_a_plain_directory(out)
    log(f"wrote {out}: config.json, model.safetensors ({dtype}), {', '.join(sorted(extra))}")
    return out


def _current_umask() -> int:
    """The process's umask (read by setting it, the only portable way, and putting it back
    at once)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _share_like_a_plain_directory(out: Path) -> None:
    """Give the published model the modes ``mkdir`` and ``open`` would have, not the
    owner-only ones of the temporaries it was published from: an export is made to be
    served (``vllm serve`` often runs as another user), while checkpoints stay private."""
    mask = _current_umask()
    for path in out.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~mask)
    out.chmod(0o777 & ~mask)
