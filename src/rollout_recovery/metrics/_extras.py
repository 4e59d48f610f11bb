"""The optional packages behind the tool sinks, imported only when a sink is opened."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Final

from ..errors import ConfigError

__all__ = ["EXTRAS", "require"]

#: sink name -> (the pyproject extra that installs it, the module it needs).
EXTRAS: Final[dict[str, tuple[str, str]]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}


def require(sink: str, module: str | None = None) -> ModuleType:
    """Import the package sink ``sink`` needs (or its ``module``), or say which extra to
    install: a ConfigError at ``$.metrics.sinks``, raised before anything is written."""
    extra, top = EXTRAS[sink]
    try:
        return importlib.import_module(module or top)
    except ImportError as exc:
        raise ConfigError(
            f"metrics sink {sink!r} needs the [{extra}] extra: "
            f"pip install 'rollout-recovery[{extra}]' ({exc})",
            path="$.metrics.sinks",
        ) from exc
