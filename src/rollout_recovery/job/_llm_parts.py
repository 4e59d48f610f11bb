"""The LLM job's model, prepared before the run directory is claimed.

:func:`resolve_model` builds or converts the model on first use and records the digest of
its files in ``[model] digest`` (and, for the dataset task, the digest of the data and the
tokenizer in ``[task] digest``), so the digests are part of the job's identity
(``job.toml``, every checkpoint) and a rerun against other model files or other data is
refused. The torch trainer, its task and their backends are built like every other
learner and backend, from the run config's table of backends (``control.BACKENDS``).
torch is imported only by the llm package, and only for a torch job; a default install
without it gets a ``ConfigError`` naming the ``[llm]`` extra.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ..control import RunConfig

__all__ = ["resolve_model"]


def resolve_model(config: RunConfig, log: Callable[[str], None] = lambda _: None) -> RunConfig:
    """The config with ``[model] digest`` taken from the model's files (built or converted
    first when missing); a job without the torch trainer is returned as it is. The
    refusals are ``ModelConfig.resolved``'s."""
    if config.trainer.kind != "torch":
        return config
    model = config.model.resolved(target_token=config.task.target_token, log=log)
    # A dataset's digest covers the model's tokenizer: taken once the model is prepared.
    task = model.resolved_dataset(config.task, log=log)
    return msgspec.structs.replace(config, model=model, task=task)

