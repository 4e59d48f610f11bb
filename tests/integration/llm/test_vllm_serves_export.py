"""vLLM serves what ``rollout-recovery export`` writes (issue 27 item 5), on a real server.

Two steps of the torch job on the tiny Llama (sampled in process by transformers), the
export of its newest checkpoint, and a vLLM server started on the export directory alone
(its config, fp32 weights and tokenizer), in fp32 as exported. Its greedy completion of a
text prompt is transformers' greedy decoding of the same export token for token (the
transformers argmax at every position of the completion is the served token), its logprobs
match transformers' within the fp32 tolerance measured for the tiny model, it tokenized the
prompt as the exported tokenizer does, and its logprobs are far from the untrained model's:
the server answers with the trained weights, not the base model's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import torch
from click.testing import CliRunner

from rollout_recovery.cli._main import cli
from rollout_recovery.control import load_config
from rollout_recovery.job import run_job

if TYPE_CHECKING:  # conftest is not importable by name at run time (several exist)
    from conftest import VllmServerFactory

pytestmark = pytest.mark.vllm

STEPS = 2
PROMPT = "the cat sat on the mat"
NEW_TOKENS = 16
#: max |vLLM logprob - transformers fp32 logprob| for an fp32 server: the weight-sync
#: tests' FP32_TOLERANCE (measured 4.8e-7 on the tiny model, docs/benchmarks.md).
FP32_TOLERANCE = 1e-5
REQUEST_TIMEOUT_S = 120.0

#: The emit-token job of examples/tiny-llama-emit-token.toml, two steps, on the vLLM
#: tests' tiny model, checkpointed after each step.
JOB_TOML = """
[job]
steps = {steps}
prompts_per_step = 4
generations_per_prompt = 4
staleness_window = 0
seed = 0

[task]
kind = "emit_token"
target_token = 313
max_tokens = 8

[model]
source = "{model}"

[trainer]
kind = "torch"
learning_rate = 5e-3
epochs = 2
threads = 1

[generation]
backend = "transformers"
max_inflight_attempts = 16
attempt_deadline_s = 120.0

[checkpoint]
every_steps = 1
keep = 3

[liveness]
step_timeout_s = 300.0
train_step_timeout_s = 120.0
"""


def _train_and_export(directory: Path, model: Path) -> Path:
    config = directory / "job.toml"
    config.write_text(JOB_TOML.format(steps=STEPS, model=model))
    run = directory / "run"
    run_job(run, load_config(config))
    out = directory / "exported"
    result = CliRunner().invoke(cli, ["export", str(run), str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"exported checkpoint step_{STEPS:06d}" in result.output
    return out


def _complete(url: str) -> dict[str, Any]:
    """vLLM's greedy completion of :data:`PROMPT`, with token ids and logprobs."""
    reply = httpx.post(
        f"{url}/v1/completions",
        json={
            "model": "tiny",
            "prompt": PROMPT,
            "max_tokens": NEW_TOKENS,
            "temperature": 0.0,
            "logprobs": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
        timeout=REQUEST_TIMEOUT_S,
    )
    reply.raise_for_status()
    choice: dict[str, Any] = reply.json()["choices"][0]
    return choice


def _teacher_forced(
    model_dir: Path, prompt: list[int], completion: list[int]
) -> tuple[list[int], list[float]]:
    """Transformers' fp32 greedy token and the logprob of ``completion``'s token at each of
    its positions, after ``prompt`` and the completion's earlier tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
    logps = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    chosen = logps[torch.arange(len(completion)), torch.tensor(completion)]
    return logps.argmax(dim=-1).tolist(), chosen.tolist()


def test_vllm_serves_the_export_as_transformers_runs_it(
    vllm_server_factory: VllmServerFactory, vllm_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    exported = _train_and_export(tmp_path, vllm_model_dir)
    server = vllm_server_factory(model=exported, dtype="float32")
    choice = _complete(server.url)
    prompt, served = choice["prompt_token_ids"], choice["token_ids"]
    served_logps = choice["logprobs"]["token_logprobs"]

    tokenizer = AutoTokenizer.from_pretrained(str(exported))
    assert prompt == tokenizer(PROMPT)["input_ids"]
    assert len(served) == NEW_TOKENS and all(0 <= t < len(tokenizer) for t in served)
    greedy, logps = _teacher_forced(exported, prompt, served)
    assert served == greedy
    gap = max(abs(a - b) for a, b in zip(served_logps, logps, strict=True))
    assert gap <= FP32_TOLERANCE, (gap, served_logps, logps)
    # The trained weights, not the base model's: the same tokens under the untrained model
    # are far outside the tolerance.
    _, base = _teacher_forced(vllm_model_dir, prompt, served)
    moved = max(abs(a - b) for a, b in zip(served_logps, base, strict=True))
    assert moved > 100 * FP32_TOLERANCE, moved
    print(f"measured: served vs transformers {gap:.2e}, served vs base model {moved:.2e}")
