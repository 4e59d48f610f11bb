"""The synthetic agent task every backend runs: one task prompt, a reasoning call, an answer.

Shared by the simulated backend and the HTTP backend so that both check a prompt against
its task, build the answer call's prompt and grade an episode the same way; only where the
tokens come from differs.

An episode: call 1 generates ``reasoning_tokens`` thought tokens from the task prompt;
call 2's prompt is call 1's prompt + its tokens + ``[ANSWER]`` (so it extends its parent
exactly) and generates ``[answer digit, EOS]``. The reward is 1.0 when the first answer
token is the right digit. A real model (the vLLM tests run a random tiny Llama) may emit
any token: an answer outside the digit range just scores 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..capture import CallRecord, CaptureFailure, assemble_receipt
from ..errors import InvalidArgumentError
from ..policy import ANSWER, DIGIT_BASE, TaskSet, prompt_digit, render
from ..rewards import RewardChecks, compute_reward_checks
from ._protocol import AttemptResult

__all__ = [
    "TaskPrompt",
    "answer_prompt",
    "finished_attempt",
    "grade",
    "task_prompt",
]


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
        digit=prompt_digit(token_ids),
        expected=int(task["answer"]),
        messages=list(messages),
    )


def answer_prompt(task: TaskPrompt, thoughts: Sequence[int]) -> list[int]:
    """Call 2's prompt: the whole first call, then the ANSWER tag."""
    return [*task.token_ids, *thoughts, ANSWER]


def grade(
    task: TaskPrompt, thoughts: Sequence[int], answer: Sequence[int]
) -> tuple[float, RewardChecks]:
    """The episode's reward and its reward checks (computed on the rendered response)."""
    reward = 1.0 if answer and answer[0] - DIGIT_BASE == task.expected else 0.0
    result = {
        "response": {
            "output": [
                {"type": "reasoning", "summary": [{"text": render(thoughts)}]},
                {
                    "type": "message",
                    "content": [{"type": "output_text", "text": render(answer[:1])}],
                },
            ]
        }
    }
    checks = compute_reward_checks(
        result, {"responses_create_params": {"input": task.messages}}, effort=None
    )
    return reward, checks


def finished_attempt(
    task: TaskPrompt,
    rollout_id: str,
    records: Sequence[CallRecord],
    *,
    thoughts: Sequence[int],
    answer: Sequence[int],
    answer_call_id: str,
    failures: Sequence[CaptureFailure] = (),
) -> AttemptResult:
    """A whole episode as the controller seals it: graded, its receipt assembled."""
    reward, checks = grade(task, thoughts, answer)
    receipt = assemble_receipt(
        rollout_id,
        records,
        terminal_model_call_id=answer_call_id,
        failures=failures,
        reward=reward,
    )
    return AttemptResult(
        rollout_id=rollout_id,
        receipt=receipt,
        reward=reward,
        mask_sample=False,
        reward_checks=checks,
        generated_tokens=len(thoughts) + len(answer),
    )
