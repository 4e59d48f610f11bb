"""The LLM job's parts, from ``[trainer] kind = "torch"``, ``[model]`` and ``[task]``.

:func:`resolve_model` runs before the run directory is claimed: it builds or converts the
model on first use and records the digest of its files in ``[model] digest``, so the
digest is part of the job's identity (``job.toml``, every checkpoint) and a rerun against
other model files is refused. :func:`llm_components` builds the torch trainer on that
model and the emit-token dataset (``TrainerConfig.torch_parts``, which does both) and
their generation backend: the in-process transformers backend, or (``[generation]
backend = "http"``, which ``check_combination`` allows only with ``[http] weight_sync =
"vllm"``) the HTTP backend running the emit-token episodes on vLLM servers that load
every new version of the trainer's weights. torch is imported only by the llm package,
and only for a torch job; a default install without it gets a ``ConfigError`` naming
the ``[llm]`` extra.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ..control import RunConfig
from ..dataplane import DataPlane
from ..rollout import GenerationBackend, HttpGenerationBackend
from ._components import JobComponents, http_weight_sync, server_api_key

__all__ = ["llm_components", "resolve_model"]


def resolve_model(config: RunConfig, log: Callable[[str], None] = lambda _: None) -> RunConfig:
    """The config with ``[model] digest`` taken from the model's files (built or converted
    first when missing); a job without the torch trainer is returned as it is. The
    refusals are ``ModelConfig.resolved``'s."""
    if config.trainer.kind != "torch":
        return config
    model = config.model.resolved(target_token=config.task.target_token, log=log)
    return msgspec.structs.replace(config, model=model)


# The torch weights' type is the llm package's own: the job only passes them along.
def llm_components(config: RunConfig, data_plane: DataPlane) -> JobComponents[Any]:
    """The torch trainer on ``[model]``, ``[task]``'s emit-token prompts, and the backend
    sampling the trainer's weights: in process (``"transformers"``) or on vLLM servers
    (``"http"``, the servers of ``[http] servers``, which :func:`run_job` fills in when it
    launches them)."""
    parts = config.trainer.torch_parts(config.model, config.task, seed=config.job.seed)
    trainer = parts.trainer
    backend: GenerationBackend[Any]
    if config.generation.backend == "http":
        # The trainer's temperature: its recomputed logprobs are of the distribution the
        # servers sampled from only if they sample at the same one.
        vllm = config.http.weight_sync == "vllm"
        backend = HttpGenerationBackend.from_config(
            config.http,
            generation=config.generation,
            task=config.task,
            vocab_size=trainer.vocab_size,
            episodes=parts.episodes(),
            weight_sync=http_weight_sync(config, trainer),
            api_key=server_api_key(config),
            sync_timeout_s=config.vllm.sync_timeout_s if vllm else None,
            temperature=trainer.temperature,
            initial_version=trainer.weight_version,
            initial_weights=trainer.weights(),
        )
    else:
        backend = parts.transformers_backend()
    return JobComponents(dataset=parts.dataset, backend=backend, trainer=trainer)
