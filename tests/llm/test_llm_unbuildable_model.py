"""A model whose files do not make a model (a ``config.json`` that disagrees with its
weights) is refused naming ``$.model.source`` before anything is written, and the
corrected config then runs in the same directory (issue 24, item 20)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from test_llm_job import TINY_EXAMPLE, example_config

Cli = Callable[..., subprocess.CompletedProcess[str]]

SMALL = {"job": {"steps": 2, "prompts_per_step": 4}, "checkpoint": {"every_steps": 2}}


@pytest.mark.slow
def test_an_unbuildable_model_claims_nothing_and_the_corrected_config_runs(
    tmp_path: Path, tiny_model_dir: Path, model_cache: Path, run_cli: Cli
) -> None:
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    config["hidden_size"] = 30  # the weights are 128 wide
    (broken / "config.json").write_text(json.dumps(config))
    out = tmp_path / "run"
    (tmp_path / "bad").mkdir()
    bad = example_config(
        TINY_EXAMPLE, tmp_path / "bad", model_cache, {**SMALL, "model": {"source": str(broken)}}
    )

    refused = run_cli(["--out", str(out), "--config", str(bad), "--plain"], timeout=600)

    assert refused.returncode == 2, refused.stdout
    assert "error: $.model.source: the model in" in refused.stdout
    # Found in the weight files' headers, before any weight is read.
    assert "cannot be built: InvalidStateError" in refused.stdout
    assert "weights do not fit the model (shapes differ at" in refused.stdout
    assert "Traceback" not in refused.stdout
    assert sorted(os.listdir(out)) == [".lock"]

    (tmp_path / "good").mkdir()
    good = example_config(TINY_EXAMPLE, tmp_path / "good", model_cache, SMALL)
    finished = run_cli(["--out", str(out), "--config", str(good), "--plain"], timeout=600)
    assert finished.returncode == 0, finished.stdout
    assert "another job" not in finished.stdout
