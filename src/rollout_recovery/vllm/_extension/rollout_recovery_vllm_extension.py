"""Runs inside a vLLM worker: load a weights file in place, with the CPU ``lm_head`` fix.

vLLM imports this module in its worker process (``--worker-extension-cls
rollout_recovery_vllm_extension.WeightLoader``, this directory on ``PYTHONPATH``), where
the project is not installed: it imports nothing from it, only torch and safetensors
(vLLM's own dependencies). Its methods become callable through vLLM's dev route
``POST /collective_rpc`` (``VLLM_SERVER_DEV_MODE=1``), which passes arguments as strings.

:meth:`WeightLoader.rollout_recovery_load` reads one safetensors file written by the job
(checkpoint names, the version in its metadata), loads it with the worker's in-place
``reload_weights``, and then re-packs a tied ``lm_head``: vLLM on CPU packs every GEMM
weight once after loading, ``lm_head`` included; with tied embeddings the file has no
``lm_head.weight``, the reload copies the new embedding in place but never re-packs
``lm_head``, so the logits keep using the old embedding (measured: mean |dlogprob| 1.07).
Re-running the head's ``process_weights_after_loading`` packs the current embedding.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WeightLoader", "repack_tied_lm_head"]

#: The metadata key the job writes the version under (``TorchWeights.write_safetensors``).
VERSION_KEY = "weight_version"


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
    """The tensors of the file at ``path``, refusing a file of another version."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        found = (handle.metadata() or {}).get(VERSION_KEY)
        if found != version:
            raise ValueError(f"{path} holds weight version {found!r}, not {version!r}")
        names: list[str] = list(handle.keys())  # a safe_open handle is not iterable
        return [(name, handle.get_tensor(name)) for name in names]


class WeightLoader:
    """Mixed into vLLM's worker class (``self`` is the worker)."""

    def rollout_recovery_load(self, path: str, version: str) -> dict[str, Any]:
        tensors = read_weights(path, version)
        worker: Any = self
        worker.reload_weights(weights_iterator=iter(tensors), is_checkpoint_format=True)
        repacked = repack_tied_lm_head(worker.model_runner.get_model())
        return {"version": version, "tensors": len(tensors), "lm_head_repacked": repacked}
