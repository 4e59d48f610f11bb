"""Fixtures of the TRL suite: needs ``trl`` (``bash .ci/adapters`` installs trl==1.16.0)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("trl")

#: Where ``.ci/adapters`` keeps the built tiny Llama between runs (outside the repo).
MODELS_ENV = "ROLLOUT_RECOVERY_ADAPTERS_MODELS"


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ``[model] cache_dir`` holding the project's tiny Llama, built once (never ~/.cache)."""
    from rollout_recovery.llm import ModelConfig

    cache = os.environ.get(MODELS_ENV) or str(tmp_path_factory.mktemp("models"))
    ModelConfig(source="tiny-llama", cache_dir=cache).resolved(target_token=0)
    return cache


@pytest.fixture
def child_env(tmp_path: Path) -> dict[str, str]:
    """The children's environment: one torch thread, HF caches in the test's own dir (the
    example reaches no hub: these only keep stray writes out of ~/.cache)."""
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        HF_HOME=str(tmp_path / "hf-home"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_CACHE=str(tmp_path / "hf-datasets"),
        TOKENIZERS_PARALLELISM="false",
    )
    return env
