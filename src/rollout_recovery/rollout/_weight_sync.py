"""How a generation server learns the trainer's weights, and how it says which it holds.

- :class:`PolicyWeightSync` (``rollout-recovery serve``): ``POST /update_weights`` with the
  numpy policy's parameters and version; the reply names the version now loaded.
- :class:`VersionTagSync` (vLLM in dev mode, ``VLLM_SERVER_DEV_MODE=1``): the weights stay as
  they are (loading real weights into vLLM is the trainer's business, through NCCL or a
  checkpoint path); ``POST /update_weight_version`` tags the server with the version so its
  generate route reports per-token version spans.
- :class:`NoWeightSync`: a server with fixed weights and no version routes. Every server then
  counts as current and calls are stamped with the dispatch version only.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import httpx

from ..errors import InvalidArgumentTypeError
from ..policy import PolicySnapshot

__all__ = [
    "WEIGHT_SYNCS",
    "NoWeightSync",
    "PolicyWeightSync",
    "VersionTagSync",
    "WeightSync",
    "WeightSyncName",
    "parse_version",
]

WeightSyncName = Literal["policy", "version-tag", "none"]


class WeightSync(Protocol):
    name: WeightSyncName
    # False: servers hold whatever they hold and are always treated as current.
    tracks_versions: bool

    async def push(
        self, client: httpx.AsyncClient, url: str, version: int, weights: object, timeout: float
    ) -> int | None:
        """Load ``weights`` as ``version`` on the server at ``url``; return the version the
        server now reports. Raises ``httpx.HTTPError`` when the server cannot be reached
        or refuses."""
        ...


def parse_version(value: object) -> int | None:
    """A version as servers render it (``7``, ``"7"``, ``"step-7"``) as our int, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        digits = value.removeprefix("step-")
        if digits.isdigit():
            return int(digits)
    return None


def _reported(response: httpx.Response) -> int | None:
    response.raise_for_status()
    body: Any = response.json()
    if isinstance(body, dict):
        return parse_version(body.get("weight_version", body.get("version")))
    return None


class PolicyWeightSync:
    """Pushes :class:`~rollout_recovery.policy.PolicySnapshot` parameters as JSON."""

    name: WeightSyncName = "policy"
    tracks_versions = True

    async def push(
        self, client: httpx.AsyncClient, url: str, version: int, weights: object, timeout: float
    ) -> int | None:
        if not isinstance(weights, PolicySnapshot):
            raise InvalidArgumentTypeError(
                f"the policy weight sync pushes PolicySnapshot weights, got "
                f"{type(weights).__name__}"
            )
        params = {name: array.tolist() for name, array in weights.params.items()}
        response = await client.post(
            f"{url}/update_weights", json={"version": version, "params": params}, timeout=timeout
        )
        return _reported(response)


class VersionTagSync:
    """Tags a vLLM server (dev mode) with the version; its weights are not touched."""

    name: WeightSyncName = "version-tag"
    tracks_versions = True

    async def push(
        self, client: httpx.AsyncClient, url: str, version: int, weights: object, timeout: float
    ) -> int | None:
        response = await client.post(
            # vLLM takes the version as a string (an int is a 400).
            f"{url}/update_weight_version",
            json={"new_version": str(version)},
            timeout=timeout,
        )
        response.raise_for_status()
        info = await client.get(f"{url}/weight_info", timeout=timeout)
        return _reported(info)


class NoWeightSync:
    name: WeightSyncName = "none"
    tracks_versions = False

    async def push(
        self, client: httpx.AsyncClient, url: str, version: int, weights: object, timeout: float
    ) -> int | None:
        return version


WEIGHT_SYNCS: dict[WeightSyncName, WeightSync] = {
    "policy": PolicyWeightSync(),
    "version-tag": VersionTagSync(),
    "none": NoWeightSync(),
}
