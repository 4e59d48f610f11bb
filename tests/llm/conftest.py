"""Fixtures of the LLM tests: the tiny random Llama in fp32, built once per session.

Every test here needs the ``[llm]`` extra (torch, transformers, safetensors); without it
they skip, so the ordinary suite passes on a default install.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``[model] cache_dir`` for the session, holding the built tiny Llama (never the
    user's ~/.cache)."""
    from rollout_recovery.llm import ModelConfig
    from rollout_recovery.llm._model_source import prepare_model

    cache = tmp_path_factory.mktemp("models")
    prepare_model(ModelConfig(source="tiny-llama", cache_dir=str(cache)))
    return cache


@pytest.fixture(scope="session")
def tiny_model_dir(model_cache: Path) -> Path:
    """The default tiny Llama (vocab 333, 2 layers, seed 1234), weights stored in fp32:
    what ``[model] source = "tiny-llama"`` trains."""
    from rollout_recovery.llm import ModelConfig
    from rollout_recovery.llm._model_source import TINY_LLAMA_SPEC, model_directory
    from rollout_recovery.llm._tiny_llama import TinyLlamaSpec

    assert TinyLlamaSpec(dtype="float32") == TINY_LLAMA_SPEC
    return model_directory(ModelConfig(source="tiny-llama", cache_dir=str(model_cache)))


@pytest.fixture(scope="session")
def dropout_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model with attention dropout 0.5: training draws random numbers."""
    out = tmp_path_factory.mktemp("tiny-llama-dropout") / "model"
    shutil.copytree(tiny_model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["attention_dropout"] = 0.5
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="session", autouse=True)
def datasets_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The `datasets` library's cache for the session (and the jobs it starts), never the
    user's ~/.cache/huggingface/datasets."""
    import os

    cache = tmp_path_factory.mktemp("hf-datasets")
    before = os.environ.get("HF_DATASETS_CACHE")
    os.environ["HF_DATASETS_CACHE"] = str(cache)  # what a job subprocess reads
    try:
        import datasets
    except ImportError:
        datasets = None
    previous = None if datasets is None else datasets.config.HF_DATASETS_CACHE
    if datasets is not None:
        datasets.config.HF_DATASETS_CACHE = cache  # read by every load in this process
    yield cache
    if datasets is not None:
        datasets.config.HF_DATASETS_CACHE = previous
    if before is None:
        os.environ.pop("HF_DATASETS_CACHE", None)
    else:
        os.environ["HF_DATASETS_CACHE"] = before


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: on a loaded 2-core machine two threads made a tiny-model step
    ten times slower (0.27 s instead of 0.027 s wall, CPU time alike: the pool spins)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
