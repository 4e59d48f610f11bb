"""The LLM job's parts, from ``[trainer] kind = "torch"``, ``[model]`` and ``[task]``.

:func:`resolve_model` runs before the run directory is claimed: it builds or converts the
model on first use and records the digest of its files in ``[model] digest``, so the
digest is part of the job's identity (``job.toml``, every checkpoint) and a rerun against
other model files is refused. :func:`llm_components` builds the torch trainer on that
model, the emit-token dataset and its generation backend: the in-process transformers
backend, or (``[generation] backend = "http"``, which ``check_combination`` allows only
with ``[http] weight_sync = "vllm"``) the HTTP backend running the emit-token episodes on
vLLM servers that load every new version of the trainer's weights. torch is imported
only here, and only for a torch job; a default install without it gets a ``ConfigError``
naming the ``[llm]`` extra.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from ..control import RunConfig
from ..dataplane import DataPlane
from ..errors import ConfigError
from ..llm import EmitTokenEpisodes, model_digest, prepare_model, require_llm
from ..rollout import GenerationBackend, HttpGenerationBackend
from ._components import JobComponents, http_weight_sync, server_api_key

if TYPE_CHECKING:  # torch is imported only when a torch job is built
    from ..llm import TorchWeights

__all__ = ["llm_components", "resolve_model"]


def resolve_model(config: RunConfig, log: Callable[[str], None] = lambda _: None) -> RunConfig:
    """The config with ``[model] digest`` taken from the model's files (built or converted
    first when missing); a job without the torch trainer is returned as it is.

    Refuses, with a ``ConfigError``: a missing ``[llm]`` extra, a source that is not a
    model, files whose digest differs from a pinned ``digest``, a ``target_token`` outside
    the model's vocabulary.
    """
    if config.trainer.kind != "torch":
        return config
    require_llm()
    model = config.model
    directory = prepare_model(model)
    digest = model_digest(directory)
    if model.digest and model.digest != digest:
        raise ConfigError(
            f"the model files in {str(directory)!r} have digest {digest}, not the "
            f"{model.digest} this job was started with: the model changed (restore its "
            "files, or start a new run in another directory)",
            path="$.model.digest",
        )
    vocab = _vocab_size(directory)
    if vocab is not None and config.task.target_token >= vocab:
        raise ConfigError(
            f"{config.task.target_token} is outside the model's vocabulary of {vocab}",
            path="$.task.target_token",
        )
    log(f"model {model.source}: {directory} (sha256 {digest[:16]}...)")
    return msgspec.structs.replace(config, model=msgspec.structs.replace(model, digest=digest))


def _vocab_size(directory: Path) -> int | None:
    try:
        value = json.loads((directory / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def llm_components(config: RunConfig, data_plane: DataPlane) -> JobComponents[TorchWeights]:
    """The torch trainer on ``[model]``, ``[task]``'s emit-token prompts, and the backend
    sampling the trainer's weights: in process (``"transformers"``) or on vLLM servers
    (``"http"``, the servers of ``[http] servers``, which :func:`run_job` fills in when it
    launches them)."""
    require_llm()
    import torch

    from ..llm import EmitTokenTask, TorchGRPOTrainer, TransformersBackend

    trainer_config, task_config, seed = config.trainer, config.task, config.job.seed
    if trainer_config.threads:
        torch.set_num_threads(trainer_config.threads)
    trainer = TorchGRPOTrainer(
        prepare_model(config.model),
        seed=seed,
        learning_rate=trainer_config.learning_rate,
        clip_epsilon=trainer_config.clip_epsilon,
        micro_batch_size=trainer_config.micro_batch or None,
        epochs=trainer_config.epochs,
        weight_decay=trainer_config.weight_decay,
        max_grad_norm=trainer_config.max_grad_norm or None,
    )
    bos = getattr(trainer.skeleton.config, "bos_token_id", None)
    dataset = EmitTokenTask(
        task_config.dataset_size,
        seed=seed,
        vocab_size=trainer.vocab_size,
        target_token=task_config.target_token,
        bos_token_id=bos if isinstance(bos, int) and 0 <= bos < trainer.vocab_size else 0,
    )
    backend: GenerationBackend[TorchWeights]
    if config.generation.backend == "http":
        # The trainer's temperature: its recomputed logprobs are of the distribution the
        # servers sampled from only if they sample at the same one.
        vllm = config.http.weight_sync == "vllm"
        backend = HttpGenerationBackend.from_config(
            config.http,
            generation=config.generation,
            task=config.task,
            vocab_size=trainer.vocab_size,
            episodes=EmitTokenEpisodes(dataset, max_tokens=task_config.max_tokens),
            weight_sync=http_weight_sync(config, trainer),
            api_key=server_api_key(config),
            sync_timeout_s=config.vllm.sync_timeout_s if vllm else None,
            temperature=trainer.temperature,
            initial_version=trainer.weight_version,
            initial_weights=trainer.weights(),
        )
    else:
        backend = TransformersBackend(
            skeleton=trainer.skeleton,
            task=dataset,
            initial_weights=trainer.weights(),
            seed=seed,
            max_tokens=task_config.max_tokens,
            temperature=trainer.temperature,
        )
    return JobComponents(dataset=dataset, backend=backend, trainer=trainer)
