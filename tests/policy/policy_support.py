"""Episodes through the real capture path: sample from a snapshot, stage, verify, linearize."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from rollout_recovery.capture import CaptureWriter, LinearizedRollout
from rollout_recovery.capture._receipt import assemble_receipt
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.finalize import grpo_advantages
from rollout_recovery.policy import NumpyGRPOTrainer, PolicySnapshot, TaskSet, TrainSample
from rollout_recovery.policy._tasks import ANSWER, DIGIT_BASE

REASONING_TOKENS = 4


def staged_episode(
    snapshot: PolicySnapshot,
    task: Mapping[str, Any],
    rng: np.random.Generator,
    writer: CaptureWriter,
    data_plane: MemoryDataPlane,
    rollout_id: str,
) -> tuple[LinearizedRollout, float]:
    """One two-call episode staged like the simulated backend does, then verified.

    Returns the row exactly as finalization linearizes it, and the episode's reward.
    """
    prompt = list(task["prompt_token_ids"])
    digit = int(task["digit"])
    thoughts, thought_lps = snapshot.sample_reasoning(digit, REASONING_TOKENS, rng)
    first = writer.stage_call(
        rollout_id=rollout_id,
        model_call_id="reason",
        parent=None,
        prompt_token_ids=prompt,
        generated_token_ids=thoughts,
        generated_logprobs=thought_lps,
        weight_version=snapshot.version,
    )
    answer, answer_lps = snapshot.sample_answer(digit, rng)
    second = writer.stage_call(
        rollout_id=rollout_id,
        model_call_id="answer",
        parent=first,
        prompt_token_ids=[*prompt, *thoughts, ANSWER],
        generated_token_ids=answer,
        generated_logprobs=answer_lps,
        weight_version=snapshot.version,
    )
    receipt = assemble_receipt(rollout_id, [first, second], terminal_model_call_id="answer")
    linearized = fetch_and_verify(receipt, data_plane, partition=writer.partition)
    assert isinstance(linearized, LinearizedRollout), linearized
    reward = 1.0 if answer[0] - DIGIT_BASE == task["answer"] else 0.0
    return linearized, reward


def direct_episode(
    snapshot: PolicySnapshot, task: Mapping[str, Any], rng: np.random.Generator
) -> tuple[TrainSample, float]:
    """The same episode (same draws from ``rng``) as :func:`staged_episode`, its row built
    by hand; advantage 0.0. A test pins it equal to the linearized row, so the learning
    test can skip the capture path's digests and run many steps in little time."""
    prompt = list(task["prompt_token_ids"])
    digit = int(task["digit"])
    thoughts, thought_lps = snapshot.sample_reasoning(digit, REASONING_TOKENS, rng)
    answer, answer_lps = snapshot.sample_answer(digit, rng)
    ids = [*prompt, *thoughts, ANSWER, *answer]
    mask = [0.0] * len(prompt) + [1.0] * len(thoughts) + [0.0] + [1.0] * len(answer)
    lps = [0.0] * len(prompt) + thought_lps + [0.0] + answer_lps
    sample = TrainSample(
        token_ids=np.array(ids, np.int32),
        token_mask=np.array(mask, np.float32),
        logprobs=np.array(lps, np.float32),
        advantage=0.0,
    )
    reward = 1.0 if answer[0] - DIGIT_BASE == task["answer"] else 0.0
    return sample, reward


def grpo_run(
    *,
    steps: int,
    seed: int,
    prompts_per_step: int = 8,
    generations: int = 4,
    trainer: NumpyGRPOTrainer | None = None,
) -> tuple[list[float], list[dict[str, float]]]:
    """Synchronous GRPO, rows from :func:`direct_episode`; mean reward and metrics per step."""
    tasks = TaskSet(10_000, seed=seed, prompt_group_every=4)
    trainer = trainer if trainer is not None else NumpyGRPOTrainer(seed=seed)
    rng = np.random.default_rng(seed + 1)
    mean_rewards: list[float] = []
    metrics: list[dict[str, float]] = []
    for step in range(steps):
        snapshot = trainer.weights()
        samples: list[TrainSample] = []
        rewards: list[float] = []
        for p in range(prompts_per_step):
            task = tasks[step * prompts_per_step + p]
            episodes = [direct_episode(snapshot, task, rng) for _ in range(generations)]
            group_rewards = [reward for _, reward in episodes]
            advantages = grpo_advantages(group_rewards)
            for (row, _), advantage in zip(episodes, advantages, strict=True):
                samples.append(dataclasses.replace(row, advantage=float(advantage)))
            rewards.extend(group_rewards)
        metrics.append(trainer.train_step(samples))
        mean_rewards.append(float(np.mean(rewards)))
    return mean_rewards, metrics
