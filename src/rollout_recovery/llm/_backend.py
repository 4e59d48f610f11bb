"""Generation in process with transformers: the same model the torch trainer trains.

:class:`TransformersBackend` implements :class:`~rollout_recovery.rollout.GenerationBackend`
for the episodes it is given (``EmitTokenEpisodes``, ``DatasetEpisodes``): each model call
(the prompt, up to ``max_tokens`` sampled tokens, ended early by a stop token) staged
through the attempt's ``CaptureWriter`` before the episode goes on, the attempt rewarded
by the task. The episode is the one every backend runs
(:func:`~rollout_recovery.rollout.run_episode`); this module is its model client, so an
attempt can also continue an earlier attempt's staged call (``run_attempt``'s ``prefix``). The model
runs in a worker thread
(``asyncio.to_thread``), so the event loop keeps serving other attempts, deadlines and
checkpoints while a forward pass runs.

Weights: each :meth:`update_weights` builds a model around the new snapshot's tensors (no
copy) and makes it current; a call samples from the model that was current when it
started and stamps that version, so a call in flight is never switched to other weights
half way (the trap a vLLM server needs a pause for).

The model call itself is :func:`generate` (prompt ids, max tokens, temperature, seed ->
token ids and logprobs); this class is the thin client around it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from transformers import PreTrainedModel

from .._lifecycle import AsyncResource
from ..capture import CaptureWriter, StagedPrefix
from ..errors import InvalidArgumentError
from ..rollout import AttemptFailure, AttemptRequest, AttemptResult, Sampling, run_episode
from ..rollout import Completion as CallCompletion
from ._episodes import Episodes
from ._generate import Completion, generate, seed_for
from ._skeleton import ModelSkeleton
from ._weights import TorchWeights

__all__ = ["TransformersBackend"]


class _Current:
    """The model new calls sample from, with its version (replaced whole, never mutated)."""

    __slots__ = ("model", "version")

    def __init__(self, version: int, model: PreTrainedModel) -> None:
        self.version = version
        self.model = model


class TransformersBackend(AsyncResource):
    """The task's ``episodes`` on an in-process transformers model.

    ``skeleton`` is the model's config and buffers (``trainer.skeleton``, or
    :meth:`ModelSkeleton.from_dir`); ``initial_weights`` the trainer's current snapshot;
    ``stop_token_ids`` end a call early (the model's end-of-sequence tokens for the
    dataset task; none for "emit token X", whose calls are all ``max_tokens`` long).
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
        episodes: Episodes,
        initial_weights: TorchWeights,
        seed: int,
        max_tokens: int = 8,
        temperature: float = 1.0,
        stop_token_ids: frozenset[int] = frozenset(),
        stage_in_thread: bool = True,
    ) -> None:
        self._skeleton = skeleton
        self._episodes = episodes
        self._stop = frozenset(int(t) for t in stop_token_ids)
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

    def update_weights(self, version: int, weights: TorchWeights) -> None:
        """Every call that starts after this samples from ``weights``; calls in flight keep
        the model they started with."""
        checked = self._skeleton.check(weights)
        if checked.version != version:
            raise InvalidArgumentError(
                f"weights are version {checked.version}, announced as {version}"
            )
        self._current = _Current(version, self._skeleton.build(checked))

    def sample(
        self, prompt_ids: Sequence[int], seed: int, *, max_tokens: int | None = None
    ) -> tuple[int, Completion]:
        """One model call on the current weights: (version, completion). Blocking."""
        current = self._current
        completion = generate(
            current.model,
            prompt_ids,
            max_tokens=self._max_tokens if max_tokens is None else max_tokens,
            temperature=self._temperature,
            seed=seed,
            stop_token_ids=self._stop,
        )
        return current.version, completion

    async def run_attempt(
        self,
        request: AttemptRequest,
        capture: CaptureWriter,
        prefix: StagedPrefix | None = None,
    ) -> AttemptResult | AttemptFailure:
        """One model call (sample, stage, reward, receipt), or ``prefix``'s staged call
        continued."""
        if self._closed:
            return AttemptFailure.closed(request, "transformers")
        return await run_episode(
            request,
            capture,
            task=self._episodes,
            client=_Client(self, request),
            prefix=prefix,
            stage_in_thread=self._stage_in_thread,
        )

    async def aclose(self) -> None:
        self._closed = True


class _Client:
    """The model client of one attempt. Its draws are seeded by the sibling (group id,
    generation index, call), not by the rollout id (which holds a random attempt uuid)."""

    def __init__(self, backend: TransformersBackend, request: AttemptRequest) -> None:
        self._backend = backend
        self._sibling = f"{request.group_id}/{request.generation_index}"
        self._calls = 0

    async def generate(
        self, prompt_ids: Sequence[int], *, call_id: str, sampling: Sampling
    ) -> CallCompletion:
        backend = self._backend
        key = self._sibling if self._calls == 0 else f"{self._sibling}/{self._calls}"
        self._calls += 1
        seed = seed_for(backend._seed, key)
        version, completion = await asyncio.to_thread(
            lambda: backend.sample(prompt_ids, seed, max_tokens=sampling.max_tokens)
        )
        backend._calls += 1
        backend._generated_tokens += int(completion.token_ids.shape[0])
        return CallCompletion(
            token_ids=completion.token_ids.tolist(),
            logprobs=completion.logprobs.tolist(),
            weight_version=version,
            extras={"temperature": backend._temperature, "max_tokens": sampling.max_tokens},
        )
