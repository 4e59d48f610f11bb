"""The tiny random Llama: deterministic from its spec, shared with the vLLM tool, no hub."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rollout_recovery.errors import InvalidArgumentError
from rollout_recovery.llm._model_files import load_causal_lm
from rollout_recovery.llm._tiny_llama import TinyLlamaSpec, build_tiny_llama, is_complete

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "vllm" / "build_tiny_model.py"


def _digests(directory: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }


def test_the_same_spec_gives_the_same_bytes(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec = TinyLlamaSpec(dtype="float32")
    build_tiny_llama(tmp_path / "again", spec)
    assert _digests(tmp_path / "again") == _digests(tiny_model_dir)
    assert is_complete(tmp_path / "again", spec)
    assert not is_complete(tmp_path / "again", TinyLlamaSpec(dtype="float32", seed=1))
    assert not is_complete(tmp_path / "nothing")


def test_the_model_is_the_specified_llama(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["vocab_size"] == 333 and config["tie_word_embeddings"] is True
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 128
    model = load_causal_lm(tiny_model_dir)
    assert sum(p.numel() for p in model.parameters()) == 338176
    assert all(p.dtype == torch.float32 for p in model.parameters())
    tokenizer = json.loads((tiny_model_dir / "tokenizer.json").read_text())
    assert [t["content"] for t in tokenizer["added_tokens"]][:2] == ["<s>", "</s>"]


@pytest.mark.slow
def test_the_vllm_tool_builds_the_same_model_in_bf16(tmp_path: Path, tiny_model_dir: Path) -> None:
    """tools/vllm/build_tiny_model.py loads this package's builder by path: its default
    model is the bf16 cast of the fp32 one from the same seed, and it is idempotent."""
    out = tmp_path / "vllm-model"
    first = subprocess.run(
        [sys.executable, str(TOOL), str(out)], capture_output=True, text=True, check=True
    )
    assert "built tiny Llama (338176 parameters)" in first.stdout
    again = subprocess.run(
        [sys.executable, str(TOOL), str(out)], capture_output=True, text=True, check=True
    )
    assert "skipping" in again.stdout
    bf16 = load_causal_lm(out)  # cast up to fp32 on load
    fp32 = load_causal_lm(tiny_model_dir)
    for (name, a), (_, b) in zip(bf16.named_parameters(), fp32.named_parameters(), strict=True):
        assert torch.equal(a, b.to(torch.bfloat16).to(torch.float32)), name
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert (out / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()


def test_building_leaves_the_callers_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(77)
    expected = torch.rand(3)
    torch.manual_seed(77)
    build_tiny_llama(tmp_path / "m", TinyLlamaSpec(dtype="float32", num_hidden_layers=1))
    assert torch.equal(torch.rand(3), expected)


def test_building_prints_no_progress_bar_and_leaves_transformers_bars_as_they_were(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from transformers.utils import logging as transformers_logging

    assert transformers_logging.is_progress_bar_enabled()
    build_tiny_llama(tmp_path / "quiet", TinyLlamaSpec(dtype="float32"))
    captured = capfd.readouterr()
    assert "Writing model shards" not in captured.err + captured.out
    assert transformers_logging.is_progress_bar_enabled()


def test_a_larger_vocabulary_and_another_seed(tmp_path: Path) -> None:
    spec = TinyLlamaSpec(dtype="float32", vocab_size=512, seed=9, num_hidden_layers=1)
    count = build_tiny_llama(tmp_path / "m", spec)
    model = load_causal_lm(tmp_path / "m")
    assert model.config.vocab_size == 512 and count == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "bad",
    [
        {"vocab_size": 100},
        {"hidden_size": 0},
        {"num_attention_heads": 3, "num_key_value_heads": 2},
        {"dtype": "int8"},
        {"seed": -1},
        {"vocab_size": True},
    ],
)
def test_a_bad_spec_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        TinyLlamaSpec(**bad)  # type: ignore[arg-type]
