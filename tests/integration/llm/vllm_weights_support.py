"""Weights, model directories and recomputed logprobs for the real-vLLM weight tests.

The trainer's side of the comparison: the tiny model in fp32 (as ``TorchGRPOTrainer``
holds it), perturbed into new weight versions, and the logprobs of a token sequence
recomputed under given weights exactly as the trainer does (``log_softmax`` of fp32
logits at temperature 1, which is what vLLM's raw logprobs are).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from rollout_recovery.llm._model_files import load_causal_lm, write_model_dir
from rollout_recovery.llm._skeleton import ModelSkeleton
from rollout_recovery.llm._weights import TorchWeights

#: Files of the model directory besides config and weights (the tokenizer vLLM loads).
_EXTRA_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Answer:
    """A greedy completion: the generated ids and vLLM's logprob of each."""

    prompt: list[int]
    token_ids: list[int]
    logprobs: list[float]


def base_weights(model_dir: Path) -> TorchWeights:
    """The model's weights in fp32, as the trainer loads them (version 0)."""
    return TorchWeights.capture(0, load_causal_lm(model_dir).named_parameters())


def perturbed(base: TorchWeights, version: int, *, seed: int) -> TorchWeights:
    """Every tensor moved by half its spread; the (tied) embedding redrawn whole, so a
    server that keeps the old one in its ``lm_head`` answers visibly differently."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, tensor in base.tensors.items():
        noise = torch.randn(tensor.shape, generator=generator)
        spread = float(tensor.std()) if tensor.numel() > 1 else 1.0
        if name == "model.embed_tokens.weight":
            tensors[name] = noise * spread
        else:
            tensors[name] = tensor + 0.5 * spread * noise
    return TorchWeights(version, tensors)


def write_fresh_model(
    out: Path, skeleton: ModelSkeleton, weights: TorchWeights, like: Path, dtype: torch.dtype
) -> Path:
    """A model directory holding ``weights`` (in ``dtype``) that a new server starts from."""
    tensors = {name: t.to(dtype) for name, t in weights.tensors.items()}
    extra = {name: (like / name).read_bytes() for name in _EXTRA_FILES if (like / name).is_file()}
    if out.exists():
        shutil.rmtree(out)
    write_model_dir(out, skeleton.config, tensors, extra_files=extra)
    return out


def ask(client: httpx.Client, url: str, prompt: Sequence[int] | str, max_tokens: int) -> Answer:
    """vLLM's greedy completion of ``prompt`` (token ids, or text the server tokenizes)."""
    reply = client.post(
        f"{url}/v1/completions",
        json={
            "model": "tiny",
            "prompt": prompt if isinstance(prompt, str) else list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "logprobs": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
        timeout=TIMEOUT_S,
    )
    reply.raise_for_status()
    choice: dict[str, Any] = reply.json()["choices"][0]
    prompt_ids = choice["prompt_token_ids"] if isinstance(prompt, str) else list(prompt)
    return Answer(prompt_ids, choice["token_ids"], choice["logprobs"]["token_logprobs"])


def recompute(skeleton: ModelSkeleton, weights: TorchWeights, answer: Answer) -> np.ndarray:
    """The trainer's fp32 logprobs of ``answer``'s generated ids under ``weights``."""
    model = skeleton.build(weights)
    ids = torch.tensor([answer.prompt + answer.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    logps = torch.log_softmax(logits, dim=-1)
    positions = torch.arange(len(answer.prompt) - 1, ids.shape[1] - 1)
    chosen = logps[positions, ids[0, positions + 1]]
    return chosen.numpy().astype(np.float64)


def max_abs_diff(answer: Answer, reference: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(answer.logprobs, dtype=np.float64) - reference)))
