"""A torch job on an install without the ``[llm]`` extra: refused before anything is
written, with a message that says what to install. torch is hidden from the import
system (``sys.modules[name] = None``), so this runs with or without it installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rollout_recovery.cli._main import cli
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.errors import ConfigError
from rollout_recovery.job import run_job

LLM_JOB = {
    "generation": {"backend": "transformers"},
    "trainer": {"kind": "torch"},
    "task": {"kind": "emit_token"},
}


@pytest.fixture
def without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("torch", "transformers", "safetensors"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.usefixtures("without_torch")
def test_run_job_names_the_llm_extra_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = config_from_builtins({**LLM_JOB, "model": {"cache_dir": str(tmp_path / "cache")}})
    with pytest.raises(ConfigError) as refused:
        run_job(out, config)
    assert refused.value.path == "$.trainer.kind"
    assert "torch, transformers, safetensors" in str(refused.value)
    assert "pip install 'rollout-recovery[llm]'" in str(refused.value)
    assert not out.exists() and not (tmp_path / "cache").exists()


@pytest.mark.usefixtures("without_torch")
def test_the_cli_says_what_to_install(tmp_path: Path) -> None:
    config = tmp_path / "llm.toml"
    config.write_text(
        '[generation]\nbackend = "transformers"\n[trainer]\nkind = "torch"\n'
        '[task]\nkind = "emit_token"\n'
    )
    result = CliRunner().invoke(
        cli, ["run", "--config", str(config), "--out", str(tmp_path / "run"), "--plain"]
    )
    assert result.exit_code == 2, result.output
    assert "[llm] extra" in result.output and "$.trainer.kind" in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("without_torch")
def test_the_llm_package_imports_and_building_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rollout_recovery.llm as llm
    from rollout_recovery.policy import TaskConfig

    # As on a default install: the trainer's module was never loaded.
    monkeypatch.delitem(sys.modules, "rollout_recovery.llm._trainer", raising=False)

    assert llm.TrainerConfig().kind == "numpy"
    with pytest.raises(ConfigError, match=r"\[llm\] extra"):
        llm.TrainerConfig().torch_parts(llm.ModelConfig(), TaskConfig(), seed=0)
    assert "rollout_recovery.llm._trainer" not in sys.modules


def test_a_numpy_job_never_needs_torch(tmp_path: Path, without_torch: None) -> None:
    """The default config resolves no model and asks for nothing."""
    from rollout_recovery.job._llm_parts import resolve_model

    config = config_from_builtins({})
    assert resolve_model(config) is config
