"""Generation in process with transformers: the same model the torch trainer trains.

:class:`TransformersBackend` implements :class:`~rollout_recovery.rollout.GenerationBackend`
for one-call episodes of :class:`EmitTokenTask`: one model call per attempt (the prompt,
``max_tokens`` sampled tokens), staged through the attempt's ``CaptureWriter`` before the
attempt returns, rewarded by the task. The model runs in a worker thread
(``asyncio.to_thread``), so the event loop keeps serving other attempts, deadlines and
checkpoints while a forward pass runs.

Weights: each :meth:`update_weights` builds a model around the new snapshot's tensors (no
copy) and makes it current; a call samples from the model that was current when it
started and stamps that version, so a call in flight is never switched to other weights
half way (the trap a vLLM server needs a pause for).

The model call itself is :func:`generate` (prompt ids, max tokens, temperature, seed ->
token ids and logprobs); this class is the thin episode around it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from transformers import PreTrainedModel

from ..capture import CallRecord, CaptureWriter, assemble_receipt
from ..errors import GenerationError, InvalidArgumentError
from ..rollout import AttemptRequest, AttemptResult
from ._emit_task import EmitTokenTask
from ._generate import Completion, generate, seed_for
from ._skeleton import ModelSkeleton

__all__ = ["TransformersBackend"]

T = TypeVar("T")


class _Current:
    """The model new calls sample from, with its version (replaced whole, never mutated)."""

    __slots__ = ("model", "version")

    def __init__(self, version: int, model: PreTrainedModel) -> None:
        self.version = version
        self.model = model


class TransformersBackend:
    """One-call "emit token X" episodes on an in-process transformers model.

    ``skeleton`` is the model's config and buffers (``trainer.skeleton``, or
    :meth:`ModelSkeleton.from_dir`); ``initial_weights`` the trainer's current snapshot.
    ``temperature`` must be the trainer's (its ratio's denominator is this sampler's
    logprob). The draws of an attempt come from a generator seeded by ``(seed, group_id,
    generation_index)``, not by the rollout id (which holds a random attempt uuid): one
    job config gives one run when attempts see the same weights (staleness 0), and a
    sibling retried on the same weights redraws the tokens it lost. ``stage_in_thread``
    stages from a worker thread too (a durable store fsyncs every put).
    """

    def __init__(
        self,
        *,
        skeleton: ModelSkeleton,
        task: EmitTokenTask,
        initial_weights: object,
        seed: int,
        max_tokens: int = 8,
        temperature: float = 1.0,
        stage_in_thread: bool = True,
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InvalidArgumentError(f"seed must be a non-negative int, got {seed!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be a positive int, got {max_tokens!r}")
        if not temperature > 0:
            raise InvalidArgumentError(f"temperature must be > 0, got {temperature!r}")
        self._skeleton = skeleton
        self._task = task
        self._seed = seed
        self._max_tokens = max_tokens
        self._temperature = float(temperature)
        self._stage_in_thread = stage_in_thread
        weights = skeleton.check(initial_weights)
        self._current = _Current(weights.version, skeleton.build(weights))
        self._closed = False
        self._calls = 0
        self._generated_tokens = 0

    @property
    def weight_version(self) -> int:
        """The version new calls sample from."""
        return self._current.version

    def update_weights(self, version: int, weights: object) -> None:
        """Every call that starts after this samples from ``weights``; calls in flight keep
        the model they started with."""
        checked = self._skeleton.check(weights)
        if checked.version != version:
            raise InvalidArgumentError(
                f"weights are version {checked.version}, announced as {version}"
            )
        self._current = _Current(version, self._skeleton.build(checked))

    def sample(self, prompt_ids: list[int], seed: int) -> tuple[int, Completion]:
        """One model call on the current weights: (version, completion). Blocking."""
        current = self._current
        completion = generate(
            current.model,
            prompt_ids,
            max_tokens=self._max_tokens,
            temperature=self._temperature,
            seed=seed,
        )
        return current.version, completion

    async def _in_thread(self, function: Callable[[], T]) -> T:
        return await asyncio.to_thread(function)

    async def run_attempt(self, request: AttemptRequest, capture: CaptureWriter) -> AttemptResult:
        """One model call: sample, stage, reward, receipt."""
        if self._closed:
            raise GenerationError("backend_closed", "the transformers backend is closed")
        prompt_ids = self._task.prompt_ids(request.prompt)
        rollout_id = request.rollout_id
        call_id = _call_id(rollout_id)
        seed = seed_for(self._seed, f"{request.group_id}/{request.generation_index}")
        version, completion = await self._in_thread(lambda: self.sample(prompt_ids, seed))
        call: dict[str, Any] = {
            "rollout_id": rollout_id,
            "model_call_id": call_id,
            "parent": None,
            "prompt_token_ids": np.array(prompt_ids, dtype=np.int32),
            "generated_token_ids": completion.token_ids,
            "generated_logprobs": completion.logprobs,
            "weight_version": version,
            "extras": {"temperature": self._temperature, "max_tokens": self._max_tokens},
        }
        record: CallRecord
        if self._stage_in_thread:
            record = await self._in_thread(lambda: capture.stage_call(**call))
        else:
            record = capture.stage_call(**call)
        self._calls += 1
        self._generated_tokens += int(completion.token_ids.shape[0])
        reward = self._task.reward(completion.token_ids)
        receipt = assemble_receipt(
            rollout_id, [record], terminal_model_call_id=call_id, reward=reward
        )
        return AttemptResult(
            rollout_id=rollout_id,
            receipt=receipt,
            reward=reward,
            mask_sample=False,
            reward_checks=None,
            generated_tokens=int(completion.token_ids.shape[0]),
        )

    async def aclose(self) -> None:
        self._closed = True


def _call_id(rollout_id: str) -> str:
    # Unique per physical call: a retry is a new rollout id, so its call gets a new id too.
    return "gen-" + hashlib.sha256(rollout_id.encode()).hexdigest()[:16]
