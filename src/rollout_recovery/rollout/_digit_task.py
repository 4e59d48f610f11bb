"""The synthetic agent task: think in one or more calls, then answer; graded on the digit.

An episode of :class:`DigitTask` (``thinking_calls`` = T, ``reasoning_tokens`` = R):

- call 1 (``reason``): prompt = the task prompt (it ends in ``THINK``); R thought tokens;
- calls 2..T (``reason``): prompt = everything so far + ``[THINK]``: the thinking goes on
  in another call, R more thought tokens;
- the last call (``answer``): prompt = everything so far + ``[ANSWER]``; generates
  ``[answer digit, EOS]``.

Every prompt extends its parent's tokens exactly (token in, token out: nothing is
re-rendered). The reward is 1.0 when the first answer token is the right digit. A real
model (the vLLM tests run a random tiny Llama) may emit any token: an answer outside the
digit range just scores 0. With T = 1 it is the two-call episode (reasoning, answer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError
from ..policy import TaskConfig, TaskSet
from ..rewards import RewardChecks
from ._episode import Completion, Sampling, Turn

__all__ = ["DigitEpisode", "DigitTask", "TaskPrompt", "grade", "task_prompt"]


@dataclass(frozen=True, slots=True)
class TaskPrompt:
    """A checked task prompt: its tokens, hidden digit, expected answer and messages."""

    token_ids: list[int]
    digit: int
    expected: int
    messages: list[Any]


def task_prompt(task_set: TaskSet, prompt: Mapping[str, Any]) -> TaskPrompt:
    """The prompt, checked against its task: the grader owns the answer key, and a prompt
    that does not match its task is a controller bug, not a generation failure."""
    idx = prompt.get("idx")
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise InvalidArgumentError(f"prompt idx must be an int, got {idx!r}")
    task = task_set[idx]
    token_ids = [int(t) for t in prompt.get("prompt_token_ids", ())]
    if token_ids != task["prompt_token_ids"]:
        raise InvalidArgumentError(f"prompt tokens do not match task {idx} of the task set")
    messages = prompt.get("messages", task["messages"])
    return TaskPrompt(
        token_ids=token_ids,
        digit=int(task["digit"]),
        expected=int(task["answer"]),
        messages=list(messages),
    )


def grade(
    task: TaskPrompt, thoughts: Sequence[int], answer: Sequence[int]
) -> tuple[float, RewardChecks]:
    """The episode's reward and its reward checks (computed on the rendered response)."""
    reward = 1.0 if TaskSet.answer_digit(answer) == task.expected else 0.0
    result = {
        "response": {
            "output": [
                {"type": "reasoning", "summary": [{"text": TaskSet.render(thoughts)}]},
                {
                    "type": "message",
                    "content": [{"type": "output_text", "text": TaskSet.render(answer[:1])}],
                },
            ]
        }
    }
    checks = RewardChecks.from_result(
        result, {"responses_create_params": {"input": task.messages}}, effort=None
    )
    return reward, checks


class DigitEpisode:
    """One attempt of :class:`DigitTask`: the calls it asks for and what they generated."""

    __slots__ = (
        "_answer",
        "_calls",
        "_reasoning_tokens",
        "_task",
        "_thinking_calls",
        "_tokens",
        "thoughts",
    )

    def __init__(self, task: TaskPrompt, *, thinking_calls: int, reasoning_tokens: int) -> None:
        self._task = task
        self._thinking_calls = thinking_calls
        self._reasoning_tokens = reasoning_tokens
        self._calls = 0
        # Everything so far (prompts and generations): the next call's prompt starts so.
        self._tokens = list(task.token_ids)
        self._answer: list[int] | None = None
        self.thoughts: list[int] = []

    def next_turn(self) -> Turn | None:
        if self._answer is not None:
            return None
        if self._calls == 0:
            prompt = list(self._tokens)
        elif self._calls < self._thinking_calls:
            prompt = TaskSet.thinking_prompt(self._tokens)
        else:
            prompt = TaskSet.answer_prompt(self._tokens)
        thinking = self._calls < self._thinking_calls
        return Turn(
            kind="reason" if thinking else "answer",
            prompt_ids=prompt,
            sampling=Sampling(
                max_tokens=self._reasoning_tokens if thinking else TaskSet.answer_tokens
            ),
        )

    def observe(self, completion: Completion) -> None:
        turn = self.next_turn()
        if turn is None:
            raise InvalidArgumentError("the episode is over: it asked for no call")
        generated = [int(t) for t in completion.token_ids]
        self._tokens = [*turn.prompt_ids, *generated]
        if self._calls < self._thinking_calls:
            self.thoughts.extend(generated)
        else:
            self._answer = generated
        self._calls += 1

    def grade(self) -> tuple[float, RewardChecks | None]:
        return grade(self._task, self.thoughts, self._answer or [])


class DigitTask:
    """The digit task as an :class:`~rollout_recovery.rollout.EpisodeTask`: prompts from
    ``task_set``; ``[task]`` (``config``) says how many thinking calls of how many tokens
    each come before the answer."""

    def __init__(self, task_set: TaskSet, config: TaskConfig) -> None:
        self.task_set = task_set
        self.reasoning_tokens = config.reasoning_tokens
        self.thinking_calls = config.thinking_calls

    def episode(self, prompt: Mapping[str, Any]) -> DigitEpisode:
        return DigitEpisode(
            task_prompt(self.task_set, prompt),
            thinking_calls=self.thinking_calls,
            reasoning_tokens=self.reasoning_tokens,
        )
