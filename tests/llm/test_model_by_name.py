"""Models by name (issue 27 item 3): ``[model] source = "org/name"`` is the snapshot in the
Hugging Face hub cache (``huggingface_hub``'s layout, built here: this machine reaches no
hub); a repo that is not there is refused naming the cache, and a job runs on one that is."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rollout_recovery.control import load_config
from rollout_recovery.errors import ConfigError
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job
from rollout_recovery.llm import ModelConfig
from rollout_recovery.llm._model_source import hub_repo, model_digest, prepare_model

huggingface_hub = pytest.importorskip("huggingface_hub")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, repo_id: str, model_dir: Path, *, revision: str = "main") -> Path:
    """``root`` laid out as huggingface_hub's cache holding ``model_dir`` as ``repo_id``:
    ``models--org--name/refs/<revision>`` names a commit whose ``snapshots/<commit>``
    directory links to ``blobs/`` (what ``hf download`` leaves)."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / revision).write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for index, path in enumerate(sorted(model_dir.iterdir())):
        if path.is_file():
            blob = repo / "blobs" / f"blob{index}"
            shutil.copyfile(path, blob)
            (snapshot / path.name).symlink_to(Path("../../blobs") / blob.name)
    return root


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache for this test, with the hub unreachable by configuration."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.mark.parametrize(
    ("source", "repo"),
    [
        ("acme/tiny", ("acme/tiny", None)),
        ("acme/tiny-2.5B@v1.0", ("acme/tiny-2.5B", "v1.0")),
        ("tiny-llama", None),
        ("./acme/tiny", None),
        ("/models/acme", None),
        ("~/models/x", None),
        ("a/b/c", None),
    ],
)
def test_a_repo_id_is_told_from_a_path(source: str, repo: tuple[str, str | None] | None) -> None:
    assert hub_repo(source) == repo


def test_an_existing_directory_is_a_path_even_if_it_looks_like_a_repo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "acme" / "tiny").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert hub_repo("acme/tiny") is None


def test_a_cached_repo_is_its_snapshot(offline_cache: Path, tiny_model_dir: Path) -> None:
    hub_cache(offline_cache, "acme/tiny", tiny_model_dir)
    model = ModelConfig(source="acme/tiny")
    directory = prepare_model(model)
    assert directory == offline_cache / "models--acme--tiny" / "snapshots" / COMMIT
    assert model.directory() == directory
    # The digest is of the files' contents, whichever links lead to them.
    assert model_digest(directory) == model_digest(tiny_model_dir)
    assert prepare_model(ModelConfig(source="acme/tiny@main")) == directory


def test_a_repo_not_in_the_cache_is_refused_naming_the_cache(offline_cache: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        prepare_model(ModelConfig(source="acme/absent"))
    message = str(refused.value)
    assert refused.value.path == "$.model.source"
    assert str(offline_cache) in message and "HF_HUB_OFFLINE is set" in message
    assert "hf download acme/absent" in message


def test_a_job_runs_on_a_model_named_by_its_repo_id(
    tmp_path: Path, offline_cache: Path, tiny_model_dir: Path
) -> None:
    hub_cache(offline_cache, "acme/tiny", tiny_model_dir)
    config_path = tmp_path / "job.toml"
    config_path.write_text(
        """
[job]
steps = 1
prompts_per_step = 2
generations_per_prompt = 2
[task]
kind = "emit_token"
max_tokens = 2
[model]
source = "acme/tiny"
[trainer]
kind = "torch"
threads = 1
[generation]
backend = "transformers"
"""
    )
    out = tmp_path / "run"
    result = run_job(out, load_config(config_path))
    assert result.summary.steps == 1 and audit_run(out).ok
    assert f'digest = "{model_digest(tiny_model_dir)}"' in (out / "job.toml").read_text()
