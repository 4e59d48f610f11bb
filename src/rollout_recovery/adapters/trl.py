"""TRL's ``GRPOTrainer`` with no completion lost to a crash: a recovering ``rollout_func``.

::

    last = get_last_checkpoint(output_dir)                      # what TRL resumes from
    recorder = Recorder.open(
        f"{output_dir}/rollout_recovery", group_size=num_generations,
        resume_checkpoint=resumed_tag(last),
    )
    rollout = RecoveringRollout(recorder, my_rollout_func)      # or RecoveringRollout(recorder)
    trainer = GRPOTrainer(..., rollout_func=rollout, callbacks=[rollout.callback()])
    trainer.train(resume_from_checkpoint=last)
    recorder.close()

Each generation batch TRL hands ``rollout_func`` (every prompt repeated
``num_generations`` times in a row) becomes one recorder group per prompt; a sibling sealed
before a crash is answered from the journal, and only the rest reach the wrapped function
(or, without one, are sampled from the trainer's model). The callback marks a generation
block trained once TRL has trained all of it, and marks each checkpoint TRL is about to
save under TRL's own name (``checkpoint-N``), so ``resumed_tag`` of the directory TRL
resumes from is the tag to restore.

Keys. TRL passes no dataset index, so the prompt must carry its identity: a ``row_id``
stamped into one of its message dicts (TRL passes message dicts through unchanged; the chat
template reads only ``role`` and ``content``), else the prompt's content digest. A row comes
back for two reasons: a new epoch (a new group), or TRL generating a batch again after a
resume (the same group: with ``steps_per_generation > 1`` and a checkpoint inside a
generation block, TRL regenerates an already-trained block and shifts every later one, so
TRL's step is no key). The rule that tells them apart: the key is ``"{row_id}:{n}"``, ``n``
the row's first occurrence not marked trained. A regenerated batch was not trained (or a
restore to the checkpoint before it made it trainable again), so it finds its own groups;
a new epoch finds them trained and takes the next ``n``.

The wrapped function receives only the rows still to generate, in order, each with the
sibling's index stamped beside its row id (``generation_index``, in a copy of the message
dict), so a function that seeds per sibling makes the same completion it would have made.
``seal_every=k`` calls it with k rows at a time and seals each call's completions as it
returns (a kill then costs at most one call's); the default is one call per batch, which
batched generation (vLLM) wants; sampling from the trainer's model seals row by row.
Fields it returns besides ``prompt_ids``, ``completion_ids`` and ``logprobs`` (they reach
TRL's reward functions) are sealed with each row and given back with it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trl  # noqa: F401  (this module is TRL's adapter: without TRL it does not import)
from transformers import TrainerCallback

from ..errors import InvalidArgumentError
from ..recorder import Recorder, SiblingOutput

__all__ = ["RecoveringRollout", "resumed_tag"]

RolloutFunc = Callable[[list[Any], Any], dict[str, Any]]
_REQUIRED = ("prompt_ids", "completion_ids", "logprobs")


def resumed_tag(checkpoint: str | Path | None) -> str | None:
    """The recorder's tag of the TRL checkpoint directory ``checkpoint`` (its name,
    ``checkpoint-N``), for ``Recorder.open(..., resume_checkpoint=)``; None for none."""
    return None if checkpoint is None else Path(checkpoint).name


def _row_identity(prompt: Any, row_key: str) -> str:
    if isinstance(prompt, list):
        for message in prompt:
            if isinstance(message, dict) and row_key in message:
                return str(message[row_key])
    text = json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)
    return "sha256-" + hashlib.sha256(text.encode()).hexdigest()[:24]


def _stamped(prompt: Any, row_key: str, sibling: int) -> Any:
    """``prompt`` with ``generation_index`` beside its row id (copies, never the caller's)."""
    if not isinstance(prompt, list):
        return prompt
    return [
        {**message, "generation_index": sibling}
        if isinstance(message, dict) and row_key in message
        else message
        for message in prompt
    ]


@dataclass(slots=True)
class _Block:
    """A generation batch TRL buffers and trains over ``generate_every`` micro-steps."""

    group_ids: list[str]
    start: int | None


class RecoveringRollout:
    """A ``rollout_func`` for ``GRPOTrainer`` that seals every completion in ``recorder``
    and never generates a sealed one again."""

    def __init__(
        self,
        recorder: Recorder,
        rollout_func: RolloutFunc | None = None,
        *,
        row_key: str = "row_id",
        seal_every: int | None = None,
    ) -> None:
        if seal_every is not None and (type(seal_every) is not int or seal_every < 1):
            raise InvalidArgumentError(
                f"seal_every must be None or an int >= 1, got {seal_every!r}"
            )
        self.recorder = recorder
        self.rollout_func = rollout_func
        self.row_key = row_key
        #: Rows per call of the wrapped function, each call's completions sealed as it
        #: returns (None: one call for the whole batch; a kill inside it loses the batch).
        self.seal_every = seal_every
        self._trainer: Any = None
        self._blocks: list[_Block] = []
        #: Completions generated (not answered from the journal), and answered.
        self.generated = 0
        self.reused = 0

    def callback(self) -> TrainerCallback:
        """The ``TrainerCallback`` that marks trained blocks and TRL's checkpoints."""
        return _RecordingCallback(self)

    # -- TRL's call -----------------------------------------------------------------------

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        self._trainer = trainer
        if not trainer.model.training:  # evaluation: nothing to recover or train
            return self._generate(prompts, trainer)
        size = self.recorder.group_size
        if trainer.num_generations != size or len(prompts) % size:
            raise InvalidArgumentError(
                f"the recorder's groups hold {size} siblings but TRL generates "
                f"{trainer.num_generations} per prompt ({len(prompts)} rows): open the "
                "recorder with group_size=num_generations"
            )
        groups = []
        used: dict[str, int] = {}
        for start in range(0, len(prompts), size):
            prompt = prompts[start]
            row = _row_identity(prompt, self.row_key)
            if any(_row_identity(p, self.row_key) != row for p in prompts[start : start + size]):
                raise InvalidArgumentError(
                    f"rows {start}..{start + size - 1} are not one prompt repeated "
                    f"{size} times (TRL's RepeatSampler order)"
                )
            occurrence = used.get(row, -1) + 1
            while True:
                taken = self.recorder.take(f"{row}:{occurrence}", prompt)
                if not taken.trained:
                    break
                occurrence += 1
            used[row] = occurrence
            groups.append(taken)
        todo = [
            (index, sibling) for index, taken in enumerate(groups) for sibling in taken.unsealed
        ]
        outputs: dict[tuple[int, int], Any] = {}
        chunk = self.seal_every or (1 if self.rollout_func is None else max(len(todo), 1))
        for first in range(0, len(todo), chunk):
            part = todo[first : first + chunk]
            rows = [
                _stamped(prompts[index * size], self.row_key, sibling) for index, sibling in part
            ]
            result = self._generate(rows, trainer)
            for position, (index, sibling) in enumerate(part):
                output = SiblingOutput(
                    prompt_token_ids=list(result["prompt_ids"][position]),
                    completion_token_ids=list(result["completion_ids"][position]),
                    logprobs=_floats(result["logprobs"][position]),
                    weight_version=int(trainer.state.global_step),
                    extra={k: v[position] for k, v in result.items() if k not in _REQUIRED},
                )
                outputs[(index, sibling)] = self.recorder.seal(
                    groups[index].group_id, sibling, output
                )
        self.generated += len(todo)
        self.reused += len(prompts) - len(todo)
        rows_out = [
            outputs.get((index, sibling)) or groups[index].sealed[sibling]
            for index in range(len(groups))
            for sibling in range(size)
        ]
        self._blocks.append(
            _Block([taken.group_id for taken in groups], getattr(trainer, "_step", None))
        )
        return _columns(rows_out)

    def _generate(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        if self.rollout_func is not None:
            return self.rollout_func(prompts, trainer)
        return sample_with_model(prompts, trainer)

    # -- the callback's side --------------------------------------------------------------

    def step_ended(self, global_step: int, *, final: bool = False) -> None:
        """Mark every block TRL has trained all of (``final``: the training ended)."""
        trainer = self._trainer
        if trainer is None:
            return
        every = int(trainer.args.steps_per_generation) * int(trainer.num_iterations)
        step = getattr(trainer, "_step", None)
        done = [
            block
            for block in self._blocks
            if final or block.start is None or step is None or step - block.start >= every
        ]
        if not done:
            return
        self._blocks = [block for block in self._blocks if block not in done]
        groups = list(dict.fromkeys(g for block in done for g in block.group_ids))
        self.recorder.mark_trained(groups, step=global_step)


def _floats(values: Any) -> list[float] | None:
    return None if values is None else [float(v) for v in values]


def _columns(rows: Sequence[Any]) -> dict[str, Any]:
    """TRL's column dict from sealed siblings, row by row."""
    out: dict[str, list[Any]] = {
        "prompt_ids": [list(r.prompt_token_ids) for r in rows],
        "completion_ids": [list(r.completion_token_ids) for r in rows],
        "logprobs": [
            list(r.logprobs) if r.logprobs is not None else [0.0] * len(r.completion_token_ids)
            for r in rows
        ],
    }
    extra_keys = list(dict.fromkeys(key for r in rows for key in r.extra))
    for key in extra_keys:
        out[key] = [r.extra.get(key) for r in rows]
    return out


class _RecordingCallback(TrainerCallback):
    """Marks trained blocks at each step's end, and each checkpoint TRL is about to save
    (before it writes it: a kill in between leaves the recorder a tag TRL never resumes,
    never the reverse)."""

    def __init__(self, rollout: RecoveringRollout) -> None:
        self.rollout = rollout

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.rollout.step_ended(int(state.global_step))
        if control.should_save:
            step = int(state.global_step)
            self.rollout.recorder.mark_checkpoint(f"checkpoint-{step}", step=step)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.rollout.step_ended(int(state.global_step), final=True)
        return control


def sample_with_model(prompts: list[Any], trainer: Any) -> dict[str, Any]:
    """The default generation: sample each row from the trainer's own model (chat template
    for message lists), with each token's logprob."""
    import torch  # loaded only when the adapter samples itself (TRL's venv has it)

    tokenizer = trainer.processing_class
    model = trainer.accelerator.unwrap_model(trainer.model)
    limit = int(trainer.args.max_completion_length)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
    for prompt in prompts:
        prompt_ids = _render(tokenizer, prompt)
        with torch.no_grad():
            generated = model.generate(
                torch.tensor([prompt_ids], device=model.device),
                do_sample=True,
                max_new_tokens=limit,
                return_dict_in_generate=True,
                output_scores=True,
                pad_token_id=pad,
            )
        completion = generated.sequences[0, len(prompt_ids) :].tolist()
        scores = model.compute_transition_scores(
            generated.sequences, generated.scores, normalize_logits=True
        )[0]
        out["prompt_ids"].append(prompt_ids)
        out["completion_ids"].append(completion)
        out["logprobs"].append([float(x) for x in scores[: len(completion)].tolist()])
    return out


def _render(tokenizer: Any, prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    messages = [
        {"role": m["role"], "content": m["content"]} for m in prompt if isinstance(m, Mapping)
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
