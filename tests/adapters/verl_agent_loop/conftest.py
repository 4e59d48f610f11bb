"""Fixtures of the verl suite: needs ``verl[verl-core]==0.9.1`` (its own venv, built by
``bash .ci/adapters``: verl needs transformers < 5.11, the ``[llm]`` extra >= 5.19)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("verl")

#: Where ``.ci/adapters`` keeps the built tiny Llama between runs (outside the repo).
MODELS_ENV = "ROLLOUT_RECOVERY_ADAPTERS_MODELS"


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The project's tiny Llama (its tokenizer has a ChatML chat template), built once."""
    from rollout_recovery.llm import ModelConfig

    cache = os.environ.get(MODELS_ENV) or str(tmp_path_factory.mktemp("models"))
    model = ModelConfig(source="tiny-llama", cache_dir=cache).resolved(target_token=0)
    return str(model.directory())
