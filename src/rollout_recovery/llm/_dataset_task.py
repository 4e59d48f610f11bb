"""The dataset task: a prompt per row, the model's chat template, a reward of one's own.

:class:`DatasetTask` is the map-style dataset the controller reads (``len``,
``dataset[idx]``): item ``idx`` is row ``idx`` of the `datasets` table, its prompt (the
``[task] prompt_field`` text as one user message, or the ``[task] messages_field`` chat)
rendered by the tokenizer's chat template with the generation prompt and tokenized. An
item is a pure function of the row and the tokenizer, so the controller rebuilds the same
prompt after a restart (the ledger checks it by ``idx``).

:class:`DatasetEpisodes` runs one call per episode: ``[task] max_tokens`` tokens after
the prompt, ended early by the model's end-of-sequence tokens. Grading decodes the
completion and awaits ``[reward] function`` (off the event loop, under its timeout) with
``prompt``, ``completion``, ``completion_ids`` and the row's other fields; a function
that fails raises ``RewardFunctionError`` out of the grade, which ``run_episode`` seals
as a failed attempt (a masked placeholder saying why). The reward's components are
remembered by (row, completion) for the step's samples (``_samples``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from ..errors import InvalidArgumentError
from ..policy import TaskConfig
from ..rewards import RewardChecks
from ..rollout import Completion, Sampling, Turn

__all__ = ["DATASET_TASK", "DatasetEpisodes", "DatasetTask", "RewardScorer", "Tokenizer"]

DATASET_TASK: Final = "dataset"
# Components of this many graded completions are kept for the step samples (the oldest
# forgotten first): far more than the siblings a staleness window keeps in flight.
_REMEMBERED: Final = 65_536


class Tokenizer(Protocol):
    """What the task needs of a Hugging Face tokenizer (``transformers`` leaves it
    unannotated)."""

    chat_template: str | None

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def __call__(self, text: str, **kwargs: Any) -> Any: ...

    def decode(self, token_ids: Sequence[int], **kwargs: Any) -> str: ...


class RewardScorer(Protocol):
    """A reward function (``_reward_function.RewardConfig.load``): the reward and its
    components, or ``RewardFunctionError``."""

    async def score(self, arguments: Mapping[str, Any]) -> tuple[float, Mapping[str, float]]: ...


class DatasetTask:
    """Rows of a `datasets` table as prompts (see the module docstring)."""

    def __init__(self, rows: Any, task: TaskConfig, tokenizer: Tokenizer) -> None:
        self._rows = rows
        self._size = len(rows)
        self._tokenizer = tokenizer
        self._messages = bool(task.messages_field)
        self._field = task.messages_field or task.prompt_field
        self._lock = threading.Lock()
        self._components: OrderedDict[tuple[int, tuple[int, ...]], Mapping[str, float]] = (
            OrderedDict()
        )

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"DatasetTask(rows={self._size}, field={self._field!r})"

    @property
    def field_names(self) -> list[str]:
        """The columns the reward function gets by name (all but the prompt's)."""
        return [name for name in self._rows.column_names if name != self._field]

    def row(self, idx: int) -> dict[str, Any]:
        """Row ``idx`` as plain Python values."""
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise InvalidArgumentError(f"a dataset index must be an int, got {idx!r}")
        if not 0 <= idx < self._size:
            raise IndexError(f"dataset index {idx} out of range for {self._size} rows")
        row: dict[str, Any] = self._rows[idx]
        return row

    def prompt_of(self, row: Mapping[str, Any]) -> Any:
        """The row's prompt as the reward function gets it: the text, or the messages."""
        return row[self._field]

    def prompt_text(self, idx: int) -> str:
        """The row's prompt for a reader: the text, or the last user message."""
        prompt = self.prompt_of(self.row(idx))
        if not self._messages:
            return str(prompt)
        users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        return str((users or list(prompt) or [{}])[-1].get("content", ""))

    def fields(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The row's other fields, as the reward function gets them."""
        return {name: value for name, value in row.items() if name != self._field}

    def prompt_ids(self, idx: int) -> list[int]:
        """The prompt of row ``idx``, rendered and tokenized."""
        prompt = self.prompt_of(self.row(idx))
        tokenizer = self._tokenizer
        if self._messages:
            messages = _messages(prompt, idx, self._field)
        elif tokenizer.chat_template:
            messages = [{"role": "user", "content": _text(prompt, idx, self._field)}]
        else:
            # No template (a base model): the text is the prompt, as it is.
            text = _text(prompt, idx, self._field)
            return [int(t) for t in tokenizer(text)["input_ids"]]
        rendered = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        # The template writes the special tokens it wants (BOS included) itself.
        ids = [int(t) for t in tokenizer(str(rendered), add_special_tokens=False)["input_ids"]]
        if not ids:
            raise InvalidArgumentError(f"row {idx} renders to an empty prompt")
        return ids

    def __getitem__(self, idx: int) -> dict[str, Any]:
        return {
            "idx": idx,
            "task_name": DATASET_TASK,
            "task_source": DATASET_TASK,
            "prompt_token_ids": self.prompt_ids(idx),
        }

    def checked_prompt(self, prompt: Mapping[str, Any]) -> tuple[int, list[int]]:
        """The payload's row and tokens, checked against the dataset (a mismatch is a
        controller bug, not a generation failure)."""
        idx = prompt.get("idx")
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise InvalidArgumentError(f"prompt idx must be an int, got {idx!r}")
        expected = self.prompt_ids(idx)
        given = [int(t) for t in prompt.get("prompt_token_ids", ())]
        if given != expected:
            raise InvalidArgumentError(f"prompt tokens do not match row {idx} of the dataset")
        return idx, expected

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=True)

    def remember(
        self, idx: int, completion: Sequence[int], components: Mapping[str, float]
    ) -> None:
        """Keep a graded completion's reward components for the step's samples."""
        with self._lock:
            self._components[(idx, tuple(completion))] = dict(components)
            while len(self._components) > _REMEMBERED:
                self._components.popitem(last=False)

    def components(self, idx: int, completion: Sequence[int]) -> Mapping[str, float] | None:
        """The components graded for this completion of row ``idx`` in this process, if
        any (a completion sealed before a restart was graded by an earlier process)."""
        with self._lock:
            return self._components.get((idx, tuple(int(t) for t in completion)))


def _text(prompt: object, idx: int, field: str) -> str:
    if not isinstance(prompt, str):
        raise InvalidArgumentError(
            f"row {idx}: the prompt field {field!r} holds a {type(prompt).__name__}, not text "
            "(for a chat, set [task] messages_field)"
        )
    return prompt


def _messages(prompt: object, idx: int, field: str) -> list[dict[str, Any]]:
    if not isinstance(prompt, list) or not all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) and "content" in m
        for m in prompt
    ):
        raise InvalidArgumentError(
            f"row {idx}: the messages field {field!r} must hold a list of "
            '{"role": ..., "content": ...} messages'
        )
    return [dict(m) for m in prompt]


class DatasetEpisodes:
    """The task's episodes (a ``rollout.EpisodeTask``): one call, then the reward."""

    def __init__(self, task: DatasetTask, reward: RewardScorer, *, max_tokens: int) -> None:
        self._task = task
        self._reward = reward
        self._sampling = Sampling(max_tokens=max_tokens)

    @property
    def task(self) -> DatasetTask:
        return self._task

    def episode(self, prompt: Mapping[str, Any]) -> _DatasetEpisode:
        idx, prompt_ids = self._task.checked_prompt(prompt)
        return _DatasetEpisode(self, idx, prompt_ids)


class _DatasetEpisode:
    __slots__ = ("_episodes", "_generated", "_idx", "_prompt")

    def __init__(self, episodes: DatasetEpisodes, idx: int, prompt: list[int]) -> None:
        self._episodes = episodes
        self._idx = idx
        self._prompt = prompt
        self._generated: list[int] | None = None

    def next_turn(self) -> Turn | None:
        if self._generated is not None:
            return None
        return Turn(kind="gen", prompt_ids=self._prompt, sampling=self._episodes._sampling)

    def observe(self, completion: Completion) -> None:
        self._generated = [int(t) for t in completion.token_ids]

    async def grade(self) -> tuple[float, RewardChecks | None]:
        task = self._episodes.task
        row = task.row(self._idx)
        generated = self._generated or []
        arguments = {
            **task.fields(row),
            "prompt": task.prompt_of(row),
            "completion": task.decode(generated),
            "completion_ids": list(generated),
        }
        reward, components = await self._episodes._reward.score(arguments)
        task.remember(self._idx, generated, components)
        return reward, None
