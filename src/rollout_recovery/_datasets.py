"""Map-style datasets: the one rule that makes an item reproducible anywhere.

Shared by the synthetic task set (``policy``) and the LLM job's emit-token task (``llm``).
"""

from __future__ import annotations

import numpy as np

from .errors import InvalidArgumentTypeError

__all__ = ["item_rng"]


def item_rng(idx: object, *, size: int, seed: int) -> tuple[int, np.random.Generator]:
    """Item ``idx`` of a map-style dataset of ``size`` items, checked, and the generator
    that draws it: one per ``(seed, idx)``, so an item never depends on which items were
    read before it, or in which process (the controller rebuilds prompts after a restart
    and the ledger checks them)."""
    if isinstance(idx, bool) or not isinstance(idx, int | np.integer):
        raise InvalidArgumentTypeError(f"task index must be an int, got {type(idx).__name__}")
    idx = int(idx)
    if not 0 <= idx < size:
        raise IndexError(f"task index {idx} out of range for {size} tasks")
    return idx, np.random.default_rng([seed, idx])
