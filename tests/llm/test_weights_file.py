"""``TorchWeights.write_safetensors``: the file a vLLM server loads, cast straight into a
mapped file, is the file ``safetensors_bytes`` builds in memory (what safetensors reads
back: names, dtypes, shapes, values, the version)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load

from rollout_recovery.errors import InvalidArgumentError
from rollout_recovery.llm._weights import TorchWeights

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def written(weights: TorchWeights, dtype: str | None) -> bytes:
    with tempfile.TemporaryFile() as file:
        weights.write_safetensors(file, dtype)
        file.seek(0)
        return file.read()


shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3)


@settings(max_examples=25, deadline=None)
@given(
    tensors=st.dictionaries(
        st.from_regex(r"[a-z]{1,3}(\.[a-z0-9]{1,3}){0,2}", fullmatch=True),
        st.tuples(shapes, st.sampled_from(DTYPES)),
        max_size=6,
    ),
    dtype=st.sampled_from([None, "float32", "bfloat16", "float16"]),
    version=st.integers(0, 10**9),
)
def test_the_mapped_file_is_the_in_memory_one(
    tensors: dict[str, tuple[list[int], torch.dtype]], dtype: str | None, version: int
) -> None:
    generator = torch.Generator().manual_seed(0)
    weights = TorchWeights(
        version,
        {n: torch.randn(s, generator=generator).to(kind) for n, (s, kind) in tensors.items()},
    )
    data, reference = written(weights, dtype), weights.safetensors_bytes(dtype)
    ours, theirs = load(data), load(reference)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype
        assert torch.equal(ours[name], theirs[name])
    assert TorchWeights.from_safetensors_bytes(data).version == version


def test_a_file_reads_back_through_safe_open_as_the_worker_reads_it(tmp_path: Path) -> None:
    weights = TorchWeights(3, {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)})
    path = tmp_path / "w.safetensors"
    with path.open("w+b") as file:
        weights.write_safetensors(file, "bfloat16")
    with safe_open(str(path), framework="pt") as handle:
        assert handle.metadata() == {"weight_version": "3"}
        assert handle.get_tensor("w").dtype == torch.bfloat16
        assert torch.equal(handle.get_tensor("w").float(), weights.tensors["w"])


def test_a_dtype_it_cannot_write_is_refused_before_the_file_is_touched() -> None:
    weights = TorchWeights(0, {"i": torch.arange(3)})
    with tempfile.TemporaryFile() as file:
        with pytest.raises(InvalidArgumentError, match="'i'"):
            weights.write_safetensors(file)
        assert file.tell() == 0 and not file.read()
    with pytest.raises(InvalidArgumentError, match="dtype must be"):
        written(TorchWeights(0, {}), "int8")
