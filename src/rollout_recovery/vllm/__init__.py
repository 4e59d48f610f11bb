"""Real vLLM servers kept in sync with the trainer (``[vllm]``, ``weight_sync = "vllm"``).

:class:`VllmFleet` starts and supervises local vLLM servers (each in its own process group
under a guard that ends it with the job); :class:`VllmWeightSync` loads every new weight
version into running servers over HTTP without a restart (pause, load, name the version,
clear the prefix cache, resume), handling the traps of vLLM on CPU (a stale tied
``lm_head``, a stale prefix cache, a load under a request in flight). Nothing here imports
torch or vLLM: the loading itself runs inside vLLM's worker (``_extension/``).
"""

from ._config import VllmConfig, VllmDtype, check_vllm_config
from ._fleet import (
    EXTENSION_CLASS,
    EXTENSION_DIR,
    LaunchedServer,
    VllmFleet,
    check_launch_paths,
    server_command,
    server_environment,
)
from ._sync import LOAD_METHOD, LOADING_TAG, VllmWeightSync, weights_file_name

__all__ = [
    "EXTENSION_CLASS",
    "EXTENSION_DIR",
    "LOADING_TAG",
    "LOAD_METHOD",
    "LaunchedServer",
    "VllmConfig",
    "VllmDtype",
    "VllmFleet",
    "VllmWeightSync",
    "check_launch_paths",
    "check_vllm_config",
    "server_command",
    "server_environment",
    "weights_file_name",
]
