"""Real vLLM servers kept in sync with the trainer (``[vllm]``, ``weight_sync = "vllm"``).

:class:`VllmFleet` starts and supervises local vLLM servers (each in its own process group
under a guard that ends it with the job); :class:`VllmWeightSync` loads every new weight
version into running servers over HTTP without a restart (pause, load, name the version,
clear the prefix cache, resume), handling the traps of vLLM on CPU (a stale tied
``lm_head``, a stale prefix cache, a load under a request in flight). Nothing here imports
torch or vLLM: the loading itself runs inside vLLM's worker (``_extension/``).
"""

from ._config import VllmConfig

__all__ = [
    "VllmConfig",
]
