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
    assert reply == {"version": "7", "tensors": 1, "lm_head_repacked": True, "load": "reload"}


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


# -- the direct load, on a fake of vLLM's CPU model: a fused layer packed away, a tied head


def _method(kind: str, calls: list[str], *, removes: bool) -> Any:
    """A quantization method named as vLLM's: processing "packs" the layer's weight
    (a copy, as oneDNN's) and, for a GEMM layer, removes the weight as vLLM on CPU does."""

    def process(layer: Any) -> None:
        calls.append(f"pack {layer.label}")
        packed = layer.weight.detach().clone()
        layer.cpu_linear = lambda: packed
        if removes:
            layer.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)

    return type(kind, (), {"process_weights_after_loading": staticmethod(process)})()


class _Layer(torch.nn.Module):
    def __init__(self, label: str, method: Any, rows: int) -> None:
        super().__init__()
        self.label = label
        self.quant_method = method
        self.weight = torch.nn.Parameter(torch.zeros(rows, 2), requires_grad=False)


class _Model(torch.nn.Module):
    """q, k and v (one row each) load into the fused ``qkv`` by shard, as vLLM's loaders
    do; ``lm_head`` shares the embedding's weight."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.embed = _Layer("embed", _method("UnquantizedEmbeddingMethod", calls, removes=False), 4)
        self.qkv = _Layer("qkv", _method("UnquantizedLinearMethod", calls, removes=True), 3)
        self.lm_head = _Layer("lm_head", self.embed.quant_method, 0)
        self.lm_head.weight = self.embed.weight
        self.qkv.weight.weight_loader = self._load_qkv  # type: ignore[attr-defined]
        self.recorded = {"weight": self.qkv.weight.detach().to("meta")}
        self.recorded["weight"].__class__ = torch.nn.Parameter  # as vLLM records it
        self.recorded["weight"].__dict__ = dict(self.qkv.weight.__dict__)
        for layer in (self.embed, self.qkv):  # start-up: every GEMM packed
            layer.quant_method.process_weights_after_loading(layer)
        self.lm_head.quant_method.process_weights_after_loading(self.lm_head)
        calls.clear()

    def _load_qkv(self, param: Any, loaded: Any, shard: str) -> None:
        param.data["qkv".index(shard)].copy_(loaded[0])

    def load_weights(self, weights: Any) -> set[str]:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            if name in ("q", "k", "v"):
                param = params["qkv.weight"]
                param.weight_loader(param, tensor, name)
            else:
                params[name].data.copy_(tensor)
        return {"embed.weight", "qkv.weight"}


def _direct(module: ModuleType, model: _Model) -> Any:
    def make(meta: Any, layer: Any, device: Any) -> Any:
        tensor = torch.empty(meta.shape, device=device or "cpu")
        tensor.__class__ = meta.__class__
        tensor.__dict__ = dict(meta.__dict__)
        return tensor

    recorded = {model.qkv: model.recorded}
    return module.DirectLoad.plan(
        model, recorded=recorded.get, make=make, is_attention=lambda layer: False
    )


def _weights(scale: float, names: str = "qkv") -> list[tuple[str, Any]]:
    rows = [(name, torch.full((1, 2), scale * (i + 1))) for i, name in enumerate(names)]
    return [("embed.weight", torch.full((4, 2), scale)), *rows]


def test_a_direct_load_packs_a_fused_layer_from_its_shards_and_the_tied_head_once() -> None:
    calls: list[str] = []
    model = _Model(calls)
    own = model.qkv.weight
    direct = _direct(_extension(), model)
    done = direct.load(iter(_weights(2.0)), torch.float32)
    assert done == {"layers_packed": 1, "layers_kept": 0, "embeddings_packed": 1}
    assert calls == ["pack qkv", "pack embed"]
    # The fused layer was packed from all three shards; its own (empty) parameter is back.
    assert model.qkv.cpu_linear().tolist() == [[2.0, 2.0], [4.0, 4.0], [6.0, 6.0]]
    assert model.qkv.weight is own and own.numel() == 0
    # Trap 1: the tied head answers from the new embedding, packed once for both.
    assert model.lm_head.cpu_linear is model.embed.cpu_linear
    assert model.lm_head.cpu_linear().eq(2.0).all()
    # A second version loads the same way (no state kept from the first).
    direct = _direct(_extension(), model)
    direct.load(iter(_weights(3.0)), torch.float32)
    assert model.qkv.cpu_linear()[2].tolist() == [9.0, 9.0]


def test_a_direct_load_missing_a_shard_refuses_and_the_layer_keeps_its_pack() -> None:
    calls: list[str] = []
    model = _Model(calls)
    own, old = model.qkv.weight, model.qkv.cpu_linear
    direct = _direct(_extension(), model)
    with pytest.raises(ValueError, match=r"1 packed layers \(qkv.weight first\) got only part"):
        direct.load(iter(_weights(2.0, names="qk")), torch.float32)
    assert "pack qkv" not in calls
    assert model.qkv.weight is own and model.qkv.cpu_linear is old


def test_a_layer_of_an_unknown_method_leaves_the_load_to_vllms_reload() -> None:
    calls: list[str] = []
    model = _Model(calls)
    model.qkv.quant_method = _method("Fp8LinearMethod", calls, removes=True)
    assert _direct(_extension(), model) is None
    model.qkv.quant_method = _method("UnquantizedLinearMethod", calls, removes=True)
    assert _direct(_extension(), model) is not None
    model.recorded.clear()  # no start-up record of the packed weight
    assert _direct(_extension(), model) is None


def test_a_weight_that_bypasses_its_layers_loader_is_refused_not_lost() -> None:
    """A model copying into the parameter itself would copy into the placeholder (on the
    meta device: nothing happens): vLLM says it loaded the weight, the layer never saw it."""
    calls: list[str] = []
    model = _Model(calls)
    old = model.qkv.cpu_linear
    direct = _direct(_extension(), model)
    with pytest.raises(ValueError, match="went past their loader"):
        direct.load(iter([("qkv.weight", torch.ones(3, 2))]), torch.float32)
    assert model.qkv.cpu_linear is old


def test_a_layer_the_file_has_nothing_for_keeps_its_pack() -> None:
    calls: list[str] = []
    model = _Model(calls)
    old = model.qkv.cpu_linear
    model.load_weights = lambda weights: {"embed.weight"} if list(weights) else set()  # type: ignore[method-assign]
    done = _direct(_extension(), model).load(iter(_weights(2.0, names="")), torch.float32)
    assert done["layers_kept"] == 1 and model.qkv.cpu_linear is old


def test_a_direct_load_after_vllms_reload_unwraps_the_loader_the_reload_left() -> None:
    """vLLM's reload wraps the loaders of the meta tensors it recorded and unwraps only
    its copies: the wrapper left there ignores every call (measured: a direct load after
    a reload packed an unfilled scratch, every logprob then log(1/vocab))."""
    calls: list[str] = []
    model = _Model(calls)
    real = model.recorded["weight"].weight_loader

    def online_process_loader(*args: Any, **kwargs: Any) -> None:
        return None  # outside a reload: "excessive loading", ignored

    online_process_loader.__wrapped__ = real  # type: ignore[attr-defined]
    model.recorded["weight"].weight_loader = online_process_loader
    _direct(_extension(), model).load(iter(_weights(2.0)), torch.float32)
    assert model.qkv.cpu_linear().tolist() == [[2.0, 2.0], [4.0, 4.0], [6.0, 6.0]]


def test_an_untied_head_is_loaded_and_packed_from_its_own_weight() -> None:
    calls: list[str] = []
    model = _Model(calls)
    model.lm_head.weight = torch.nn.Parameter(torch.zeros(4, 2), requires_grad=False)
    weights = [*_weights(2.0), ("lm_head.weight", torch.full((4, 2), 5.0))]
    done = _direct(_extension(), model).load(iter(weights), torch.float32)
    assert done["embeddings_packed"] == 2 and calls == ["pack qkv", "pack embed", "pack lm_head"]
    assert model.lm_head.cpu_linear().eq(5.0).all() and model.embed.cpu_linear().eq(2.0).all()


def test_a_pack_that_fails_raises_its_own_error_and_the_layer_keeps_its_parameters_and_pack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Found by a hostile review: the restore copied the full-size scratch into the
    # packed-away (empty) parameter, so a RuntimeError of sizes masked the pack's error
    # and the layer kept the scratch as its weight.
    calls: list[str] = []
    model = _Model(calls)
    own, old = model.qkv.weight, model.qkv.cpu_linear
    direct = _direct(_extension(), model)

    def out_of_memory(layer: Any) -> None:
        raise MemoryError("oneDNN could not allocate the packed weight")

    monkeypatch.setattr(model.qkv.quant_method, "process_weights_after_loading", out_of_memory)
    with pytest.raises(MemoryError, match="oneDNN"):
        direct.load(iter(_weights(2.0)), torch.float32)
    assert model.qkv.weight is own and own.numel() == 0
    assert model.qkv.cpu_linear is old


def test_a_layer_processed_into_an_unpacked_weight_keeps_its_own_parameter_with_the_new_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # vLLM falls back to an unpacked GEMM when oneDNN refuses a weight, keeping the whole
    # weight: the layer's own (empty) parameter object must take it, not a copy of the
    # wrong size.
    model = _Model([])
    own = model.qkv.weight
    direct = _direct(_extension(), model)

    def keep_unpacked(layer: Any) -> None:
        layer.cpu_linear = lambda: layer.weight

    monkeypatch.setattr(model.qkv.quant_method, "process_weights_after_loading", keep_unpacked)
    direct.load(iter(_weights(2.0)), torch.float32)
    assert model.qkv.weight is own
    assert own.tolist() == [[2.0, 2.0], [4.0, 4.0], [6.0, 6.0]]
