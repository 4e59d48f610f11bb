"""Helpers of the LLM tests: on-policy GRPO samples from the tiny model, tensor comparisons."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from rollout_recovery.finalize import grpo_advantages
from rollout_recovery.llm._emit_task import EmitTokenTask
from rollout_recovery.llm._generate import generate, seed_for
from rollout_recovery.llm._trainer import TorchGRPOTrainer
from rollout_recovery.policy import TrainSample

#: The tiny model's (seed 1234) most likely token at the start (p about 0.004).
TARGET = 313


def sample_row(
    prompt: list[int], tokens: list[int], logprobs: list[float], advantage: float
) -> TrainSample:
    return TrainSample(
        token_ids=np.array([*prompt, *tokens], dtype=np.int32),
        token_mask=np.array([0.0] * len(prompt) + [1.0] * len(tokens), dtype=np.float32),
        logprobs=np.array([0.0] * len(prompt) + list(logprobs), dtype=np.float32),
        advantage=float(advantage),
    )


def on_policy_batch(
    trainer: TorchGRPOTrainer,
    task: EmitTokenTask,
    *,
    step: int,
    prompts: int = 4,
    group: int = 4,
    max_tokens: int = 6,
    seed: int = 0,
) -> tuple[list[TrainSample], float]:
    """GRPO samples generated from the trainer's current weights; and their mean reward."""
    model = trainer.skeleton.build(trainer.weights())
    samples: list[TrainSample] = []
    rewards_seen: list[float] = []
    for p in range(prompts):
        prompt = task[step * prompts + p]["prompt_token_ids"]
        completions = [
            generate(
                model,
                prompt,
                max_tokens=max_tokens,
                temperature=trainer.temperature,
                seed=seed_for(seed, f"{step}/{p}/{g}"),
            )
            for g in range(group)
        ]
        rewards = np.array([task.reward(c.token_ids) for c in completions])
        rewards_seen += list(rewards)
        advantages = grpo_advantages(rewards, np.ones(group, dtype=bool))
        for completion, advantage in zip(completions, advantages, strict=True):
            samples.append(
                sample_row(
                    prompt,
                    completion.token_ids.tolist(),
                    completion.logprobs.tolist(),
                    float(advantage),
                )
            )
    return samples, float(np.mean(rewards_seen))


def fixed_batch(
    prompt_len: int = 4, count: int = 6, length: int = 5, seed: int = 3
) -> list[TrainSample]:
    """Off-policy samples with arbitrary tokens, logprobs and both advantage signs."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(count):
        prompt = [0, *rng.integers(5, 333, size=prompt_len - 1).tolist()]
        tokens = rng.integers(5, 333, size=length + i % 3).tolist()
        logprobs = (np.log(1 / 333) + rng.normal(0, 0.05, size=len(tokens))).tolist()
        samples.append(sample_row(prompt, tokens, logprobs, advantage=(-1.0) ** i * (0.5 + i / 10)))
    return samples


def assert_tensors_equal(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> None:
    """Bit for bit: same names, dtypes, shapes and values."""
    assert sorted(a) == sorted(b)
    differing = [
        name for name in a if not (a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]))
    ]
    assert not differing, f"tensors differ: {differing[:5]}"
