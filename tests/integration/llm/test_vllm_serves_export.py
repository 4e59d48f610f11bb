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
from typing import TYPE_CHECKING

import httpx
import pytest
import torch
from click.testing import CliRunner
from vllm_weights_support import ask

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

#: examples/tiny-llama-emit-token.toml (the emit-token job) cut to two steps on the vLLM tests'
#: tiny model and checkpointed after each step.
EXAMPLE = Path(__file__).parents[3] / "examples" / "tiny-llama-emit-token.toml"
EDITS = {
    "steps = 30": f"steps = {STEPS}",
    'source = "tiny-llama"': 'source = "{model}"',
    "every_steps = 5": "every_steps = 1",
}


def _train_and_export(directory: Path, model: Path) -> Path:
    text = EXAMPLE.read_text()
    for old, new in EDITS.items():
        assert text.count(old) == 1, old  # the example changed: update EDITS
        text = text.replace(old, new.format(model=model))
    config = directory / "job.toml"
    config.write_text(text)
    run = directory / "run"
    run_job(run, load_config(config))
    out = directory / "exported"
    result = CliRunner().invoke(cli, ["export", str(run), str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"exported checkpoint step_{STEPS:06d}" in result.output
    return out


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
    with httpx.Client() as client:
        answer = ask(client, server.url, PROMPT, NEW_TOKENS)
    prompt, served, served_logps = answer.prompt, answer.token_ids, answer.logprobs

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
