"""The served weights: one current snapshot, replaced atomically and never moved backwards.

A generation request takes the current snapshot once, when it is admitted, and samples
from it to the end, so a weight update never changes a request in flight; every request
admitted after an update's response uses the new snapshot.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import numpy as np

from .._bounds import INT64_MAX
from ..errors import InvalidArgumentError
from ..policy import PolicySnapshot
from ._api_error import ApiError, bad_request, schema_error, shown

__all__ = ["WeightStore", "parse_version_label", "parse_weight_update"]

# The policy's parameter tables: what a weight push must hold, by name and shape.
_SHAPES = PolicySnapshot.param_shapes


def _same_params(a: PolicySnapshot, b: PolicySnapshot) -> bool:
    return all(np.array_equal(a.params[name], b.params[name]) for name in _SHAPES)


class WeightStore:
    """The current :class:`PolicySnapshot`, behind a lock.

    Versions only move forwards: a lower version is a 409, and so is the current version
    with other params (two policies under one version would make the trainer's importance
    ratios wrong). The current version with the same params is accepted as a no-op, so a
    weight push whose answer was lost can simply be repeated.
    """

    def __init__(self, snapshot: PolicySnapshot) -> None:
        self._lock = threading.Lock()
        self._snapshot = snapshot

    def current(self) -> PolicySnapshot:
        with self._lock:
            return self._snapshot

    def load(self, snapshot: PolicySnapshot) -> None:
        """Serve ``snapshot`` from now on; a 409 when it would move the version backwards."""
        with self._lock:
            self._check_order(snapshot)
            self._snapshot = snapshot

    def relabel(self, version: int) -> PolicySnapshot:
        """Serve the current params under ``version`` (vLLM's metadata-only version change)."""
        with self._lock:
            relabelled = PolicySnapshot(version, self._snapshot.params)
            self._check_order(relabelled)
            self._snapshot = relabelled
            return relabelled

    def _check_order(self, snapshot: PolicySnapshot) -> None:
        current = self._snapshot
        if snapshot.version < current.version:
            raise ApiError(
                HTTPStatus.CONFLICT,
                f"weight version {snapshot.version} is older than the served version "
                f"{current.version}; versions only move forwards",
                param="version",
            )
        if snapshot.version == current.version and not _same_params(snapshot, current):
            raise ApiError(
                HTTPStatus.CONFLICT,
                f"weight version {snapshot.version} is already served with other params; "
                "a new policy needs a new version",
                param="version",
            )


def _version(value: object, *, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64_MAX:
        raise bad_request(
            f"{param} must be an int in [0, {INT64_MAX}], got {shown(value)}", param=param
        )
    return value


def _check_nested(value: object, shape: tuple[int, ...], path: str, param: str) -> None:
    """Refuse anything but a nested list of finite numbers with exactly ``shape``."""
    if not shape:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise bad_request(
                f"param {param!r} must hold finite numbers; {path} is {shown(value)}",
                param=f"params.{param}",
            )
        return
    if not isinstance(value, list) or len(value) != shape[0]:
        found = f"{len(value)} entries" if isinstance(value, list) else type(value).__name__
        raise bad_request(
            f"param {param!r} must be a nested list of shape {list(_SHAPES[param])}; "
            f"{path} must be a list of {shape[0]}, got {found}",
            param=f"params.{param}",
        )
    for index, item in enumerate(value):
        _check_nested(item, shape[1:], f"{path}[{index}]", param)


def parse_weight_update(body: Mapping[str, Any]) -> PolicySnapshot:
    """A ``POST /update_weights`` body ``{"version", "params"}`` as a snapshot; 400 if bad."""
    version = _version(body.get("version"), param="version")
    params = body.get("params")
    if not isinstance(params, dict):
        raise bad_request(
            f"params must be an object of {sorted(_SHAPES)}, got {type(params).__name__}",
            param="params",
        )
    for name in params:
        if name not in _SHAPES:
            raise bad_request(
                f"param {shown(name)} is not a param of the policy (it has {sorted(_SHAPES)})",
                param=f"params.{name}",
            )
    arrays = {}
    for name, shape in _SHAPES.items():
        if name not in params:
            raise bad_request(f"param {name!r} is missing", param=f"params.{name}")
        _check_nested(params[name], shape, f"$.params.{name}", name)
        arrays[name] = np.array(params[name], dtype=np.float64)
    try:
        return PolicySnapshot(version, arrays)
    except InvalidArgumentError as error:  # pragma: no cover - the checks above are stricter
        raise bad_request(str(error), param="params") from None


def parse_version_label(value: object) -> int:
    """``new_version`` of ``POST /update_weight_version`` as this server's int version.

    vLLM takes any string (and refuses anything else, as a schema error); this server's
    weights are numbered, so the string must be a decimal version number too.
    """
    if value is None:
        raise schema_error("Field required", field="new_version")
    if not isinstance(value, str):
        raise schema_error(
            f"Input should be a valid string, got {type(value).__name__} {shown(value)}",
            field="new_version",
        )
    if not value.isascii() or not value.isdigit() or len(value) > len(str(INT64_MAX)):
        raise bad_request(
            f"new_version must be a decimal version number for this server (its weights "
            f"are numbered 0, 1, ...), got {shown(value)}",
            param="new_version",
        )
    return _version(int(value), param="new_version")
