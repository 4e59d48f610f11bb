"""The worker extension vLLM imports (``vllm/_extension``), with a fake worker.

The module runs inside vLLM's worker, where the project is not installed: it is loaded
here by its path, as vLLM does through ``PYTHONPATH``. The real worker is exercised by
``tests/integration`` (a hot-loaded server against a fresh one).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from rollout_recovery.vllm._fleet import EXTENSION_CLASS, EXTENSION_DIR
from rollout_recovery.vllm._sync import LOAD_METHOD

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _extension() -> ModuleType:
    module_name, _ = EXTENSION_CLASS.rsplit(".", 1)
    spec = importlib.util.spec_from_file_location(module_name, EXTENSION_DIR / f"{module_name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


class _Head:
    def __init__(self, calls: list[str]) -> None:
        self.quant_method = SimpleNamespace(
            process_weights_after_loading=lambda layer: calls.append("repack lm_head")
        )


def _worker(module: ModuleType, *, tied: bool, calls: list[str]) -> Any:
    model = SimpleNamespace(config=SimpleNamespace(tie_word_embeddings=tied), lm_head=_Head(calls))

    class Worker(getattr(module, EXTENSION_CLASS.rsplit(".", 1)[1])):  # type: ignore[misc]
        model_runner = SimpleNamespace(get_model=lambda: model)

        def reload_weights(self, *, weights_iterator: Any, is_checkpoint_format: bool) -> None:
            names = [name for name, _ in weights_iterator]
            calls.append(f"reload {names} checkpoint={is_checkpoint_format}")

    return Worker()


def _file(tmp_path: Path, version: str) -> Path:
    path = tmp_path / "w.safetensors"
    safetensors_torch.save_file(
        {"model.embed_tokens.weight": torch.ones(4, 2)},
        str(path),
        metadata={"weight_version": version},
    )
    return path


def test_a_load_repacks_a_tied_lm_head_after_the_reload(tmp_path: Path) -> None:
    """Trap 1: without the repack the CPU logits keep the old embedding."""
    calls: list[str] = []
    worker = _worker(_extension(), tied=True, calls=calls)
    reply = getattr(worker, LOAD_METHOD)(str(_file(tmp_path, "7")), "7")
    assert calls == ["reload ['model.embed_tokens.weight'] checkpoint=True", "repack lm_head"]
    assert reply == {"version": "7", "tensors": 1, "lm_head_repacked": True}


def test_an_untied_head_is_left_to_the_reload(tmp_path: Path) -> None:
    calls: list[str] = []
    worker = _worker(_extension(), tied=False, calls=calls)
    reply = getattr(worker, LOAD_METHOD)(str(_file(tmp_path, "7")), "7")
    assert calls == ["reload ['model.embed_tokens.weight'] checkpoint=True"]
    assert reply["lm_head_repacked"] is False


def test_a_file_of_another_version_is_refused_before_anything_loads(tmp_path: Path) -> None:
    calls: list[str] = []
    worker = _worker(_extension(), tied=True, calls=calls)
    with pytest.raises(ValueError, match="holds weight version '6', not '7'"):
        getattr(worker, LOAD_METHOD)(str(_file(tmp_path, "6")), "7")
    assert calls == []


def test_the_extension_imports_nothing_of_the_project() -> None:
    source = (EXTENSION_DIR / "rollout_recovery_vllm_extension.py").read_text()
    assert "rollout_recovery." not in source.replace("rollout_recovery_vllm", "")
    assert "from ." not in source
