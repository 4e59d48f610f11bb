"""The ``[llm]`` extra: what the torch trainer needs installed, looked up, never imported.

A default install imports the llm package (the config tree holds its sections), so
whether torch, transformers and safetensors are there is found by looking them up: the
job refuses a torch job without them, naming the extra, before it writes anything.
"""

from __future__ import annotations

import importlib.util
from typing import Final

from ..errors import ConfigError

__all__ = ["LLM_EXTRA_HINT", "require_llm"]

#: What to install for the torch trainer (the extra pins torch: an unpinned one may pull a
#: multi-GB CUDA build).
LLM_EXTRA_HINT: Final = "the [llm] extra: pip install 'rollout-recovery[llm]'"

_LLM_MODULES: Final = ("torch", "transformers", "safetensors")


def require_llm(path: str = "$.trainer.kind") -> None:
    """A :class:`ConfigError` at ``path`` naming the ``[llm]`` extra when torch,
    transformers or safetensors is missing (looked up, not imported)."""
    missing = [name for name in _LLM_MODULES if _missing(name)]
    if missing:
        raise ConfigError(
            f"the torch trainer needs {', '.join(missing)}: install {LLM_EXTRA_HINT}",
            path=path,
        )


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        # A module set to None in sys.modules (how tests hide one) raises ValueError.
        return True
