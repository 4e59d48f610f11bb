"""``rollout-recovery export DIR OUT`` (issue 27 item 5): the trained model as a Hugging
Face directory that ``AutoModelForCausalLM.from_pretrained`` loads, with tensors equal to
the checkpoint's, the tokenizer beside it, and generation working."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from dataset_support import dataset_job_toml, write_dataset, write_reward
from safetensors.torch import load as load_safetensors

from rollout_recovery.cli._main import cli
from rollout_recovery.control import load_config
from rollout_recovery.job import run_job
from rollout_recovery.rundir import CheckpointStore


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Path:
    """Two steps of the dataset task with a reward that always differs between siblings
    (the completion's length), so every step moves the weights."""
    directory = tmp_path_factory.mktemp("export")
    data = write_dataset(directory, "jsonl")
    reward = write_reward(directory, "def score(completion):\n    return len(completion)\n")
    toml = dataset_job_toml(
        data=data,
        reward=f"{reward}:score",
        model_cache=model_cache,
        steps=2,
        prompts=2,
        extra="",
    ).replace("keep = 2", "keep = 5")
    config = directory / "job.toml"
    config.write_text(toml)
    out = directory / "run"
    run_job(out, load_config(config))
    return out


def _export(*args: str) -> Any:
    return CliRunner().invoke(cli, ["export", *args], catch_exceptions=False)


def _checkpoint_weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    (checkpoint,) = [c for c in CheckpointStore(run, keep=1).committed() if c.step == step]
    return dict(load_safetensors((checkpoint.directory / "trainer.model.safetensors").read_bytes()))


def test_the_export_loads_with_transformers_equal_to_the_checkpoint_and_generates(
    trained: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "model"
    result = _export(str(trained), str(out))
    assert result.exit_code == 0, result.output
    assert "exported checkpoint step_000002" in result.output
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    model = AutoModelForCausalLM.from_pretrained(str(out))
    expected = _checkpoint_weights(trained, 2)
    state = model.state_dict()
    for name, tensor in expected.items():
        assert state[name].dtype == torch.float32
        assert torch.equal(state[name], tensor), name
    # The weights are the trained ones, not the base model's.
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).state_dict()
    assert any(not torch.equal(base[name], tensor) for name, tensor in expected.items())
    # Tied embeddings stay tied; the tokenizer and its chat template come along.
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    generated = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] == ids["input_ids"].shape[1] + 4
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"


def test_an_older_checkpoint_and_another_dtype(trained: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "step1"
    assert _export(str(trained), str(out), "--step", "1", "--dtype", "bfloat16").exit_code == 0
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype="auto")
    state = model.state_dict()
    for name, tensor in _checkpoint_weights(trained, 1).items():
        assert state[name].dtype == torch.bfloat16
        assert torch.equal(state[name], tensor.to(torch.bfloat16)), name


def test_the_export_has_the_modes_of_a_plain_directory(trained: Path, tmp_path: Path) -> None:
    """Published from owner-only temporaries, the model still gets the umask's modes (an
    export is served, often by another user), under a usual and a strict umask."""
    for mask in (0o022, 0o077):
        previous = os.umask(mask)
        try:
            out = tmp_path / f"model-{mask:o}"
            assert _export(str(trained), str(out)).exit_code == 0
        finally:
            os.umask(previous)
        assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
        files = [path for path in out.iterdir() if path.is_file()]
        assert any(path.name == "model.safetensors" for path in files)
        assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in files} == {
            path.name: 0o666 & ~mask for path in files
        }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--step", "7"], "no committed checkpoint at step 7 (it has: 2, 1, 0)"),
    ],
)
def test_a_missing_step_is_refused(
    trained: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    result = _export(str(trained), str(tmp_path / "x"), *args)
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "x").exists()


def test_an_existing_output_is_not_overwritten(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = _export(str(trained), str(out))
    assert result.exit_code == 2 and "is not an empty directory" in result.output
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_a_numpy_run_and_a_non_run_are_refused(
    tmp_path: Path, finished_run: tuple[Path, Any]
) -> None:
    numpy = _export(str(finished_run[0]), str(tmp_path / "a"))
    assert numpy.exit_code == 2 and 'export is for [trainer] kind = "torch" runs' in numpy.output
    nothing = _export(str(tmp_path), str(tmp_path / "b"))
    assert nothing.exit_code == 2 and "not a rollout-recovery run directory" in nothing.output
