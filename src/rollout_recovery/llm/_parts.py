"""What a torch job trains with, built from its config sections
(``TrainerConfig.torch_parts``), so the job names no trainer, task or backend of this
package.

Nothing here imports torch at module level: a default install imports this package, and
``LlmParts.build`` refuses a missing ``[llm]`` extra with a ``ConfigError`` naming it. The
sections build their parts, so ``_config`` imports this module; the sections' types are
named here for the type checker only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError, RolloutRecoveryError
from ..policy import TaskConfig
from ._emit_task import EmitTokenEpisodes, EmitTokenTask
from ._extra import require_llm
from ._model_source import prepare_model

if TYPE_CHECKING:  # torch is imported only when a torch job is built
    from ._backend import TransformersBackend
    from ._config import ModelConfig, TrainerConfig
    from ._trainer import TorchGRPOTrainer

__all__ = ["LlmParts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmParts:
    """The torch trainer on ``[model]`` and ``[task]``'s emit-token prompts; the backend
    that samples the trainer's weights is built from them (in process, or the episodes an
    HTTP backend runs on vLLM servers)."""

    trainer: TorchGRPOTrainer
    dataset: EmitTokenTask
    seed: int
    max_tokens: int

    @classmethod
    def build(
        cls, trainer: TrainerConfig, model: ModelConfig, task: TaskConfig, *, seed: int
    ) -> LlmParts:
        """The trainer on the prepared model and the emit-token dataset on its vocabulary."""
        require_llm()
        import torch

        from ._trainer import TorchGRPOTrainer

        if trainer.threads:
            torch.set_num_threads(trainer.threads)
        directory = prepare_model(model)
        try:
            torch_trainer = TorchGRPOTrainer(
                directory,
                seed=seed,
                learning_rate=trainer.learning_rate,
                clip_epsilon=trainer.clip_epsilon,
                micro_batch_size=trainer.micro_batch or None,
                epochs=trainer.epochs,
                weight_decay=trainer.weight_decay,
                max_grad_norm=trainer.max_grad_norm or None,
                logprob_tolerance=trainer.logprob_tolerance,
            )
        except RolloutRecoveryError:
            raise
        except (RuntimeError, ValueError, KeyError, TypeError, OSError) as error:
            # What torch and transformers raise for a configuration and weights that do
            # not make a model (shapes that disagree, an unknown architecture): the job's
            # configuration is at fault, before anything was written.
            raise ConfigError(
                f"the model in {str(directory)!r} cannot be built: {type(error).__name__}: "
                f"{_first_lines(str(error))}",
                path="$.model.source",
            ) from error
        vocab_size = torch_trainer.vocab_size
        bos = getattr(torch_trainer.skeleton.config, "bos_token_id", None)
        dataset = EmitTokenTask(
            task.dataset_size,
            seed=seed,
            vocab_size=vocab_size,
            target_token=task.target_token,
            bos_token_id=bos if isinstance(bos, int) and 0 <= bos < vocab_size else 0,
        )
        return cls(trainer=torch_trainer, dataset=dataset, seed=seed, max_tokens=task.max_tokens)

    def episodes(self) -> EmitTokenEpisodes:
        """The dataset's episodes, for the HTTP backend to run on vLLM servers."""
        return EmitTokenEpisodes(self.dataset, max_tokens=self.max_tokens)

    def transformers_backend(self) -> TransformersBackend:
        """The in-process backend sampling the trainer's current weights at its
        temperature (the ratio's denominator is this sampler's logprob)."""
        from ._backend import TransformersBackend

        return TransformersBackend(
            skeleton=self.trainer.skeleton,
            task=self.dataset,
            initial_weights=self.trainer.weights(),
            seed=self.seed,
            max_tokens=self.max_tokens,
            temperature=self.trainer.temperature,
        )


def _first_lines(text: str, lines: int = 3) -> str:
    """A long message (torch lists every mismatched tensor) cut to its first lines."""
    kept = text.strip().splitlines()
    more = f" (... {len(kept) - lines} more lines)" if len(kept) > lines else ""
    return " ".join(line.strip() for line in kept[:lines]) + more
