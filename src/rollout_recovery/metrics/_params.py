"""The job's config as a tool's run parameters: flat ``section.field`` keys, plain values.

W&B's run config and MLflow's parameters are flat maps of scalars; the job's config is a
tree of sections. Lists (``[metrics] sinks``, ``[http] servers``) become their JSON text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

__all__ = ["Param", "flat_params"]

Param = str | int | float | bool | None


def flat_params(tree: Mapping[str, object], prefix: str = "") -> dict[str, Param]:
    """``{"job.steps": 30, "metrics.sinks": '["jsonl"]', ...}`` of a nested config."""
    flat: dict[str, Param] = {}
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            flat.update(flat_params(value, f"{key}."))
        elif value is None or isinstance(value, str | int | float | bool):
            flat[key] = value
        else:
            flat[key] = json.dumps(value, default=str)
    return flat
