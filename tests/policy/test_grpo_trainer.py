"""The GRPO trainer: analytic gradient, learning, versions, and state round trips."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from policy_support import grpo_run

from rollout_recovery.policy import NumpyGRPOTrainer, Trainer, TrainSample
from rollout_recovery.policy._numpy_policy import PARAM_SHAPES, initial_params
from rollout_recovery.policy._tasks import (
    ANSWER,
    BOS,
    DIGIT_BASE,
    EOS,
    THINK,
    THOUGHT_BASE,
    VOCAB_SIZE,
)

EPS = 0.2


def _sample(
    digit: int, thoughts: list[int], answer: int, logprobs: list[float], advantage: float
) -> TrainSample:
    ids = [BOS, DIGIT_BASE + digit, THINK, *thoughts, ANSWER, DIGIT_BASE + answer, EOS]
    mask = [0.0, 0.0, 0.0, *[1.0] * len(thoughts), 0.0, 1.0, 1.0]
    lps = [0.0, 0.0, 0.0, *logprobs[: len(thoughts)], 0.0, logprobs[-1], 0.0]
    return TrainSample(
        token_ids=np.array(ids, np.int32),
        token_mask=np.array(mask, np.float32),
        logprobs=np.array(lps, np.float32),
        advantage=advantage,
    )


def _trainer_with(params: dict[str, npt.NDArray[np.float64]]) -> NumpyGRPOTrainer:
    trainer = NumpyGRPOTrainer(seed=0, clip_epsilon=EPS)
    state = trainer.state()
    for name, value in params.items():
        state[f"param.{name}"] = value
    trainer.load_state(state)
    return trainer


def _tiny_batch(params: dict[str, npt.NDArray[np.float64]]) -> list[TrainSample]:
    """Samples whose captured logprobs put ratios inside, below and above the clip range,
    none near a kink (|log ratio| far from log(1 +- eps)), with both advantage signs."""
    rng = np.random.default_rng(7)
    current = _trainer_with(params).weights()
    samples = []
    offsets = [0.0, 0.5, -0.5, 0.05, -0.6, 0.7]  # log ratio = -offset
    for i, offset in enumerate(offsets):
        digit = i % 3
        thoughts = [THOUGHT_BASE + int(t) for t in rng.integers(0, 8, size=2)]
        answer = int(rng.integers(0, 10))
        row = _sample(digit, thoughts, answer, [0.0, 0.0, 0.0], 1.0)
        true = current.token_logprobs(row.token_ids, row.token_mask)
        captured = np.where(row.token_mask == 1.0, true + offset, 0.0)
        captured[-1] = 0.0  # EOS stays deterministic
        samples.append(
            TrainSample(
                token_ids=row.token_ids,
                token_mask=row.token_mask,
                logprobs=captured.astype(np.float32),
                advantage=1.3 if i % 2 == 0 else -0.8,
            )
        )
    return samples


def test_analytic_gradient_matches_finite_differences() -> None:
    params = initial_params(11, 0.7)
    batch = _tiny_batch(params)
    loss, grads = _trainer_with(params).loss_and_grad(batch)
    assert np.isfinite(loss)
    metrics = _trainer_with(params).train_step(batch)
    assert 0.0 < metrics["clip_fraction"] < 1.0  # both branches of the min are exercised
    h = 1e-6
    for name, shape in PARAM_SHAPES.items():
        numeric = np.zeros(shape)
        for index in np.ndindex(*shape):
            plus = {k: v.copy() for k, v in params.items()}
            minus = {k: v.copy() for k, v in params.items()}
            plus[name][index] += h
            minus[name][index] -= h
            numeric[index] = (
                _trainer_with(plus).loss_and_grad(batch)[0]
                - _trainer_with(minus).loss_and_grad(batch)[0]
            ) / (2 * h)
        np.testing.assert_allclose(grads[name], numeric, atol=1e-7, rtol=1e-5, err_msg=name)
        assert np.abs(grads[name]).max() > 1e-3  # not vacuously zero


def test_clipped_tokens_get_no_gradient() -> None:
    # One token, positive advantage, ratio far above 1 + eps: the clipped term is the min.
    trainer = NumpyGRPOTrainer(seed=0, clip_epsilon=EPS, init_std=0.0)
    uniform = float(np.log(0.1))
    sample = _sample(0, [], 3, [uniform - 1.0], advantage=1.0)
    loss, grads = trainer.loss_and_grad([sample])
    assert all(not g.any() for g in grads.values())
    # Loss is the mean over both generated tokens (answer clipped at 1 + eps, EOS at 1).
    assert loss == pytest.approx(-((1 + EPS) + 1.0) / 2)


def test_grpo_learns_the_hidden_rule_quickly() -> None:
    started = time.process_time()
    rewards, metrics = grpo_run(steps=40, seed=0)
    elapsed = time.process_time() - started
    first, last = float(np.mean(rewards[:5])), float(np.mean(rewards[-5:]))
    assert first < 0.3
    assert last > first + 0.3
    assert last > 0.7
    assert all(np.isfinite(m["loss"]) and m["tokens"] == 32 * 6 for m in metrics)
    # On-policy: captured and recomputed logprobs agree, so nothing is clipped.
    assert metrics[0]["clip_fraction"] == 0.0
    assert metrics[0]["mean_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert elapsed < 5.0  # CPU seconds: a loaded machine does not count


def test_version_advances_once_per_step_even_when_empty() -> None:
    trainer: Trainer = NumpyGRPOTrainer(seed=0)  # statically checks the protocol too
    assert isinstance(trainer, NumpyGRPOTrainer)
    assert trainer.weight_version == 0 and trainer.weights().version == 0
    before = trainer.state()
    metrics = trainer.train_step([])
    assert trainer.weight_version == 1 and trainer.weights().version == 1
    assert metrics["tokens"] == 0.0 and metrics["loss"] == 0.0
    after = trainer.state()
    for key in before:
        if key != "version":
            np.testing.assert_array_equal(before[key], after[key], err_msg=key)
    old = trainer.weights()
    trainer.train_step([_sample(1, [THOUGHT_BASE], 2, [-2.0, -2.3], 1.0)])
    assert trainer.weight_version == 2
    assert old.version == 1 and trainer.weights() is not old
    # The old snapshot did not move with training.
    assert not np.array_equal(
        old.params["answer_logits"], trainer.weights().params["answer_logits"]
    )
    assert trainer.weights() is trainer.weights()


def _trained(steps: int = 3) -> NumpyGRPOTrainer:
    trainer = NumpyGRPOTrainer(seed=5)
    grpo_run(steps=steps, seed=5, trainer=trainer)
    return trainer


def test_state_round_trips_through_savez_without_pickle(tmp_path: Path) -> None:
    trainer = _trained()
    path = tmp_path / "trainer.npz"
    arrays: dict[str, Any] = trainer.state()
    np.savez(path, **arrays)
    with np.load(path, allow_pickle=False) as stored:
        loaded = {key: stored[key] for key in stored.files}
    resumed = NumpyGRPOTrainer(seed=99)  # another init: everything must come from the state
    resumed.load_state(loaded)
    assert resumed.weight_version == trainer.weight_version == 3
    for key, value in trainer.state().items():
        assert resumed.state()[key].dtype == value.dtype
        np.testing.assert_array_equal(resumed.state()[key], value, err_msg=key)
    # Bit-for-bit resume: the same next step gives the same metrics and the same params.
    batch = [_sample(d, [THOUGHT_BASE + d], d, [-2.0, -2.2], float(d) - 1.0) for d in range(3)]
    assert resumed.train_step(batch) == trainer.train_step(batch)
    for key, value in trainer.state().items():
        np.testing.assert_array_equal(resumed.state()[key], value, err_msg=key)


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda state: state.pop(key)


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda state: state.__setitem__(key, value)


@pytest.mark.parametrize(
    ("key", "corrupt"),
    [
        ("param.answer_logits", _drop("param.answer_logits")),
        ("adam_v.thought_logits", _drop("adam_v.thought_logits")),
        ("version", _drop("version")),
        ("param.thought_logits", _set("param.thought_logits", np.zeros((10, 3)))),
        ("adam_m.answer_logits", _set("adam_m.answer_logits", np.zeros(100))),
        ("version", _set("version", np.array([1], dtype=np.int64))),
        ("version", _set("version", np.array(1.5))),
        ("adam_step", _set("adam_step", np.array(-1, dtype=np.int64))),
        ("skipped_in_a_row", _set("skipped_in_a_row", np.array(-2, dtype=np.int64))),
        ("skipped_in_a_row", _set("skipped_in_a_row", np.array(0.5))),
        ("param.answer_logits", _set("param.answer_logits", np.full((10, 10), np.inf))),
        ("param.answer_logits", _set("param.answer_logits", [[0.0] * 10] * 10)),
        ("extra", _set("extra", np.zeros(1))),
        # Issue 24 item 18: past int64 a checkpoint's arrays cannot hold it again.
        ("adam_step", _set("adam_step", np.array(2**64 - 1, dtype=np.uint64))),
        ("version", _set("version", np.array(2**63, dtype=np.uint64))),
    ],
)
def test_load_state_refuses_a_bad_state_and_changes_nothing(
    key: str, corrupt: Callable[[dict[str, Any]], None]
) -> None:
    source = _trained(2)
    state: dict[str, Any] = source.state()
    corrupt(state)
    target = NumpyGRPOTrainer(seed=1)
    before = target.state()
    with pytest.raises(ValueError, match=repr(key)):
        target.load_state(state)
    for name, value in target.state().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_constructor_refuses_bad_hyperparameters() -> None:
    for kwargs in (
        {"learning_rate": 0.0},
        {"clip_epsilon": 1.0},
        {"epochs": 0},
        {"init_std": -1.0},
        {"adam_beta1": 1.0},
    ):
        with pytest.raises(ValueError):
            NumpyGRPOTrainer(seed=0, **kwargs)


def test_stale_samples_are_clipped_after_updates() -> None:
    trainer = NumpyGRPOTrainer(seed=0, epochs=4, learning_rate=0.5)
    batch = [_sample(0, [], 7, [float(np.log(0.1))], 1.0)] * 4
    trainer.train_step(batch)
    # After the first epoch's update the ratio of the rewarded token grew past 1 + eps, and
    # the objective stopped pushing it: a second call sees a clipped batch.
    assert trainer.train_step(batch)["clip_fraction"] > 0.0


@pytest.mark.parametrize("outside", [VOCAB_SIZE, VOCAB_SIZE + 7, 2**31 - 1])
def test_the_declared_vocabulary_is_what_the_trainer_refuses_beyond(outside: int) -> None:
    """``vocab_size`` is the contract a generation backend checks replies against: a
    generated id at or past it is refused by the trainer (so it must never be staged)."""
    trainer: Trainer = NumpyGRPOTrainer(seed=0)
    assert trainer.vocab_size == VOCAB_SIZE
    good = _sample(3, [THOUGHT_BASE], 4, [-1.0, -1.0], 1.0)
    bad_ids = good.token_ids.copy()
    bad_ids[3] = outside  # the generated thought
    bad = TrainSample(
        token_ids=bad_ids, token_mask=good.token_mask, logprobs=good.logprobs, advantage=1.0
    )
    with pytest.raises(ValueError, match=f"generated token {outside} at position 3"):
        trainer.train_step([bad])
    assert trainer.weight_version == 0  # refused whole
