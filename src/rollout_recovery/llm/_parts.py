"""What a torch job trains with, built from its config sections
(``TrainerConfig.torch_parts``), so the job names no trainer, task or backend of this
package.

Nothing here imports torch at module level: a default install imports this package, and
``LlmParts.build`` refuses a missing ``[llm]`` extra with a ``ConfigError`` naming it. The
sections build their parts, so ``_config`` imports this module; the sections' types are
named here for the type checker only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .._reward_function import RewardConfig
from ..errors import ConfigError, InvalidStateError, RolloutRecoveryError
from ..policy import TaskConfig
from ._dataset import load_rows
from ._dataset_task import DatasetEpisodes, DatasetTask, Tokenizer
from ._emit_task import EmitTokenEpisodes, EmitTokenTask
from ._episodes import Episodes
from ._extra import require_llm
from ._model_source import prepare_model
from ._samples import CompletionSamples

if TYPE_CHECKING:  # torch is imported only when a torch job is built
    from ._backend import TransformersBackend
    from ._config import ModelConfig, TrainerConfig
    from ._trainer import TorchGRPOTrainer

__all__ = ["LlmParts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmParts:
    """The torch trainer on ``[model]`` and ``[task]``'s prompts (emit-token, or the rows
    of a dataset scored by ``[reward] function``); the backend that samples the trainer's
    weights is built from them (in process, or the episodes an HTTP backend runs on vLLM
    servers)."""

    trainer: TorchGRPOTrainer
    dataset: EmitTokenTask | DatasetTask
    task_episodes: Episodes
    seed: int
    max_tokens: int
    #: Tokens that end a call early (the dataset task: the model's end of sequence).
    stop_token_ids: frozenset[int]
    #: The model's tokenizer, when its directory has one (for the step samples).
    tokenizer: Tokenizer | None

    @classmethod
    def build(
        cls,
        trainer: TrainerConfig,
        model: ModelConfig,
        task: TaskConfig,
        *,
        seed: int,
        reward: RewardConfig | None = None,
    ) -> LlmParts:
        """The trainer on the prepared model and the task's dataset on its vocabulary."""
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
        except InvalidStateError as error:
            # Weight files that do not fit the config (the trainer checks their headers).
            raise _unbuildable(directory, error) from error
        except RolloutRecoveryError:
            raise
        except (RuntimeError, ValueError, KeyError, TypeError, OSError) as error:
            # What torch and transformers raise for a configuration and weights that do
            # not make a model (shapes that disagree, an unknown architecture): the job's
            # configuration is at fault, before anything was written.
            raise _unbuildable(directory, error) from error
        tokenizer = _tokenizer(directory, required=task.kind == "dataset")
        if task.kind == "dataset":
            rows = load_rows(task)
            assert tokenizer is not None  # required above
            dataset = DatasetTask(rows, task, tokenizer)
            function = (reward or RewardConfig()).load(dataset.field_names)
            return cls(
                trainer=torch_trainer,
                dataset=dataset,
                task_episodes=DatasetEpisodes(dataset, function, max_tokens=task.max_tokens),
                seed=seed,
                max_tokens=task.max_tokens,
                stop_token_ids=_end_of_sequence(directory, tokenizer),
                tokenizer=tokenizer,
            )
        vocab_size = torch_trainer.vocab_size
        bos = getattr(torch_trainer.skeleton.config, "bos_token_id", None)
        emit = EmitTokenTask(
            task.dataset_size,
            seed=seed,
            vocab_size=vocab_size,
            target_token=task.target_token,
            bos_token_id=bos if isinstance(bos, int) and 0 <= bos < vocab_size else 0,
        )
        return cls(
            trainer=torch_trainer,
            dataset=emit,
            task_episodes=EmitTokenEpisodes(emit, max_tokens=task.max_tokens),
            seed=seed,
            max_tokens=task.max_tokens,
            stop_token_ids=frozenset(),
            tokenizer=tokenizer,
        )

    def episodes(self) -> Episodes:
        """The task's episodes, for the HTTP backend to run on vLLM servers."""
        return self.task_episodes

    def transformers_backend(self) -> TransformersBackend:
        """The in-process backend sampling the trainer's current weights at its
        temperature (the ratio's denominator is this sampler's logprob)."""
        from ._backend import TransformersBackend

        return TransformersBackend(
            skeleton=self.trainer.skeleton,
            episodes=self.task_episodes,
            initial_weights=self.trainer.weights(),
            seed=self.seed,
            max_tokens=self.max_tokens,
            temperature=self.trainer.temperature,
            stop_token_ids=self.stop_token_ids,
        )

    def step_samples(self, count: int) -> CompletionSamples | None:
        """What each step's metrics say about ``count`` of its completions (prompt,
        completion, reward, components); None for none."""
        if count < 1:
            return None
        return CompletionSamples(self.dataset, self.tokenizer, count=count)


def _tokenizer(model_dir: Path, *, required: bool) -> Tokenizer | None:
    """The model directory's tokenizer; None when it has none (and none is required)."""
    from transformers import AutoTokenizer

    try:
        # Typed by the protocol the task uses: transformers' classes are unannotated.
        tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError, TypeError) as error:
        if not required:
            return None
        raise ConfigError(
            f"the dataset task needs the model's tokenizer, and {str(model_dir)!r} has none "
            f"that loads: {error}",
            path="$.model.source",
        ) from None
    return cast("Tokenizer", tokenizer)


def _end_of_sequence(model_dir: Path, tokenizer: Tokenizer) -> frozenset[int]:
    """The ids that end a completion: ``eos_token_id`` of the generation config and the
    model config (an id or a list of them), and the tokenizer's."""
    found: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        try:
            value: Any = json.loads((model_dir / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int) and not isinstance(item, bool):
                found.add(item)
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        found.add(eos)
    return frozenset(found)


def _unbuildable(directory: Path, error: Exception) -> ConfigError:
    """The job's error for a model in ``directory`` that cannot be built: ``error`` named,
    at the config's ``$.model.source``."""
    return ConfigError(
        f"the model in {str(directory)!r} cannot be built: {type(error).__name__}: "
        f"{_first_lines(str(error))}",
        path="$.model.source",
    )


def _first_lines(text: str, lines: int = 3) -> str:
    """A long message (torch lists every mismatched tensor) cut to its first lines."""
    kept = text.strip().splitlines()
    more = f" (... {len(kept) - lines} more lines)" if len(kept) > lines else ""
    return " ".join(line.strip() for line in kept[:lines]) + more
