"""How a generation server learns the trainer's weights, and how it says which it holds.

- :class:`PolicyWeightSync` (``rollout-recovery serve``): ``POST /update_weights`` with the
  numpy policy's parameters and version; the reply names the version now loaded.
- :class:`VersionTagSync` (vLLM in dev mode, ``VLLM_SERVER_DEV_MODE=1``): the weights stay as
  they are (loading real weights into vLLM is the trainer's business, through NCCL or a
  checkpoint path); ``POST /update_weight_version`` tags the server with the version so its
  generate route reports per-token version spans.
- :class:`NoWeightSync`: a server with fixed weights and no version routes. Every server then
  counts as current and calls are stamped with the dispatch version only.
- ``"vllm"``: real weights loaded into a running vLLM server (``rollout_recovery.vllm``).
  It needs the job's weights directory, so the job builds it; it is not in
  :data:`WEIGHT_SYNCS`.

A sync is *exclusive* when a server may switch weights under a call in flight (vLLM
does, silently, unless it is paused): the pool then gives a server no call while a push
to it is pending and starts the push only once the server's calls have ended.

A sync that *prepares* (:class:`PreparingWeightSync`: ``vllm``, which writes a weights
file once per version) does a push's local work first: the pool calls ``prepare`` before
it stops a server's calls, so the exclusive part of a push is only the exchange with the
server.

A sync that can *interrupt* (:class:`InterruptingWeightSync`: ``policy`` and ``vllm``)
also loads weights under calls in flight on purpose, for ``[generation] on_weight_update
= "interrupt"``: ``/pause?mode=keep`` (calls stop between two tokens and keep their
state), load, ``/resume`` (always): the calls go on under the new weights and their
replies' ``weight_versions`` spans say which tokens each version generated. The pool then
neither drains a server nor waits for its calls.

A reply is read streamed under a small cap and decoded with msgspec; one that is too
large, not JSON or of another shape reports no version (the pool then counts the push as
failed), never an exception. The pool puts a total deadline around each push.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import httpx
import msgspec

from .._http import parse_version
from ..policy import PolicySnapshot
from ._wire import DataFailure, read_body

__all__ = [
    "WEIGHT_SYNCS",
    "InterruptingWeightSync",
    "NoWeightSync",
    "PolicyWeightSync",
    "PreparingWeightSync",
    "TimedWeightSync",
    "VersionTagSync",
    "WeightSync",
    "WeightSyncName",
]

# What a sync pushes. Contravariant: a sync that ignores the weights (``object``) serves
# any trainer; the policy sync only one of ``PolicySnapshot``.
Weights_contra = TypeVar("Weights_contra", contravariant=True)

WeightSyncName = Literal["policy", "version-tag", "none", "vllm"]

# What a version route's reply may weigh: it names one version.
_REPLY_CAP = 64 * 2**10


class WeightSync(Protocol[Weights_contra]):
    # Read-only: a sync of one kind (vLLM's) may name its literal alone.
    @property
    def name(self) -> WeightSyncName: ...

    # False: servers hold whatever they hold and are always treated as current.
    tracks_versions: bool
    # True: a load may change the weights under a call in flight, so a server is drained
    # (no new call, in-flight calls ended) before each push and gets calls only when it
    # holds the current version.
    exclusive: bool

    async def push(
        self,
        client: httpx.AsyncClient,
        url: str,
        version: int,
        weights: Weights_contra,
        timeout: float,
    ) -> int | None:
        """Load ``weights`` as ``version`` on the server at ``url``; return the version the
        server now reports. Raises ``httpx.HTTPError`` when the server cannot be reached
        or refuses."""
        ...


@runtime_checkable
class InterruptingWeightSync(Protocol[Weights_contra]):
    """Optional: a sync that loads weights while the server's calls are paused between
    tokens (``/pause?mode=keep``, load, ``/resume``), so the calls go on under them."""

    async def push_keeping_calls(
        self,
        client: httpx.AsyncClient,
        url: str,
        version: int,
        weights: Weights_contra,
        timeout: float,
    ) -> int | None:
        """As ``WeightSync.push``, but calls in flight are paused, not waited for, and
        resumed after the load (also after a failed one)."""
        ...


@runtime_checkable
class PreparingWeightSync(Protocol[Weights_contra]):
    """Optional: a sync with local work to do once per version before its pushes (the
    vLLM sync's weights file), which the pool starts while a server still takes calls."""

    async def prepare(self, version: int, weights: Weights_contra) -> None:
        """Do the local part of pushing ``weights`` as ``version`` (idempotent: every
        server's push calls it). Raises ``OSError`` when it cannot."""
        ...


@runtime_checkable
class TimedWeightSync(Protocol):
    """Optional: a sync that says where its last push to a server spent its time (the
    vLLM sync: each request's seconds); the pool adds it to the ``weights_loaded`` event."""

    def push_phases(self, url: str) -> dict[str, float]:
        """Seconds of each phase of the newest push to ``url`` (``{"pause_s": ...}``),
        finished or not; empty if none was timed."""
        ...


# How long the resume after a failed push may take: the push's own deadline may be spent.
_RESUME_TIMEOUT_S = 10.0


async def _resume_server(client: httpx.AsyncClient, url: str) -> None:
    """``POST /resume``; a failure is left to the pool (the push already failed or its
    calls time out, and the next push pauses and resumes again)."""
    try:
        async with asyncio.timeout(_RESUME_TIMEOUT_S):
            await _exchange(client, "POST", f"{url}/resume", json={}, timeout=_RESUME_TIMEOUT_S)
    except (httpx.HTTPError, TimeoutError):
        pass


class _VersionReply(msgspec.Struct):
    weight_version: str | int | None = None
    version: str | int | None = None


def _reported(raw: bytes) -> int | None:
    try:
        body = msgspec.json.decode(raw, type=_VersionReply)
    except (msgspec.DecodeError, RecursionError):
        return None
    return parse_version(body.weight_version if body.weight_version is not None else body.version)


async def _exchange(
    client: httpx.AsyncClient, method: str, url: str, *, json: Any = None, timeout: float
) -> bytes:
    """The reply body of one request; raises ``httpx.HTTPStatusError`` for a refusal, and
    gives ``b""`` for a body past the cap (the connection is dropped, the rest unread)."""
    async with client.stream(method, url, json=json, timeout=timeout) as response:
        response.raise_for_status()
        try:
            return await read_body(response, _REPLY_CAP)
        except DataFailure:
            return b""


class PolicyWeightSync:
    """Pushes :class:`~rollout_recovery.policy.PolicySnapshot` parameters as JSON."""

    name: WeightSyncName = "policy"
    tracks_versions = True
    # The server swaps its policy between requests, never under one.
    exclusive = False

    async def push_keeping_calls(
        self,
        client: httpx.AsyncClient,
        url: str,
        version: int,
        weights: PolicySnapshot,
        timeout: float,
    ) -> int | None:
        """Pause the server's calls between tokens, load, resume (``InterruptingWeightSync``)."""
        await _exchange(client, "POST", f"{url}/pause?mode=keep", json={}, timeout=timeout)
        try:
            return await self.push(client, url, version, weights, timeout)
        finally:
            await _resume_server(client, url)

    async def push(
        self,
        client: httpx.AsyncClient,
        url: str,
        version: int,
        weights: PolicySnapshot,
        timeout: float,
    ) -> int | None:
        params = {name: array.tolist() for name, array in weights.params.items()}
        reply = await _exchange(
            client,
            "POST",
            f"{url}/update_weights",
            json={"version": version, "params": params},
            timeout=timeout,
        )
        return _reported(reply)


class VersionTagSync:
    """Tags a vLLM server (dev mode) with the version; its weights are not touched."""

    name: WeightSyncName = "version-tag"
    tracks_versions = True
    exclusive = False  # the weights never change

    async def push(
        self, client: httpx.AsyncClient, url: str, version: int, weights: object, timeout: float
    ) -> int | None:
        await _exchange(
            client,
            "POST",
            # vLLM takes the version as a string (an int is a 400).
            f"{url}/update_weight_version",
            json={"new_version": str(version)},
            timeout=timeout,
        )
        return _reported(await _exchange(client, "GET", f"{url}/weight_info", timeout=timeout))


class NoWeightSync:
    name: WeightSyncName = "none"
    tracks_versions = False
    exclusive = False

    async def push(
        self, client: httpx.AsyncClient, url: str, version: int, weights: object, timeout: float
    ) -> int | None:
        return version


# Every entry takes the numpy policy's snapshots (the version tag and no sync take any
# weights); a trainer of other weights gets "version-tag" or "none" only, which
# the registry's HTTP builder checks where the config names one (``control/_backends.py``).
WEIGHT_SYNCS: dict[WeightSyncName, WeightSync[PolicySnapshot]] = {
    "policy": PolicyWeightSync(),
    "version-tag": VersionTagSync(),
    "none": NoWeightSync(),
}
