"""The adapter suites: TRL's GRPOTrainer and verl's agent loop with a kill -9 and a rerun.

They need packages the main suite does not have (``trl``; ``verl``, which needs a
transformers older than the ``[llm]`` extra's, so it has a venv of its own), so they are
collected only under their own configuration, ``tests/adapters/pytest.ini``::

    bash .ci/adapters                           # builds the venvs, runs both suites
    python -m pytest tests/adapters/trl_grpo    # in a venv with trl (pytest finds pytest.ini
                                                # here: the nearest config above its arguments)

The main suite (``python -m pytest`` with pyproject.toml's settings) walks past this
directory without importing anything in it, so it neither needs nor imports trl or verl.
"""

from __future__ import annotations

from pathlib import Path

import pytest

OWN_CONFIG = Path(__file__).with_name("pytest.ini")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.inipath is None or Path(config.inipath).resolve() != OWN_CONFIG.resolve():
        return True
    return None
