"""The trainer against broken data: bounded log-ratios, skipped non-finite updates, and
the stop after too many skips in a row (issue 15, item 14)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_recovery.errors import RolloutRecoveryError, TrainingDivergedError
from rollout_recovery.policy import NumpyGRPOTrainer, PolicySnapshot, TrainSample
from rollout_recovery.policy._numpy_policy import PARAM_SHAPES
from rollout_recovery.policy._tasks import (
    ANSWER,
    BOS,
    DIGIT_BASE,
    EOS,
    NUM_THOUGHT,
    THINK,
    THOUGHT_BASE,
)
from rollout_recovery.policy._trainer import MAX_LOG_RATIO

# What vLLM reports as the logprob of a token it considers impossible.
VLLM_IMPOSSIBLE = -9999.0


def _row(digit: int, thoughts: list[int], answer: int) -> tuple[list[int], list[float]]:
    ids = [BOS, DIGIT_BASE + digit, THINK, *[THOUGHT_BASE + t for t in thoughts], ANSWER]
    ids += [DIGIT_BASE + answer, EOS]
    mask = [0.0, 0.0, 0.0, *[1.0] * len(thoughts), 0.0, 1.0, 1.0]
    return ids, mask


def _sample(
    digit: int,
    thoughts: list[int],
    answer: int,
    advantage: float,
    *,
    snapshot: PolicySnapshot | None = None,
    override: dict[int, float] | None = None,
) -> TrainSample:
    """A row with on-policy logprobs under ``snapshot`` (0.0 without one); ``override``
    replaces the captured logprob of the n-th generated token (EOS excluded)."""
    ids, mask = _row(digit, thoughts, answer)
    logprobs = np.zeros(len(ids)) if snapshot is None else snapshot.token_logprobs(ids, mask)
    generated = [i for i, m in enumerate(mask) if m == 1.0 and ids[i] != EOS]
    for n, value in (override or {}).items():
        logprobs[generated[n]] = value
    return TrainSample(
        token_ids=np.array(ids, np.int32),
        token_mask=np.array(mask, np.float32),
        logprobs=np.asarray(logprobs, dtype=np.float32),
        advantage=advantage,
    )


def _batch(
    trainer: NumpyGRPOTrainer, override: dict[int, float] | None = None
) -> list[TrainSample]:
    """Four on-policy rows with mixed advantages; ``override`` applies to the first row."""
    snapshot = trainer.weights()
    return [
        _sample(0, [1, 2], 3, -1.0, snapshot=snapshot, override=override),
        _sample(1, [0], 4, 1.5, snapshot=snapshot),
        _sample(2, [3, 3, 5], 6, -0.5, snapshot=snapshot),
        _sample(3, [], 9, 0.0, snapshot=snapshot),
    ]


def _all_finite(trainer: NumpyGRPOTrainer) -> bool:
    return all(np.isfinite(value).all() for value in trainer.state().values())


def _assert_unchanged_but_version(
    before: dict[str, npt.NDArray[Any]], after: dict[str, npt.NDArray[Any]], skipped: int
) -> None:
    assert set(before) == set(after)
    for key, value in before.items():
        if key == "version":
            assert int(after[key]) == int(value) + 1
        elif key == "skipped_in_a_row":
            assert int(after[key]) == skipped
        else:
            # Bit-identical, not merely close: a skipped step must not touch anything.
            assert after[key].tobytes() == value.tobytes(), key


# -- the bounded log-ratio ------------------------------------------------------------------


@pytest.mark.parametrize("captured", [VLLM_IMPOSSIBLE, -1e30, -np.inf])
def test_an_impossible_token_logprob_trains_without_nan(captured: float) -> None:
    trainer = NumpyGRPOTrainer(seed=3, init_std=0.5)
    for step in range(4):
        # The impossible token sits in a row with a negative advantage (the unclipped term
        # wins: exp(9999) * A was -inf) beside rows with positive and zero advantages (inf *
        # 0 was NaN).
        metrics = trainer.train_step(_batch(trainer, override={0: captured}))
        assert np.isfinite(metrics["loss"]), (step, metrics)
        assert metrics["skipped"] == 0.0 and metrics["clamped_tokens"] == 1.0
        assert metrics["max_ratio"] == pytest.approx(np.exp(MAX_LOG_RATIO))
        assert _all_finite(trainer)
    assert trainer.weight_version == 4


def test_a_clamped_token_gets_no_gradient_and_the_rest_train_as_without_it() -> None:
    trainer = NumpyGRPOTrainer(seed=3, init_std=0.5)
    # Only generated token with parameters: the answer, captured at -9999, advantage < 0.
    alone = _sample(4, [], 7, -1.0, override={0: VLLM_IMPOSSIBLE})
    loss, grads = trainer.loss_and_grad([alone])
    assert np.isfinite(loss)
    assert all(not grad.any() for grad in grads.values())
    # Beside other rows it changes their gradient only through the mean's denominator.
    snapshot = trainer.weights()
    others = [_sample(1, [0], 4, 1.5, snapshot=snapshot), _sample(2, [3], 6, -0.5)]
    _, with_it = trainer.loss_and_grad([*others, alone])
    _, without = trainer.loss_and_grad(others)
    tokens_without = sum(float(sample.token_mask.sum()) for sample in others)
    tokens_with = tokens_without + float(alone.token_mask.sum())
    for name in PARAM_SHAPES:
        np.testing.assert_allclose(
            with_it[name] * tokens_with, without[name] * tokens_without, atol=1e-12
        )


def test_a_batch_inside_the_bound_is_not_changed_by_it() -> None:
    # A captured logprob 19 nats below the current one, advantage < 0: the unclipped term
    # wins with a ratio near exp(17), and that token keeps its full gradient (the
    # derivative of the plain clipped objective, checked by finite differences).
    trainer = NumpyGRPOTrainer(seed=3, init_std=0.5)
    snapshot = trainer.weights()
    batch = [
        _sample(0, [1], 3, -1.0, snapshot=snapshot, override={0: -19.0, 1: -2.0}),
        _sample(1, [2], 4, 1.0, snapshot=snapshot, override={0: 0.0}),
    ]
    _, grads = trainer.loss_and_grad(batch)
    assert trainer.train_step(batch)["clamped_tokens"] == 0.0
    assert abs(grads["thought_logits"][0, 1]) > 1e6
    state = NumpyGRPOTrainer(seed=3, init_std=0.5).state()
    h = 1e-6
    shifted = []
    for sign in (1.0, -1.0):
        probe = NumpyGRPOTrainer(seed=0)
        moved = {key: value.copy() for key, value in state.items()}
        moved["param.thought_logits"][0, 1] += sign * h
        probe.load_state(moved)
        shifted.append(probe.loss_and_grad(batch)[0])
    numeric = (shifted[0] - shifted[1]) / (2 * h)
    assert grads["thought_logits"][0, 1] == pytest.approx(numeric, rel=1e-6)


# -- non-finite updates are skipped ---------------------------------------------------------


def _nan_logprob(trainer: NumpyGRPOTrainer) -> list[TrainSample]:
    return _batch(trainer, override={1: float("nan")})


def _overflowing_loss(trainer: NumpyGRPOTrainer) -> list[TrainSample]:
    # Every term finite (ratio ~1, A = 1e308), but their sum is not.
    snapshot = trainer.weights()
    return [_sample(d, [1, 2], d, 1e308, snapshot=snapshot) for d in range(3)]


def _overflowing_adam(trainer: NumpyGRPOTrainer) -> list[TrainSample]:
    # Loss and gradient finite (~1e200), but the second moment (g * g) is not.
    snapshot = trainer.weights()
    return [_sample(d, [1, 2], d, 1e200 * (1 - 2 * (d % 2)), snapshot=snapshot) for d in range(3)]


INJECTIONS: dict[str, Callable[[NumpyGRPOTrainer], list[TrainSample]]] = {
    "nan_logprob": _nan_logprob,
    "overflowing_loss": _overflowing_loss,
    "overflowing_adam": _overflowing_adam,
}


@pytest.mark.parametrize("name", sorted(INJECTIONS))
def test_a_nonfinite_update_is_skipped_and_changes_nothing_but_the_version(name: str) -> None:
    trainer = NumpyGRPOTrainer(seed=3, init_std=0.5)
    trainer.train_step(_batch(trainer))  # non-zero Adam moments, so "untouched" means it
    bad = INJECTIONS[name](trainer)
    before = trainer.state()
    old = trainer.weights()
    metrics = trainer.train_step(bad)
    _assert_unchanged_but_version(before, trainer.state(), skipped=1)
    assert metrics["skipped"] == 1.0 and metrics["skipped_in_a_row"] == 1.0
    assert metrics["nonfinite_tokens"] == (1.0 if name == "nan_logprob" else 0.0)
    assert trainer.weight_version == 2 and trainer.weights().version == 2
    for table in PARAM_SHAPES:
        np.testing.assert_array_equal(trainer.weights().params[table], old.params[table])
    # The next good step trains and resets the count.
    metrics = trainer.train_step(_batch(trainer))
    assert metrics["skipped"] == 0.0 and metrics["skipped_in_a_row"] == 0.0
    assert not np.array_equal(trainer.state()["adam_step"], before["adam_step"])


def test_a_nonfinite_gradient_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = NumpyGRPOTrainer(seed=3, init_std=0.5)
    objective = NumpyGRPOTrainer._objective

    def poisoned(self: NumpyGRPOTrainer, *args: Any) -> Any:
        loss, grads, diagnostics = objective(self, *args)
        grads["answer_logits"][2, 5] = np.inf
        return loss, grads, diagnostics

    monkeypatch.setattr(NumpyGRPOTrainer, "_objective", poisoned)
    before = trainer.state()
    metrics = trainer.train_step(_batch(trainer))
    _assert_unchanged_but_version(before, trainer.state(), skipped=1)
    assert metrics["skipped"] == 1.0 and np.isfinite(metrics["loss"])


def test_a_later_epoch_going_nonfinite_skips_the_whole_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainer = NumpyGRPOTrainer(seed=3, init_std=0.5, epochs=3)
    objective = NumpyGRPOTrainer._objective
    calls = []

    def poisoned_late(self: NumpyGRPOTrainer, *args: Any) -> Any:
        calls.append(1)
        loss, grads, diagnostics = objective(self, *args)
        return (float("nan") if len(calls) == 3 else loss), grads, diagnostics

    monkeypatch.setattr(NumpyGRPOTrainer, "_objective", poisoned_late)
    before = trainer.state()
    metrics = trainer.train_step(_batch(trainer))
    assert len(calls) == 3
    _assert_unchanged_but_version(before, trainer.state(), skipped=1)
    assert metrics["skipped"] == 1.0


# -- too many skips in a row ----------------------------------------------------------------


def test_k_skips_in_a_row_raise_training_diverged() -> None:
    trainer = NumpyGRPOTrainer(seed=3, init_std=0.5, diverged_after=3)
    assert trainer.train_step(_nan_logprob(trainer))["skipped_in_a_row"] == 1.0
    assert trainer.train_step(_nan_logprob(trainer))["skipped_in_a_row"] == 2.0
    before = trainer.state()
    with pytest.raises(TrainingDivergedError) as raised:
        trainer.train_step(_nan_logprob(trainer))
    error = raised.value
    assert isinstance(error, RolloutRecoveryError) and isinstance(error, RuntimeError)
    assert error.fatal is True
    assert (error.skipped_in_a_row, error.weight_version) == (3, 2)
    message = str(error)
    assert "3 train steps in a row" in message and "not finite" in message
    assert "1 token(s) had a non-finite objective" in message
    assert "policy.learning_rate" in message  # says what the user can do
    # The step that raised changed nothing (not even the version).
    for key, value in before.items():
        np.testing.assert_array_equal(trainer.state()[key], value, err_msg=key)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is TrainingDivergedError and str(copy) == message
    assert copy.__dict__ == error.__dict__


def test_only_skips_in_a_row_count() -> None:
    trainer = NumpyGRPOTrainer(seed=3, init_std=0.5, diverged_after=3)
    counts = []
    for batch in ("bad", "bad", "good", "bad", "empty", "bad"):
        if batch == "empty":
            samples = []  # no update at all: leaves the count as it is
        else:
            samples = _nan_logprob(trainer) if batch == "bad" else _batch(trainer)
        counts.append(trainer.train_step(samples)["skipped_in_a_row"])
    assert counts == [1.0, 2.0, 0.0, 1.0, 1.0, 2.0]
    with pytest.raises(TrainingDivergedError):
        trainer.train_step(_nan_logprob(trainer))


def test_diverged_after_one_raises_at_the_first_nonfinite_step() -> None:
    trainer = NumpyGRPOTrainer(seed=3, diverged_after=1)
    with pytest.raises(TrainingDivergedError, match="1 train steps in a row"):
        trainer.train_step(_overflowing_loss(trainer))
    assert trainer.weight_version == 0


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "3"])
def test_diverged_after_must_be_a_positive_int(value: Any) -> None:
    with pytest.raises(ValueError, match="diverged_after"):
        NumpyGRPOTrainer(seed=0, diverged_after=value)


def test_a_resume_keeps_counting_skips_in_a_row(tmp_path: Path) -> None:
    trainer = NumpyGRPOTrainer(seed=3, init_std=0.5, diverged_after=3)
    trainer.train_step(_batch(trainer))
    trainer.train_step(_nan_logprob(trainer))
    trainer.train_step(_nan_logprob(trainer))
    path = tmp_path / "trainer.npz"
    arrays: dict[str, Any] = trainer.state()
    np.savez(path, **arrays)
    with np.load(path, allow_pickle=False) as stored:
        loaded = {key: stored[key] for key in stored.files}
    assert int(loaded["skipped_in_a_row"]) == 2
    resumed = NumpyGRPOTrainer(seed=99, diverged_after=3)
    resumed.load_state(loaded)
    with pytest.raises(TrainingDivergedError) as raised:
        resumed.train_step(_nan_logprob(resumed))
    assert raised.value.skipped_in_a_row == 3


def test_a_state_from_before_skips_were_counted_loads_with_none() -> None:
    trainer = NumpyGRPOTrainer(seed=3, init_std=0.5)
    trainer.train_step(_nan_logprob(trainer))
    state = trainer.state()
    del state["skipped_in_a_row"]
    resumed = NumpyGRPOTrainer(seed=3)
    resumed.load_state(state)
    assert int(resumed.state()["skipped_in_a_row"]) == 0
    assert resumed.weight_version == 1


# -- properties -----------------------------------------------------------------------------

# Captured logprobs from the sane to the absurd: vLLM's -9999, float32's extremes, +-inf.
EXTREME = st.sampled_from([VLLM_IMPOSSIBLE, -1e4, -1e30, -3.4e38, 3.4e38, -np.inf, np.inf])
FINITE_OR_INFINITE = st.one_of(
    EXTREME, st.floats(width=32, allow_nan=False, allow_infinity=True), st.floats(-30.0, 5.0)
)
ANY_LOGPROB = st.one_of(FINITE_OR_INFINITE, st.just(float("nan")))


@st.composite
def _batches(
    draw: st.DrawFn, logprobs: st.SearchStrategy[float], advantages: st.SearchStrategy[float]
) -> list[TrainSample]:
    samples = []
    for _ in range(draw(st.integers(1, 4))):
        digit = draw(st.integers(0, 9))
        thoughts = draw(st.lists(st.integers(0, NUM_THOUGHT - 1), max_size=4))
        answer = draw(st.integers(0, 9))
        override = {n: draw(logprobs) for n in range(len(thoughts) + 1)}
        samples.append(_sample(digit, thoughts, answer, draw(advantages), override=override))
    return samples


@settings(max_examples=150)
@given(
    batch=_batches(FINITE_OR_INFINITE, st.floats(-10.0, 10.0)),
    epochs=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_any_finite_or_infinite_logprob_trains_to_finite_params(
    batch: list[TrainSample], epochs: int, seed: int
) -> None:
    # Decided: +-inf and finite extremes are clamped, never refused and never skipped.
    trainer = NumpyGRPOTrainer(seed=seed, init_std=1.0, epochs=epochs)
    metrics = trainer.train_step(batch)
    assert np.isfinite(metrics["loss"]) and np.isfinite(metrics["grad_norm"])
    assert _all_finite(trainer)
    assert metrics["skipped"] == 0.0
    NumpyGRPOTrainer(seed=0).load_state(trainer.state())  # a checkpoint of it loads


@settings(max_examples=150)
@given(
    batch=_batches(ANY_LOGPROB, st.floats(allow_nan=False, allow_infinity=False)),
    seed=st.integers(0, 2**16),
)
def test_whatever_the_logprobs_and_advantages_params_stay_finite(
    batch: list[TrainSample], seed: int
) -> None:
    # NaN logprobs and advantages up to 1e308: a step trains or is skipped whole.
    trainer = NumpyGRPOTrainer(seed=seed, init_std=1.0)
    before = trainer.state()
    metrics = trainer.train_step(batch)
    assert _all_finite(trainer)
    NumpyGRPOTrainer(seed=0).load_state(trainer.state())
    if metrics["skipped"]:
        _assert_unchanged_but_version(before, trainer.state(), skipped=1)
    else:
        assert np.isfinite(metrics["loss"])
        assert trainer.weight_version == 1
