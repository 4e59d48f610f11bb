"""Sampling: seeded draws, logprobs of the sampling distribution, the KV cache, refusals."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_support import sample_row

from rollout_recovery.errors import InvalidArgumentError
from rollout_recovery.llm._generate import generate, seed_for
from rollout_recovery.llm._model_files import instantiate, load_causal_lm
from rollout_recovery.llm._trainer import TorchGRPOTrainer

PROMPT = [0, 17, 42, 99, 200]


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> torch.nn.Module:
    return load_causal_lm(tiny_model_dir).train(False)


def _full_recompute(
    model: torch.nn.Module, prompt: list[int], tokens: list[int], temperature: float
) -> list[float]:
    """Logprobs of ``tokens`` from one forward pass over the whole sequence (no cache)."""
    ids = torch.tensor([[*prompt, *tokens]])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
    logps = torch.log_softmax(logits / temperature, dim=-1)
    return [float(logps[len(prompt) - 1 + i, token]) for i, token in enumerate(tokens)]


def test_one_seed_gives_one_completion(model: torch.nn.Module) -> None:
    a = generate(model, PROMPT, max_tokens=12, temperature=1.0, seed=5)
    b = generate(model, PROMPT, max_tokens=12, temperature=1.0, seed=5)
    c = generate(model, PROMPT, max_tokens=12, temperature=1.0, seed=6)
    assert (
        a.token_ids.tolist() == b.token_ids.tolist() and a.logprobs.tolist() == b.logprobs.tolist()
    )
    assert a.token_ids.tolist() != c.token_ids.tolist()
    assert a.token_ids.dtype == np.int32 and a.logprobs.dtype == np.float32
    assert a.finish_reason == "length" and a.token_ids.shape == (12,)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_logprobs_are_the_sampling_distributions_with_the_kv_cache(
    model: torch.nn.Module, temperature: float
) -> None:
    completion = generate(model, PROMPT, max_tokens=20, temperature=temperature, seed=1)
    expected = _full_recompute(model, PROMPT, completion.token_ids.tolist(), temperature)
    np.testing.assert_allclose(completion.logprobs, expected, atol=2e-5)


def test_the_trainer_recomputes_the_samplers_logprobs(tiny_model_dir: Path) -> None:
    """On-policy samples have ratio 1 in the trainer, at a temperature other than 1 too."""
    trainer = TorchGRPOTrainer(tiny_model_dir, seed=0, temperature=0.7)
    model = trainer.skeleton.build(trainer.weights())
    samples = []
    for i in range(4):
        completion = generate(model, PROMPT, max_tokens=8, temperature=0.7, seed=i)
        samples.append(
            sample_row(
                PROMPT, completion.token_ids.tolist(), completion.logprobs.tolist(), 1.0 - i / 2
            )
        )
    metrics = trainer.train_step(samples)
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["max_ratio"] == pytest.approx(1.0, abs=1e-4)


def test_sampling_follows_the_distribution(model: torch.nn.Module) -> None:
    """The first token's empirical frequencies match its probabilities (a sampler that
    ignored the logits, or the temperature, would miss by far more than the bound)."""
    temperature = 0.3  # peaked, so a few hundred draws tell distributions apart
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT])).logits[0, -1].float()
    probs = torch.softmax(logits / temperature, dim=-1).numpy()
    draws = 400
    counts = np.bincount(
        [
            int(generate(model, PROMPT, max_tokens=1, temperature=temperature, seed=s).token_ids[0])
            for s in range(draws)
        ],
        minlength=probs.shape[0],
    )
    top = np.argsort(probs)[-3:]
    for token in top:
        expected = draws * probs[token]
        assert abs(counts[token] - expected) < 5 * np.sqrt(expected * (1 - probs[token])) + 3, (
            token,
            counts[token],
            expected,
        )


def test_a_stop_token_ends_the_completion_and_is_kept(model: torch.nn.Module) -> None:
    full = generate(model, PROMPT, max_tokens=12, temperature=1.0, seed=5)
    stop = int(full.token_ids[3])
    first = full.token_ids.tolist().index(stop)
    stopped = generate(
        model, PROMPT, max_tokens=12, temperature=1.0, seed=5, stop_token_ids=frozenset({stop})
    )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids.tolist() == full.token_ids.tolist()[: first + 1]
    np.testing.assert_array_equal(stopped.logprobs, full.logprobs[: first + 1])


@pytest.mark.parametrize(
    ("prompt", "kwargs", "message"),
    [
        ([], {}, "must not be empty"),
        ([0, 333], {}, "outside the model's vocabulary"),
        ([0, -1], {}, "outside the model's vocabulary"),
        (PROMPT, {"max_tokens": 0}, "max_tokens"),
        (PROMPT, {"temperature": 0.0}, "temperature"),
        (PROMPT, {"temperature": float("nan")}, "temperature"),
        (PROMPT, {"max_tokens": 510}, "positions"),
    ],
)
def test_bad_calls_are_refused(
    model: torch.nn.Module, prompt: list[int], kwargs: dict[str, float], message: str
) -> None:
    options: dict[str, float] = {"max_tokens": 4, "temperature": 1.0}
    options.update(kwargs)
    with pytest.raises(InvalidArgumentError, match=message):
        generate(model, prompt, seed=0, **options)  # type: ignore[arg-type]


def test_a_model_built_around_a_snapshot_shares_its_tensors(tiny_model_dir: Path) -> None:
    trainer = TorchGRPOTrainer(tiny_model_dir, seed=0)
    weights = trainer.weights()
    built = trainer.skeleton.build(weights)
    name = "model.layers.0.mlp.up_proj.weight"
    assert dict(built.named_parameters())[name].data_ptr() == weights.tensors[name].data_ptr()
    assert built.lm_head.weight is built.model.embed_tokens.weight  # tied after the build
    reference = load_causal_lm(tiny_model_dir).train(False)
    a = generate(built, PROMPT, max_tokens=6, temperature=1.0, seed=3)
    b = generate(reference, PROMPT, max_tokens=6, temperature=1.0, seed=3)
    assert a.token_ids.tolist() == b.token_ids.tolist()
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    with pytest.raises(Exception, match="do not fit"):
        instantiate(trainer.skeleton.config, {}, trainer.skeleton.buffers)


def test_one_call_takes_milliseconds(model: torch.nn.Module) -> None:
    """An 8-token completion on the tiny model: measured 6.4 ms of CPU with the KV cache."""
    generate(model, PROMPT, max_tokens=8, temperature=1.0, seed=0)
    started = time.process_time()
    for seed in range(20):
        generate(model, PROMPT, max_tokens=8, temperature=1.0, seed=seed)
    assert (time.process_time() - started) / 20 < 0.05


@settings(max_examples=50)
@given(seed=st.integers(0, 2**31), key=st.text(max_size=40))
def test_seed_for_is_a_63_bit_function_of_seed_and_key(seed: int, key: str) -> None:
    value = seed_for(seed, key)
    assert 0 <= value < 2**63 and value == seed_for(seed, key)
    assert value != seed_for(seed, key + "x")
