"""A model directory's weight files, each checked before it is read (issue 24 item 17).

A ``model.safetensors.index.json`` naming ``/dev/zero`` made the digest read for ever,
one naming ``../x`` read outside the model directory, and a ``weight_map`` of ``[]`` was a
traceback. Now a model's files are regular files inside its directory (symlinks resolved),
and a bad index is refused naming the file and the entry.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from rollout_recovery.errors import ConfigError, InvalidStateError
from rollout_recovery.llm._model_source import model_digest
from rollout_recovery.llm._weight_index import INDEX, model_file, weight_file_names

# How long a digest may take on these few small files: far more than enough.
DEADLINE_S = 30.0


def _model(tmp_path: Path, weight_map: object, shards: tuple[str, ...] = ()) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    (directory / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for shard in shards:
        (directory / shard).write_bytes(b"shard " + shard.encode())
    return directory


def _digest_within_deadline(directory: Path) -> str | BaseException:
    """``model_digest(directory)``, or what it raised; fails the test if it hangs."""
    outcome: list[str | BaseException] = []

    def work() -> None:
        try:
            outcome.append(model_digest(directory))
        except BaseException as error:  # handed to the test
            outcome.append(error)

    thread = threading.Thread(target=work, daemon=True)  # a hung read must not hold pytest
    thread.start()
    thread.join(DEADLINE_S)
    assert outcome, f"model_digest still reading after {DEADLINE_S} s"
    return outcome[0]


def _refused(directory: Path, *fragments: str) -> None:
    outcome = _digest_within_deadline(directory)
    assert isinstance(outcome, ConfigError), outcome
    assert outcome.path == "$.model.source"
    for fragment in fragments:
        assert fragment in str(outcome), outcome


def test_a_sharded_model_is_digested_and_its_shards_named_once_each(tmp_path: Path) -> None:
    directory = _model(
        tmp_path,
        {"a": "model-1.safetensors", "b": "model-2.safetensors", "c": "model-1.safetensors"},
        ("model-1.safetensors", "model-2.safetensors"),
    )
    assert weight_file_names(directory) == [INDEX, "model-1.safetensors", "model-2.safetensors"]
    digest = _digest_within_deadline(directory)
    assert isinstance(digest, str) and len(digest) == 64
    (directory / "model-2.safetensors").write_bytes(b"changed")
    assert _digest_within_deadline(directory) != digest


def test_a_shard_named_dev_zero_is_refused_not_read_for_ever(tmp_path: Path) -> None:
    _refused(_model(tmp_path, {"a": "/dev/zero"}), "/dev/zero", "absolute")


def test_a_shard_linked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    directory = _model(tmp_path, {"a": "model-1.safetensors"})
    (directory / "model-1.safetensors").symlink_to("/dev/zero")
    _refused(directory, "model-1.safetensors", "outside the model directory")


def test_a_config_linked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    directory = _model(tmp_path, {"a": "model-1.safetensors"}, ("model-1.safetensors",))
    (directory / "config.json").unlink()
    (directory / "config.json").symlink_to("/dev/zero")
    _refused(directory, "config.json")


@pytest.mark.parametrize("name", ["../secret.safetensors", "sub/../../secret.safetensors"])
def test_a_shard_outside_the_model_directory_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "secret.safetensors").write_bytes(b"not the model's")
    directory = _model(tmp_path, {"a": name})
    (directory / "sub").mkdir()
    _refused(directory, name, "outside the model directory")


def test_a_symlink_out_of_the_model_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret.safetensors").write_bytes(b"not the model's")
    directory = _model(tmp_path, {"a": "model-1.safetensors"})
    (directory / "model-1.safetensors").symlink_to(tmp_path / "secret.safetensors")
    _refused(directory, "outside the model directory")


def test_a_hub_cache_snapshot_reads_its_own_repos_blobs_and_no_others(tmp_path: Path) -> None:
    """The Hugging Face cache keeps a snapshot's files as symlinks into its repo's
    content-addressed ``blobs``: those are the model's files; another repo's are not."""
    repo = tmp_path / "hub" / "models--acme--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for blobs in (repo / "blobs", tmp_path / "hub" / "models--other--x" / "blobs"):
        blobs.mkdir(parents=True)
        (blobs / "b1").write_bytes(b"weights")
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").symlink_to(repo / "blobs" / "b1")
    assert model_file(snapshot, "model.safetensors") == (repo / "blobs" / "b1").resolve()
    assert isinstance(_digest_within_deadline(snapshot), str)
    (snapshot / "model.safetensors").unlink()
    (snapshot / "model.safetensors").symlink_to(
        tmp_path / "hub" / "models--other--x" / "blobs" / "b1"
    )
    _refused(snapshot, "outside the model directory")


def test_a_symlink_within_the_model_directory_is_followed(tmp_path: Path) -> None:
    directory = _model(tmp_path, {"a": "model-1.safetensors"}, ("real.safetensors",))
    (directory / "model-1.safetensors").symlink_to("real.safetensors")
    assert (
        model_file(directory, "model-1.safetensors") == (directory / "real.safetensors").resolve()
    )
    assert isinstance(_digest_within_deadline(directory), str)


def test_a_shard_that_is_a_directory_or_a_fifo_is_refused(tmp_path: Path) -> None:
    directory = _model(tmp_path, {"a": "shards", "b": "pipe"})
    (directory / "shards").mkdir()
    os.mkfifo(directory / "pipe")
    _refused(directory, "not a regular file")


@pytest.mark.parametrize(
    ("weight_map", "fragment"),
    [
        pytest.param([], "weight_map", id="a-list"),
        pytest.param({}, "weight_map", id="empty"),
        pytest.param(None, "weight_map", id="null"),
        pytest.param({"a": 7}, "weight_map", id="a-number"),
        pytest.param({"a": ""}, "weight_map", id="an-empty-name"),
        pytest.param({"a": "x\u0000y"}, "weight_map", id="a-nul"),
        pytest.param({"a": "missing.safetensors"}, "missing.safetensors", id="missing"),
    ],
)
def test_an_index_that_is_not_one_is_refused_naming_what_is_wrong(
    tmp_path: Path, weight_map: object, fragment: str
) -> None:
    directory = _model(tmp_path, weight_map)
    _refused(directory, fragment)
    with pytest.raises(InvalidStateError) as error:
        weight_file_names(directory)
    assert error.value.file is not None


def test_an_index_that_is_not_json_or_too_large_is_refused(tmp_path: Path) -> None:
    directory = _model(tmp_path, {"a": "model-1.safetensors"}, ("model-1.safetensors",))
    (directory / INDEX).write_text("{not json")
    _refused(directory, "not JSON")
    (directory / INDEX).unlink()
    (directory / INDEX).symlink_to("/dev/zero")
    _refused(directory, INDEX)


def test_the_trainer_reads_shards_through_the_same_check(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    import torch
    from safetensors.torch import save_file

    from rollout_recovery.llm._model_files import read_weight_files

    (tmp_path / "secret.safetensors").write_bytes(b"x")
    directory = _model(tmp_path, {"a": "model-1.safetensors", "b": "../secret.safetensors"})
    save_file({"a": torch.zeros(2)}, str(directory / "model-1.safetensors"))
    with pytest.raises(InvalidStateError, match="outside the model directory"):
        read_weight_files(directory)
    (directory / INDEX).write_text(json.dumps({"weight_map": {"a": "model-1.safetensors"}}))
    assert set(read_weight_files(directory)) == {"a"}
