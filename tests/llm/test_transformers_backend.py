"""The in-process transformers backend: staged calls, rewards, weight versions, a free loop."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llm_support import TARGET, fixed_batch

from rollout_recovery.capture import (
    CaptureWriter,
    LinearizedRollout,
    StagedPrefix,
)
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.errors import InvalidArgumentError
from rollout_recovery.llm import _backend as backend_module
from rollout_recovery.llm._backend import TransformersBackend
from rollout_recovery.llm._emit_task import EmitTokenEpisodes, EmitTokenTask
from rollout_recovery.llm._generate import generate, seed_for
from rollout_recovery.llm._trainer import TorchGRPOTrainer
from rollout_recovery.llm._weights import TorchWeights
from rollout_recovery.rollout import (
    AttemptFailure,
    AttemptRequest,
    FailureReason,
    GenerationBackend,
)

SEED = 4


@pytest.fixture(scope="module")
def trainer(tiny_model_dir: Path) -> TorchGRPOTrainer:
    return TorchGRPOTrainer(tiny_model_dir, seed=0, learning_rate=1e-2)


def _backend(trainer: TorchGRPOTrainer, **kwargs: Any) -> TransformersBackend:
    task = EmitTokenTask(64, seed=1, vocab_size=trainer.vocab_size, target_token=TARGET)
    options: dict[str, Any] = {"seed": SEED, "max_tokens": 6}
    options.update(kwargs)
    episodes = EmitTokenEpisodes(task, max_tokens=options["max_tokens"])
    return TransformersBackend(
        skeleton=trainer.skeleton, episodes=episodes, initial_weights=trainer.weights(), **options
    )


def _request(backend: TransformersBackend, idx: int, rollout_id: str) -> AttemptRequest:
    episodes = backend._episodes
    assert isinstance(episodes, EmitTokenEpisodes)
    prompt = episodes._task[idx]
    return AttemptRequest(
        group_id=f"g{idx}",
        generation_index=0,
        rollout_id=rollout_id,
        prompt=prompt,
        weight_version=0,
    )


def test_an_attempt_stages_one_verified_call(trainer: TorchGRPOTrainer) -> None:
    backend: GenerationBackend = _backend(trainer)
    assert isinstance(backend, TransformersBackend)
    store = MemoryDataPlane()
    writer = CaptureWriter(store)
    request = _request(backend, 3, "g3_g0_a1")
    result = asyncio.run(backend.run_attempt(request, writer))
    linearized = fetch_and_verify(result.receipt, store, partition=writer.partition)
    assert isinstance(linearized, LinearizedRollout), linearized
    prompt = request.prompt["prompt_token_ids"]
    generated = linearized.token_ids[len(prompt) :]
    assert linearized.token_ids[: len(prompt)].tolist() == prompt
    assert linearized.token_mask.tolist() == [0.0] * len(prompt) + [1.0] * 6
    assert result.generated_tokens == 6 and linearized.max_weight_version == 0
    assert result.reward == pytest.approx(float(np.mean(generated == TARGET)))
    # Exactly what the core function samples for this rollout id: the backend is a wrapper.
    model = trainer.skeleton.build(trainer.weights())
    expected = generate(model, prompt, max_tokens=6, temperature=1.0, seed=seed_for(SEED, "g3/0"))
    assert generated.tolist() == expected.token_ids.tolist()
    np.testing.assert_array_equal(linearized.logprobs[len(prompt) :], expected.logprobs)


def test_new_weights_reach_new_calls_and_stamp_their_version(tiny_model_dir: Path) -> None:
    trainer = TorchGRPOTrainer(tiny_model_dir, seed=0, learning_rate=0.5)
    backend = _backend(trainer)
    stores = [MemoryDataPlane(), MemoryDataPlane()]  # one per attempt: same rollout id
    before = asyncio.run(backend.run_attempt(_request(backend, 0, "r0"), CaptureWriter(stores[0])))
    trainer.train_step(fixed_batch())
    backend.update_weights(1, trainer.weights())
    assert backend.weight_version == 1
    after = asyncio.run(backend.run_attempt(_request(backend, 0, "r0"), CaptureWriter(stores[1])))
    rows = {
        version: fetch_and_verify(result.receipt, stores[version])
        for version, result in ((0, before), (1, after))
    }
    assert rows[0].max_weight_version == 0 and rows[1].max_weight_version == 1  # type: ignore[union-attr]
    # Same rollout id, same draws: only the weights differ, so the logprobs do.
    assert not np.array_equal(rows[0].logprobs, rows[1].logprobs)  # type: ignore[union-attr]


def test_a_call_in_flight_keeps_the_weights_it_started_with(
    trainer: TorchGRPOTrainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _backend(trainer)
    started, release = threading.Event(), threading.Event()
    seen: list[object] = []

    def slow_generate(model: object, *args: Any, **kwargs: Any) -> Any:
        seen.append(model)
        started.set()
        release.wait(timeout=60)
        return generate(model, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(backend_module, "generate", slow_generate)
    old_model = backend._current.model
    store = MemoryDataPlane()

    async def scenario() -> Any:
        attempt = asyncio.create_task(
            backend.run_attempt(_request(backend, 1, "r1"), CaptureWriter(store))
        )
        await asyncio.to_thread(started.wait, 60)
        backend.update_weights(5, TorchWeights(5, dict(trainer.weights().tensors)))
        release.set()
        return await attempt

    result = asyncio.run(scenario())
    assert seen == [old_model]
    row = fetch_and_verify(result.receipt, store)
    assert row.max_weight_version == 0  # type: ignore[union-attr]
    assert backend.weight_version == 5


def test_the_event_loop_stays_free_during_a_forward_pass(
    trainer: TorchGRPOTrainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generation blocks until the loop itself sets a flag: run on the loop, it would
    deadlock (bounded here by a timeout that fails the test)."""
    backend = _backend(trainer)
    flag = threading.Event()

    def blocking_generate(*args: Any, **kwargs: Any) -> Any:
        if not flag.wait(timeout=30):
            raise AssertionError("the event loop was blocked by generation")
        return generate(*args, **kwargs)

    monkeypatch.setattr(backend_module, "generate", blocking_generate)

    async def scenario() -> Any:
        attempt = asyncio.create_task(
            backend.run_attempt(_request(backend, 2, "r2"), CaptureWriter(MemoryDataPlane()))
        )
        await asyncio.sleep(0)  # let the attempt reach its worker thread
        flag.set()  # only runs if the loop is free
        return await asyncio.wait_for(attempt, timeout=60)

    assert asyncio.run(scenario()).generated_tokens == 6


def test_wrong_weights_are_refused_and_change_nothing(trainer: TorchGRPOTrainer) -> None:
    backend = _backend(trainer)
    current = backend._current
    with pytest.raises(InvalidArgumentError, match="announced as"):
        backend.update_weights(2, trainer.weights())
    partial = dict(trainer.weights().tensors)
    partial.pop("model.norm.weight")
    with pytest.raises(InvalidArgumentError, match="do not fit"):
        backend.update_weights(1, TorchWeights(1, partial))
    assert backend._current is current and backend.weight_version == 0


def test_a_prompt_that_is_not_the_datasets_is_refused(trainer: TorchGRPOTrainer) -> None:
    backend = _backend(trainer)
    request = _request(backend, 2, "r")
    bad = AttemptRequest(
        group_id="g",
        generation_index=0,
        rollout_id="r",
        prompt={**request.prompt, "prompt_token_ids": [0, 1, 2]},
        weight_version=0,
    )
    with pytest.raises(InvalidArgumentError, match="do not match task 2"):
        asyncio.run(bad_attempt(backend, bad))


async def bad_attempt(backend: TransformersBackend, request: AttemptRequest) -> Any:
    return await backend.run_attempt(request, CaptureWriter(MemoryDataPlane()))


def test_a_closed_backend_fails_attempts_as_values_the_controller_retries(
    trainer: TorchGRPOTrainer,
) -> None:
    backend = _backend(trainer)
    asyncio.run(backend.aclose())
    failure = asyncio.run(bad_attempt(backend, _request(backend, 0, "r")))
    assert isinstance(failure, AttemptFailure)
    assert failure.reason is FailureReason.BACKEND_CLOSED


def test_draws_depend_on_the_sibling_not_the_attempt(trainer: TorchGRPOTrainer) -> None:
    """A retry (new rollout id) on the same weights redraws the same tokens; another
    sibling of the group draws others."""
    backend = _backend(trainer)
    store = MemoryDataPlane()
    writer = CaptureWriter(store)

    def tokens(rollout_id: str, index: int) -> list[int]:
        request = dataclasses.replace(_request(backend, 7, rollout_id), generation_index=index)
        result = asyncio.run(backend.run_attempt(request, writer))
        row = fetch_and_verify(result.receipt, store)
        assert isinstance(row, LinearizedRollout)
        return row.token_ids.tolist()

    first = tokens("g7_g0_a1", 0)
    assert tokens("g7_g0_a2", 0) == first
    assert tokens("g7_g1_a1", 1) != first


def test_a_staged_call_of_a_lost_attempt_is_continued_not_generated_again(
    trainer: TorchGRPOTrainer,
) -> None:
    """``run_attempt``'s ``prefix``: the call was staged, the attempt lost before its receipt; the
    next attempt of the sibling inherits it and generates nothing."""
    backend = _backend(trainer)
    store = MemoryDataPlane()
    writer = CaptureWriter(store)
    lost = asyncio.run(backend.run_attempt(_request(backend, 5, "g5_g0_a1"), writer))
    keys = [k for k in store.keys(writer.partition) if k.startswith("g5_g0_a1/")]
    prefix = StagedPrefix.read(store, "g5_g0_a1", keys)
    assert isinstance(prefix, StagedPrefix)
    calls = backend._calls
    result = asyncio.run(backend.run_attempt(_request(backend, 5, "g5_g0_a2"), writer, prefix))
    assert backend._calls == calls  # nothing generated again
    assert result.inherited_calls == 1 and result.reward == lost.reward
    assert isinstance(fetch_and_verify(result.receipt, store), LinearizedRollout)
