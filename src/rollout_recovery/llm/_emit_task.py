""" "Emit token X": a task a random tiny Llama learns from rewards alone in tens of steps.

A prompt is ``[bos]`` followed by a few random tokens; the model generates a fixed number
of tokens and the reward is the share of them equal to ``target_token``. It needs no
language ability, only the policy gradient moving probability mass onto one token, which
is why a model with random weights learns it (measured with vLLM generating: reward 0.025
to 1.0 in about 40 steps; ``reference/vllm-weight-sync.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .._datasets import item_rng
from ..errors import InvalidArgumentError
from ..rewards import RewardChecks
from ..rollout import Completion, Sampling, Turn

__all__ = ["EMIT_TOKEN_TASK", "EmitTokenEpisodes", "EmitTokenTask"]

EMIT_TOKEN_TASK = "emit_token"


class EmitTokenTask:
    """A deterministic map-style dataset of ``size`` prompts, and the task's reward.

    ``dataset[idx]`` is a fresh payload dict, equal for equal ``(seed, idx)``: the
    controller rebuilds prompts from the dataset after a restart and the ledger checks them
    by ``idx`` and ``task_name``. Prompt tokens are drawn from ``[first_token, vocab_size)``
    (the tiny Llama's ids below 5 are special tokens), ``prompt_length`` of them after BOS.
    """

    def __init__(
        self,
        size: int,
        *,
        seed: int,
        vocab_size: int,
        target_token: int,
        prompt_length: tuple[int, int] = (3, 8),
        bos_token_id: int = 0,
        first_token: int = 5,
    ) -> None:
        for name, value, minimum in (
            ("size", size, 1),
            ("seed", seed, 0),
            ("vocab_size", vocab_size, 2),
            ("bos_token_id", bos_token_id, 0),
            ("first_token", first_token, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")
        if not 0 <= target_token < vocab_size:
            raise InvalidArgumentError(
                f"target_token must be in [0, {vocab_size}), got {target_token!r}"
            )
        if not (bos_token_id < vocab_size and first_token < vocab_size):
            raise InvalidArgumentError("bos_token_id and first_token must be below vocab_size")
        low, high = prompt_length
        if not 1 <= low <= high:
            raise InvalidArgumentError(f"prompt_length must be 1 <= low <= high, got {low, high}")
        self._size = size
        self._seed = seed
        self._vocab = vocab_size
        self._target = target_token
        self._length = (low, high)
        self._bos = bos_token_id
        self._first = first_token

    @property
    def target_token(self) -> int:
        return self._target

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return (
            f"EmitTokenTask(size={self._size}, seed={self._seed}, vocab_size={self._vocab}, "
            f"target_token={self._target})"
        )

    def __getitem__(self, idx: int) -> dict[str, Any]:
        idx, rng = item_rng(idx, size=self._size, seed=self._seed)
        length = int(rng.integers(self._length[0], self._length[1] + 1))
        body = rng.integers(self._first, self._vocab, size=length)
        return {
            "idx": idx,
            "task_name": EMIT_TOKEN_TASK,
            "task_source": EMIT_TOKEN_TASK,
            "prompt_token_ids": [self._bos, *(int(t) for t in body)],
            "target_token": self._target,
        }

    def prompt_ids(self, prompt: Mapping[str, Any]) -> list[int]:
        """The prompt's tokens, checked against the dataset (a mismatch is a controller
        bug, not a generation failure)."""
        idx = prompt.get("idx")
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise InvalidArgumentError(f"prompt idx must be an int, got {idx!r}")
        expected: list[int] = self[idx]["prompt_token_ids"]
        given = [int(t) for t in prompt.get("prompt_token_ids", ())]
        if given != expected:
            raise InvalidArgumentError(f"prompt tokens do not match task {idx} of the dataset")
        return expected

    def reward(self, generated: Sequence[int] | npt.NDArray[np.integer[Any]]) -> float:
        """The share of generated tokens equal to the target (0.0 for none generated)."""
        tokens = np.asarray(generated)
        if tokens.size == 0:
            return 0.0
        return float(np.mean(tokens == self._target))


class EmitTokenEpisodes:
    """The task's episodes (a ``rollout.EpisodeTask``): one call of ``max_tokens`` tokens
    after the prompt, rewarded by :meth:`EmitTokenTask.reward`."""

    def __init__(self, task: EmitTokenTask, *, max_tokens: int) -> None:
        self._task = task
        self._sampling = Sampling(max_tokens=max_tokens)

    def episode(self, prompt: Mapping[str, Any]) -> _EmitEpisode:
        return _EmitEpisode(self._task, self._task.prompt_ids(prompt), self._sampling)


class _EmitEpisode:
    __slots__ = ("_generated", "_prompt", "_sampling", "_task")

    def __init__(self, task: EmitTokenTask, prompt: list[int], sampling: Sampling) -> None:
        self._task = task
        self._prompt = prompt
        self._sampling = sampling
        self._generated: list[int] | None = None

    def next_turn(self) -> Turn | None:
        if self._generated is not None:
            return None
        return Turn(kind="gen", prompt_ids=self._prompt, sampling=self._sampling)

    def observe(self, completion: Completion) -> None:
        self._generated = [int(t) for t in completion.token_ids]

    def grade(self) -> tuple[float, RewardChecks | None]:
        return self._task.reward(self._generated or []), None
