"""GRPO with TRL on CPU that picks up where it stopped: rerun the same command after a kill.

    python examples/trl/grpo_recovering.py --output-dir DIR --max-steps N

Trains the project's tiny random Llama (built locally from a seed, no model hub; cached in
``~/.cache/rollout-recovery/models`` unless ``--model-cache`` says otherwise) with TRL's
``GRPOTrainer`` on CPU, checkpointing into ``DIR`` every ``--save-steps`` steps. Run again
with the same arguments after the process died (a kill -9 included), it resumes from the
newest checkpoint in ``DIR``. Needs TRL beside this project::

    pip install torch==2.13.0 trl==1.16.0 && pip install rollout-recovery

The completions come from a plain ``rollout_func`` that samples with the trainer's own model,
one completion per row. TRL hands it each prompt repeated ``num_generations`` times in a row,
conversational prompts as message lists, and no dataset index: the dataset stamps a ``row_id``
into the user message, and TRL passes the message dicts through unchanged. So every
completion has a content key, (row id, generation index), that survives a restart, which is
what a journal keys on. TRL's own step counter does not: with ``--steps-per-generation 2``
and a checkpoint inside a generation block, the rerun regenerates a block it already trained
on and every later block one step late.

The recorder (``rollout_recovery.adapters.trl``) wraps that function: every completion is
sealed in a journal in ``DIR/rollout_recovery`` as it is made, and the rerun answers each one
sealed before the kill from the journal instead of generating it again (the block a
mid-block checkpoint makes TRL regenerate included). ``--no-recorder`` runs the plain
function alone: the rerun then regenerates every completion of the batch the kill
interrupted (and, with a mid-block checkpoint, of the block before it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig, GRPOTrainer

from rollout_recovery.adapters.trl import RecoveringRollout, resumed_tag
from rollout_recovery.llm import ModelConfig
from rollout_recovery.recorder import Recorder

#: Completions per prompt, and rows (completions) per training step: two prompts a step.
NUM_GENERATIONS = 2
ROWS_PER_STEP = 4
MAX_COMPLETION_TOKENS = 8

Message = dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Completion:
    """One generated completion, keyed by content: ``(row_id, generation_index)``.

    ``global_step`` is TRL's step when it was generated: a label, not a key (it shifts on
    resume, see the module docstring).
    """

    row_id: int
    generation_index: int
    global_step: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]


def prompt_rows(count: int) -> list[dict[str, list[Message]]]:
    """The dataset: ``count`` one-message conversations, each user message stamped with its
    ``row_id`` (the chat template reads only ``role`` and ``content``)."""
    return [
        {"prompt": [{"role": "user", "content": f"Count on from {i}:", "row_id": i}]}
        for i in range(count)
    ]


def row_id_of(prompt: Sequence[Message]) -> int:
    """The dataset identity TRL carried through for us (see :func:`prompt_rows`)."""
    for message in prompt:
        if "row_id" in message:
            return int(message["row_id"])
    raise ValueError(f"a prompt without a row_id reached the rollout function: {prompt!r}")


def stamped_index(prompt: Sequence[Message]) -> int | None:
    """The sibling index the recorder stamped beside the row id, if it did."""
    for message in prompt:
        if "generation_index" in message:
            return int(message["generation_index"])
    return None


def generation_indices(row_ids: Sequence[int]) -> list[int]:
    """Each row's position among the rows of its prompt in this call (TRL repeats a prompt
    ``num_generations`` times in a row)."""
    seen: dict[int, int] = {}
    out = []
    for row_id in row_ids:
        out.append(seen.get(row_id, 0))
        seen[row_id] = out[-1] + 1
    return out


@torch.no_grad()
def sample(
    model: Any,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    eos_token_id: int,
    generator: torch.Generator,
) -> tuple[list[int], list[float]]:
    """Ancestral sampling at temperature 1, one token at a time; the sampled tokens and
    their logprobs under ``model`` (what GRPO's importance ratio starts from)."""
    ids = torch.tensor([prompt_ids])
    tokens: list[int] = []
    logprobs: list[float] = []
    for _ in range(max_new_tokens):
        logits = model(input_ids=ids).logits[0, -1].float()
        log_p = torch.log_softmax(logits, dim=-1)
        token = int(torch.multinomial(log_p.exp(), 1, generator=generator))
        tokens.append(token)
        logprobs.append(float(log_p[token]))
        if token == eos_token_id:
            break
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return tokens, logprobs


class PlainRollout:
    """TRL's ``rollout_func``: one completion per row, sampled with the trainer's model.

    Each completion's random stream is seeded from ``(seed, row_id, generation_index)``, so
    a completion generated again after a restart (same weights) is the same completion.
    ``on_completion`` sees each one as it is made (the tests count and interrupt with it).
    """

    def __init__(
        self,
        *,
        seed: int,
        max_new_tokens: int = MAX_COMPLETION_TOKENS,
        on_completion: Callable[[Completion], None] | None = None,
    ) -> None:
        self.seed = seed
        self.max_new_tokens = max_new_tokens
        self.on_completion = on_completion

    def __call__(self, prompts: list[list[Message]], trainer: GRPOTrainer) -> dict[str, Any]:
        tokenizer = trainer.processing_class
        model = trainer.accelerator.unwrap_model(trainer.model)
        row_ids = [row_id_of(prompt) for prompt in prompts]
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        # The recorder hands over only the rows still to generate, each stamped with its
        # sibling's index; TRL alone hands every row of each prompt, in a row.
        stamped = [stamped_index(prompt) for prompt in prompts]
        indices = (
            [int(i) for i in stamped if i is not None]
            if all(i is not None for i in stamped)
            else generation_indices(row_ids)
        )
        for prompt, row_id, index in zip(prompts, row_ids, indices, strict=True):
            prompt_ids = self.render(tokenizer, prompt)
            generator = torch.Generator().manual_seed(
                zlib.crc32(f"{self.seed}/{row_id}/{index}".encode())
            )
            completion_ids, logprobs = sample(
                model,
                prompt_ids,
                max_new_tokens=self.max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                generator=generator,
            )
            completion = Completion(
                row_id=row_id,
                generation_index=index,
                global_step=trainer.state.global_step,
                prompt_ids=prompt_ids,
                completion_ids=completion_ids,
                logprobs=logprobs,
            )
            if self.on_completion is not None:
                self.on_completion(completion)
            out["prompt_ids"].append(prompt_ids)
            out["completion_ids"].append(completion_ids)
            out["logprobs"].append(logprobs)
        return out

    @staticmethod
    def render(tokenizer: Any, prompt: Sequence[Message]) -> list[int]:
        """The prompt's tokens: the chat template over role and content only (the row id
        stays out of the model's input whatever the template reads)."""
        messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def digit_reward(completions: list[list[Message]], **_: Any) -> list[float]:
    """The share of digits in each completion: a reward the tiny model can climb."""
    texts = [completion[-1]["content"] for completion in completions]
    return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in texts]


def tiny_llama(model_cache: str) -> Path:
    """The project's tiny random Llama (vocab 333, 2 layers, ChatML template), built on
    first use."""
    model = ModelConfig(source="tiny-llama", cache_dir=model_cache)
    return model.resolved(target_token=0).directory()


def build_trainer(
    args: argparse.Namespace,
    rollout_func: Callable[[list[list[Message]], GRPOTrainer], dict[str, Any]],
    *,
    callbacks: Sequence[TrainerCallback] = (),
) -> GRPOTrainer:
    config = GRPOConfig(
        output_dir=str(args.output_dir),
        max_steps=args.max_steps,
        per_device_train_batch_size=ROWS_PER_STEP,
        num_generations=NUM_GENERATIONS,
        steps_per_generation=args.steps_per_generation,
        max_completion_length=MAX_COMPLETION_TOKENS,
        learning_rate=1e-3,
        beta=0.0,  # no reference model: one model on CPU
        save_strategy="steps",
        save_steps=args.save_steps,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        use_vllm=False,
        bf16=False,
        seed=args.seed,
        dataloader_num_workers=0,
    )
    # GRPOTrainer warns that ``rollout_func`` is experimental unless this is set.
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return GRPOTrainer(
        model=str(tiny_llama(args.model_cache)),
        reward_funcs=digit_reward,
        args=config,
        train_dataset=Dataset.from_list(prompt_rows(args.prompts)),
        rollout_func=rollout_func,
        callbacks=list(callbacks),
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--steps-per-generation", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=64, help="dataset rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-cache", default="", help="where the tiny Llama is built")
    parser.add_argument(
        "--no-recorder", action="store_true", help="the plain rollout_func alone (a baseline)"
    )
    return parser.parse_args(argv)


def train(
    args: argparse.Namespace,
    *,
    on_completion: Callable[[Completion], None] | None = None,
) -> None:
    # One intra-op thread: the model is tiny, and a second thread only spins on 2 cores.
    torch.set_num_threads(1)
    plain = PlainRollout(seed=args.seed, on_completion=on_completion)
    last = get_last_checkpoint(str(args.output_dir)) if args.output_dir.is_dir() else None
    print(f"grpo_recovering: {'resuming from ' + last if last else 'starting'}", flush=True)
    if args.no_recorder:
        trainer = build_trainer(args, plain)
        trainer.train(resume_from_checkpoint=last)
        print(f"grpo_recovering: trained to step {trainer.state.global_step}", flush=True)
        return
    # The journal lives beside TRL's checkpoints and is restored to the one TRL resumes.
    with Recorder.open(
        args.output_dir / "rollout_recovery",
        group_size=NUM_GENERATIONS,
        resume_checkpoint=resumed_tag(last),
    ) as recorder:
        # seal_every=1: each completion is sealed as soon as it is made.
        rollout = RecoveringRollout(recorder, plain, seal_every=1)
        trainer = build_trainer(args, rollout, callbacks=[rollout.callback()])
        trainer.train(resume_from_checkpoint=last)
    print(
        f"grpo_recovering: trained to step {trainer.state.global_step}; "
        f"{rollout.generated} completions generated, {rollout.reused} from the journal",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
