"""What a model is besides its parameters: its config and its buffers.

A :class:`ModelSkeleton` plus a :class:`TorchWeights` snapshot is a runnable model
(:meth:`ModelSkeleton.build`), made without copying the snapshot's tensors. The trainer
hands out its skeleton, so an in-process backend needs no second read of the model files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch
from transformers import PretrainedConfig, PreTrainedModel

from ..errors import InvalidArgumentError
from ._model_files import buffers_of, instantiate, load_causal_lm
from ._weights import TorchWeights

__all__ = ["ModelSkeleton"]


@dataclass(frozen=True, slots=True)
class ModelSkeleton:
    """A model's config, buffers and parameter names and shapes."""

    config: PretrainedConfig
    buffers: Mapping[str, torch.Tensor]
    shapes: Mapping[str, tuple[int, ...]]

    @classmethod
    def of(cls, model: PreTrainedModel) -> ModelSkeleton:
        return cls(
            config=model.config,
            buffers=MappingProxyType(buffers_of(model)),
            shapes=MappingProxyType({name: tuple(p.shape) for name, p in model.named_parameters()}),
        )

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelSkeleton:
        """Reads the model once (fp32) to learn its buffers and shapes."""
        return cls.of(load_causal_lm(Path(model_dir)))

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    def check(self, weights: TorchWeights) -> TorchWeights:
        """``weights`` if it is a snapshot of this model (names and shapes), else an error."""
        shapes = {name: tuple(t.shape) for name, t in weights.tensors.items()}
        if shapes != dict(self.shapes):
            differing = sorted(set(shapes) ^ set(self.shapes)) or sorted(
                name for name in shapes if shapes[name] != self.shapes[name]
            )
            raise InvalidArgumentError(
                f"weights version {weights.version} do not fit this model: "
                f"names or shapes differ at {differing[:5]}"
            )
        return weights

    def build(self, weights: TorchWeights) -> PreTrainedModel:
        """An eval-mode model around ``weights``' tensors (shared, not copied)."""
        self.check(weights)
        return instantiate(self.config, weights.tensors, self.buffers)
