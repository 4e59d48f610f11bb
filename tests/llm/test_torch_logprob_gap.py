"""The torch trainer refuses a step of another model's logprobs (issue 24, item 12).

Tokens stamped with the version the trainer holds must carry the logprobs its first pass
recomputes, up to numerical noise; the gap to another model's is orders of magnitude
larger, and such a step changes no parameter, optimizer or RNG state.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from llm_support import TARGET, on_policy_batch

from rollout_recovery.llm._emit_task import EmitTokenTask
from rollout_recovery.llm._trainer import TorchGRPOTrainer
from rollout_recovery.policy import TrainSample


def _stamped(samples: list[TrainSample], version: int) -> list[TrainSample]:
    return [
        dataclasses.replace(
            s, token_versions=np.where(s.token_mask == 1.0, version, -1).astype(np.int64)
        )
        for s in samples
    ]


def _task(trainer: TorchGRPOTrainer) -> EmitTokenTask:
    return EmitTokenTask(256, seed=0, vocab_size=trainer.vocab_size, target_token=TARGET)


def _another_model(model_dir: Path) -> TorchGRPOTrainer:
    """The same architecture after a few large steps towards the target: another model."""
    other = TorchGRPOTrainer(model_dir, seed=1, learning_rate=5e-2)
    task = _task(other)
    for step in range(3):
        samples, _ = on_policy_batch(other, task, step=step)
        other.train_step(samples)
    return other


def test_in_process_generation_is_checked_and_trains(tiny_model_dir: Path) -> None:
    trainer = TorchGRPOTrainer(tiny_model_dir, seed=0, learning_rate=1e-2)
    samples, _ = on_policy_batch(trainer, _task(trainer), step=0)
    # Advantages of both signs, so an accepted step moves the weights.
    samples = [dataclasses.replace(s, advantage=(-1.0) ** i) for i, s in enumerate(samples)]
    before = trainer.named_parameters()

    metrics = trainer.train_step(_stamped(samples, version=0))
    print(f"in-process generation vs the trainer: gap {metrics['logprob_gap']:.3g} nats")

    assert metrics["logprob_refused"] == 0.0
    assert metrics["logprob_checked_tokens"] == metrics["tokens"] > 0
    assert metrics["logprob_gap"] < 1e-4, metrics["logprob_gap"]
    after = trainer.named_parameters()
    assert any(not (after[name] == before[name]).all() for name in before)


def test_another_models_logprobs_are_refused_and_change_nothing(tiny_model_dir: Path) -> None:
    trainer = TorchGRPOTrainer(tiny_model_dir, seed=0, learning_rate=1e-2)
    other = _another_model(tiny_model_dir)
    samples, _ = on_policy_batch(other, _task(trainer), step=5)
    before = trainer.state_files()

    metrics = trainer.train_step(_stamped(samples, version=0))

    print(f"another model: gap {metrics['logprob_gap']:.3g} nats")
    assert metrics["logprob_refused"] == 1.0, metrics
    assert metrics["logprob_gap"] > 0.2
    assert trainer.weight_version == 1
    after = trainer.state_files()
    # Parameters, optimizer state and the RNG (in state.json, with the version) unchanged.
    assert {k: v for k, v in after.items() if k != "state.json"} == {
        k: v for k, v in before.items() if k != "state.json"
    }
    assert after["state.json"].replace(b'"version":1', b'"version":0') == before["state.json"]
    # Not stamped with the trainer's version (stale, or not vouched for): not checked.
    unchecked = trainer.train_step(_stamped(samples, version=0))
    assert unchecked["logprob_checked_tokens"] == 0 and unchecked["logprob_refused"] == 0.0


def test_each_samples_own_gap_names_the_lying_rows_across_micro_batches(
    tiny_model_dir: Path,
) -> None:
    # Micro-batches of 3 over honest and lying samples interleaved, and one unchecked:
    # each sample's own gap, in the batch's order.
    trainer = TorchGRPOTrainer(tiny_model_dir, seed=0, learning_rate=1e-2, micro_batch_size=3)
    honest, _ = on_policy_batch(trainer, _task(trainer), step=0)
    lying, _ = on_policy_batch(_another_model(tiny_model_dir), _task(trainer), step=5)
    pairs = zip(_stamped(honest[:3], 0), _stamped(lying[:3], 0), strict=True)
    samples = [*(sample for pair in pairs for sample in pair), honest[3]]  # the last unstamped

    metrics = trainer.train_step(samples)

    assert metrics["logprob_refused"] == 1.0
    gaps = trainer.sample_logprob_gaps
    assert len(gaps) == 7
    assert all(gap < 1e-4 for gap in gaps[0:6:2]), gaps
    assert all(gap > 0.2 for gap in gaps[1:6:2]), gaps
    assert np.isnan(gaps[6])
