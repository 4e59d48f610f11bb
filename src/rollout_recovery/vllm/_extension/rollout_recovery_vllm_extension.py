"""Runs inside a vLLM worker: load a weights file in place, with the CPU ``lm_head`` fix.

vLLM imports this module in its worker process (``--worker-extension-cls
rollout_recovery_vllm_extension.WeightLoader``, this directory on ``PYTHONPATH``), where
the project is not installed: it imports nothing from it, only torch, safetensors and
vLLM. Its methods become callable through vLLM's dev route ``POST /collective_rpc``
(``VLLM_SERVER_DEV_MODE=1``), which passes arguments as strings.

:meth:`WeightLoader.rollout_recovery_load` reads one safetensors file written by the job
(checkpoint names, the version in its metadata; the tensors view the file's mapping, no
copy) and loads it in one of two ways:

- **direct** (:class:`DirectLoad`, vLLM 0.32 on CPU, one worker, unquantized): vLLM's
  own ``model.load_weights`` (its name mapping and its loaders for fused ``qkv_proj`` /
  ``gate_up_proj``) copies every weight straight into the live parameter where one
  exists (norms, embeddings); a GEMM weight, which vLLM on CPU packed for oneDNN and
  removed from its layer, is loaded into a scratch tensor of the layer's checkpoint
  shape, packed the moment its last shard arrives (the layer's own
  ``process_weights_after_loading``, as at start-up) and freed, so at most a layer's
  worth of scratch lives at a time and the allocator reuses it. Then every embedding
  method is packed again, a tied ``lm_head`` included (trap 1, see below), once for a
  weight two modules share. SmolLM2-135M fp32 (538 MB, 2026-12-06, loaded 2-core
  machine, ``benchmarks/bench_weight_push.py --pushes 5 --dtype float32``): the load
  request 0.51 s at the median against 0.69 s through vLLM's reload. A cProfile of one
  direct load in the worker: 0.23 s oneDNN packing (120 GEMM layers and the tied head,
  one 113 MB pack fewer than the reload's), 0.09 s copies;
- **reload** (everything else: another platform, tensor or pipeline parallel workers,
  quantization, LoRA, a layer of another kind; or asked for: the call's third argument
  ``"reload"``, or ``ROLLOUT_RECOVERY_VLLM_LOAD=reload`` in the server's environment):
  the worker's in-place ``reload_weights``, whose layerwise machinery buffers each
  layer's loads, builds the layer anew, packs it and copies it back into the old
  tensors; then the tied ``lm_head`` re-pack. vLLM on CPU packs every GEMM weight once
  after loading, ``lm_head`` included; with tied embeddings the file has no
  ``lm_head.weight``, the reload copies the new embedding in place but never re-packs
  ``lm_head``, so the logits keep using the old embedding (measured: mean |dlogprob|
  1.07). Re-running the head's ``process_weights_after_loading`` packs the current
  embedding.

Both leave the server as a fresh one started on the file's weights would be (the
real-vLLM test compares tokens and logprobs bit for bit). No tensor of the file outlives
the call (the packed weights are oneDNN's copies): the job may reuse the file's pages for
a later version once the push is done.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["DirectLoad", "WeightLoader", "read_weights", "repack_tied_lm_head"]

#: The metadata key the job writes the version under (``TorchWeights.write_safetensors``).
VERSION_KEY = "weight_version"
#: Set to ``reload`` in the server's environment to always take vLLM's reload.
LOAD_ENV = "ROLLOUT_RECOVERY_VLLM_LOAD"
# vLLM's quantization methods a direct load knows: the unquantized ones.
_LINEAR_METHOD = "UnquantizedLinearMethod"
_EMBEDDING_METHOD = "UnquantizedEmbeddingMethod"
# The name of vLLM 0.32's layerwise reload's loader wrapper (``reload/layerwise.py``).
_LAYERWISE_WRAPPER = "online_process_loader"


def repack_tied_lm_head(model: Any) -> bool:
    """Re-pack ``model.lm_head`` from the current embedding if the two are tied.

    Returns whether it did. A model without tied embeddings loads ``lm_head.weight``
    from the file like any other weight and is re-packed by the reload itself.
    """
    config = getattr(model, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return False
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if head is None or method is None:
        return False
    method.process_weights_after_loading(head)
    return True


def read_weights(path: str, version: str) -> list[tuple[str, Any]]:
    """The tensors of the file at ``path`` (views of its mapping), refusing a file of
    another version."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        found = (handle.metadata() or {}).get(VERSION_KEY)
        if found != version:
            raise ValueError(f"{path} holds weight version {found!r}, not {version!r}")
        names: list[str] = list(handle.keys())  # a safe_open handle is not iterable
        return [(name, handle.get_tensor(name)) for name in names]


class _Staged:
    """One packed GEMM layer during a direct load: its own parameter objects (put back
    after the load), the placeholder vLLM's loaders are handed, the scratch tensor they
    fill (made at the first shard), and how many elements have arrived."""

    def __init__(self, layer: Any, name: str, meta: Any, make: Callable[[Any, Any], Any]) -> None:
        self.layer = layer
        self.name = name  # the weight's name in the model
        self.meta = meta  # the weight as vLLM recorded it before packing, on meta
        self.make = make  # (meta, device) -> a tensor of its class, loaders bound to layer
        self.live = dict(layer._parameters)
        self.scratch: Any = None
        self.loaded = 0
        self.packed = False

    @property
    def expected(self) -> int:
        # vLLM's own count of a weight's checkpoint elements (padding left out).
        return int(getattr(self.meta, "weight_loader_numel", self.meta.numel()))


class DirectLoad:
    """A direct load (module docstring) into ``model``; :meth:`plan` says whether one
    can be made.

    What it needs of vLLM is injected, so its bookkeeping is testable without vLLM:
    ``recorded(layer)`` gives a layer's parameters as vLLM recorded them at start-up
    before packing (meta tensors of their class, shape and loaders), or None;
    ``make(meta, layer, device)`` makes a tensor of a recorded parameter's class and
    attributes on ``device``, its loaders bound to ``layer``; ``is_attention(layer)``
    says whether vLLM processes the layer after all others, with ``act_dtype``."""

    def __init__(
        self, model: Any, staged: list[_Staged], embeddings: list[Any], attention: list[Any]
    ) -> None:
        self._model = model
        self._staged = staged
        self._embeddings = embeddings
        self._attention = attention

    @classmethod
    def plan(
        cls,
        model: Any,
        *,
        recorded: Callable[[Any], dict[str, Any] | None],
        make: Callable[[Any, Any, Any], Any],
        is_attention: Callable[[Any], bool],
    ) -> DirectLoad | None:
        """The load for ``model``, or None where a layer is of a kind it does not know
        (the caller then takes vLLM's reload)."""
        staged: list[_Staged] = []
        embeddings: list[Any] = []
        attention: list[Any] = []
        for prefix, layer in model.named_modules():
            if is_attention(layer):
                attention.append(layer)
                continue
            method = getattr(layer, "quant_method", None)
            if method is None:
                continue
            kind = type(method).__name__
            if kind == _EMBEDDING_METHOD:
                embeddings.append(layer)
            elif kind == _LINEAR_METHOD:
                params = recorded(layer)
                if params is None or "weight" not in params or layer._buffers:
                    return None
                for name, param in layer._parameters.items():
                    # Only the weight may have been packed away; vLLM records no bias
                    # (it stays live and loads in place, in its reload too).
                    if name == "weight" or param is None:
                        continue
                    if param.shape != params[name].shape if name in params else param.is_meta:
                        return None
                name = f"{prefix}.weight" if prefix else "weight"
                staged.append(_Staged(layer, name, params["weight"], _bound(make, layer)))
            else:
                return None  # quantized, or a method this load does not know
        return cls(model, staged, embeddings, attention)

    def load(self, weights: Iterable[tuple[str, Any]], act_dtype: Any) -> dict[str, int]:
        """Load ``weights`` (checkpoint names) into the model with vLLM's
        ``model.load_weights``; what it packed, counted. A packed layer whose shards did
        not all arrive is an error (its scratch would be packed half filled), raised once
        every layer has its own parameters back."""
        for stage in self._staged:
            stage.layer.register_parameter("weight", self._placeholder(stage))
        try:
            named = self._model.load_weights(weights)
        finally:
            # Every layer gets its own parameters back, even if one of them cannot.
            failed: BaseException | None = None
            for stage in self._staged:
                stage.scratch = None
                try:
                    self._restore(stage)
                except BaseException as error:  # re-raised below
                    failed = failed or error
            if failed is not None:
                raise failed
        # vLLM names what it loaded: one of those that never reached its layer's loader
        # (copied by the model into the placeholder, on the meta device) is lost.
        loaded = set(named) if isinstance(named, (set, list, tuple)) else set()
        unfilled = [s for s in self._staged if not s.packed and (s.loaded or s.name in loaded)]
        if unfilled:
            raise ValueError(
                f"{len(unfilled)} packed layers ({unfilled[0].name} first) got only part of "
                "their weight from the file, or it went past their loader: they keep their "
                "old weights"
            )
        packs = self._pack_embeddings()
        for layer in self._attention:
            layer.process_weights_after_loading(act_dtype)  # as vLLM's reload does
        packed = sum(s.packed for s in self._staged)
        # Layers the file had nothing for keep theirs, as in vLLM's reload.
        return {
            "layers_packed": packed,
            "layers_kept": len(self._staged) - packed,
            "embeddings_packed": packs,
        }

    def _placeholder(self, stage: _Staged) -> Any:
        """A meta parameter whose loader fills the stage's scratch tensor instead, and
        packs the layer once the last element arrived."""
        holder = stage.make(stage.meta, "meta")
        original = _unwrapped(holder.weight_loader)  # the layer's own, bound to it

        def load_shard(param: Any, loaded_weight: Any, *args: Any, **kwargs: Any) -> Any:
            if stage.packed:
                return None  # loaded twice: vLLM's layerwise reload ignores it too
            if stage.scratch is None:
                stage.scratch = stage.make(stage.meta, None)
            layer = stage.layer
            layer.register_parameter("weight", stage.scratch)  # a loader may look there
            try:
                returned = original(stage.scratch, loaded_weight, *args, **kwargs)
            finally:
                layer.register_parameter("weight", holder)
            stage.loaded += int(loaded_weight.numel())
            if stage.loaded >= stage.expected:
                self._pack(stage)
            return returned

        holder.weight_loader = load_shard
        return holder

    def _pack(self, stage: _Staged) -> None:
        """Pack the stage's layer from its scratch, as vLLM does at start-up, then put
        its own parameters back and drop the scratch (its memory goes back to the
        allocator, for the next layer)."""
        layer = stage.layer
        layer.register_parameter("weight", stage.scratch)
        if hasattr(layer, "_already_called_process_weights_after_loading"):
            delattr(layer, "_already_called_process_weights_after_loading")
        try:
            layer.quant_method.process_weights_after_loading(layer)
            if hasattr(layer, "update_param_tp_status"):
                layer.update_param_tp_status()
        except BaseException:
            # Packing failed (e.g. out of memory): the layer's own parameters go back
            # untouched, nothing copied in (the scratch is no processed weight), and the
            # error is the load's, not masked by a copy of the wrong size.
            for name, live in stage.live.items():
                layer.register_parameter(name, live)
            stage.scratch = None
            raise
        stage.packed = True
        self._restore(stage)
        stage.scratch = None

    @staticmethod
    def _restore(stage: _Staged) -> None:
        """Put the layer's own parameter objects back, with what processing made of
        them copied in (an empty tensor where the weight was packed away), as vLLM's
        reload does: whatever holds a reference to one keeps a valid one."""
        layer = stage.layer
        for name, live in stage.live.items():
            current = layer._parameters.get(name)
            if current is not None and current is not live and not current.is_meta:
                if current.shape == live.shape:
                    live.data.copy_(current)
                else:
                    # Processing kept a weight of another size than the live one (vLLM
                    # falls back to an unpacked GEMM when oneDNN refuses, keeping the
                    # whole weight): the live parameter takes its data.
                    live.data = current.data
            layer.register_parameter(name, live)

    def _pack_embeddings(self) -> int:
        """Pack every embedding method's weight again (trap 1: a tied ``lm_head``
        included); a module sharing its weight, and no bias, with one packed already
        takes that one's GEMM (the same weight packs the same)."""
        done: dict[int, Any] = {}
        packs = 0
        for layer in self._embeddings:
            weight = layer._parameters.get("weight")
            key = (
                id(weight) if weight is not None and getattr(layer, "bias", None) is None else None
            )
            twin = done.get(key) if key is not None else None
            if twin is not None and hasattr(twin, "cpu_linear"):
                layer.cpu_linear = twin.cpu_linear
                continue
            layer.quant_method.process_weights_after_loading(layer)
            packs += 1
            if key is not None:
                done[key] = layer
        return packs


def _unwrapped(loader: Callable[..., Any]) -> Callable[..., Any]:
    """The loader under vLLM's layerwise wrappers. vLLM's reload wraps the loader of the
    very meta tensors it recorded at start-up and unwraps only its copies: after one
    reload, a recorded loader is a wrapper that ignores every call outside a reload."""
    while getattr(loader, "__name__", "") == _LAYERWISE_WRAPPER:
        loader = loader.__wrapped__  # type: ignore[attr-defined]
    return loader


def _bound(make: Callable[[Any, Any, Any], Any], layer: Any) -> Callable[[Any, Any], Any]:
    return lambda meta, device: make(meta, layer, device)


def _vllm_direct_load(worker: Any, model: Any) -> DirectLoad | None:
    """A :class:`DirectLoad` for the worker's model, with vLLM 0.32's parts; None where
    vLLM's reload must do (see the module docstring)."""
    if os.environ.get(LOAD_ENV) == "reload":
        return None
    try:
        import torch
        from vllm.model_executor.layers.attention import is_deferred_attention_layer
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
        from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs
        from vllm.platforms import current_platform
    except ImportError:  # another vLLM: its reload knows its own parts
        return None
    config = worker.vllm_config
    parallel = config.parallel_config
    if (
        not current_platform.is_cpu()
        or parallel.tensor_parallel_size != 1
        or parallel.pipeline_parallel_size != 1
        or config.lora_config is not None
        or config.model_config.quantization is not None
        or getattr(model, "_do_torchao_reload", False)
    ):
        return None

    def recorded(layer: Any) -> dict[str, Any] | None:
        info = LAYERWISE_INFO.get(layer)
        return None if info is None else dict(info.restore_metadata[0])

    def make(meta: Any, layer: Any, device: Any) -> Any:
        # vLLM's own materialization (reload/meta.py), on the layer's recorded device.
        info = LAYERWISE_INFO[layer]
        tensor = torch.empty_strided(
            tuple(meta.size()),
            tuple(meta.stride()),
            dtype=meta.dtype,
            device=device or info.restore_device,
            requires_grad=False,
        )
        tensor.__class__ = meta.__class__
        tensor.__dict__ = dict(meta.__dict__)
        return restore_layer_refs(tensor, layer)

    return DirectLoad.plan(
        model, recorded=recorded, make=make, is_attention=is_deferred_attention_layer
    )


class WeightLoader:
    """Mixed into vLLM's worker class (``self`` is the worker)."""

    def rollout_recovery_load(self, path: str, version: str, how: str = "auto") -> dict[str, Any]:
        """Load the file at ``path`` if it holds ``version``; ``how`` is ``"auto"`` (the
        direct load where it can be made) or ``"reload"`` (vLLM's reload). The reply says
        which one loaded (``load``)."""
        if how not in ("auto", "reload"):
            raise ValueError(f"how must be 'auto' or 'reload', got {how!r}")
        tensors = read_weights(path, version)
        worker: Any = self
        model = worker.model_runner.get_model()
        direct = None if how == "reload" else _vllm_direct_load(worker, model)
        if direct is None:
            worker.reload_weights(weights_iterator=iter(tensors), is_checkpoint_format=True)
            repacked = repack_tied_lm_head(model)
            return {
                "version": version,
                "tensors": len(tensors),
                "lm_head_repacked": repacked,
                "load": "reload",
            }
        import torch
        from vllm.config import set_current_vllm_config

        with torch.no_grad(), set_current_vllm_config(worker.vllm_config):
            done = direct.load(iter(tensors), worker.vllm_config.model_config.dtype)
        runner = worker.model_runner
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            if callable(getattr(runner, reset, None)):  # what vLLM's reload_weights resets
                getattr(runner, reset)()
        return {"version": version, "tensors": len(tensors), "load": "direct", **done}
