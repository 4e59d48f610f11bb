"""Real language models with torch and transformers (``pip install 'rollout-recovery[llm]'``).

:func:`build_tiny_llama` makes a tiny random Llama from a seed with no model hub;
:func:`load_causal_lm` reads a Hugging Face model directory (config and safetensors) and
:func:`write_model_dir` writes one. Importing this package needs torch and transformers;
the rest of the library never imports it unless a job asks for it.
"""

from ._model_files import load_causal_lm, write_model_dir
from ._tiny_llama import TinyLlamaSpec, build_tiny_llama

__all__ = [
    "TinyLlamaSpec",
    "build_tiny_llama",
    "load_causal_lm",
    "write_model_dir",
]
