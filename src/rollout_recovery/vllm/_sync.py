"""Loading the trainer's weights into running vLLM servers over HTTP, without a restart.

One push of version N to one server (vLLM 0.32 with ``VLLM_SERVER_DEV_MODE=1`` and this
package's worker extension, see :func:`server_command`):

1. the weights are written once per version, for every server, as a safetensors file in
   the weights directory (the version in its metadata; written to a temporary name and
   renamed, so a server never reads half a file);
2. ``POST /pause?mode=wait&clear_cache=true``: requests still running finish, new ones
   queue, and the KV and prefix caches are dropped (trap: a cached prefix computed under
   the old weights would be reused under the new ones);
3. ``POST /update_weight_version "loading"``: until the load is confirmed the server
   names no version, so a push that fails half way never leaves old weights under a new
   name or new weights under an old one;
4. ``POST /collective_rpc rollout_recovery_load(path, N)``: the worker loads the file in
   place and re-packs a tied ``lm_head`` (trap: on CPU it would keep the old embedding);
5. ``POST /update_weight_version N``, then ``POST /reset_prefix_cache`` (it must report
   success: belt and braces after step 2);
6. ``POST /resume`` (always, even after a failure: a paused server would hold every
   later call), and ``GET /weight_info``: the version the server now names.

With ``[generation] on_weight_update = "interrupt"`` (:meth:`VllmWeightSync.push_keeping_calls`)
step 2 is ``/pause?mode=keep`` (requests in flight freeze between tokens) and step 5 resets
with ``reset_running_requests=true`` (the frozen requests are preempted and recomputed under
the new weights on resume); the pool then does not drain the server first.

The third trap, a load while a request runs (its later tokens would come from the new
weights under the old stamp), is why this sync is *exclusive*: the pool sends a server no
call while its push is pending and starts the push once its calls have ended (and step 2
waits for any request the server still runs, e.g. one whose client gave up).

Every reply is read under a small cap and decoded with msgspec; one of another shape is a
failed push (``None``), never an exception. The dev routes (``/pause``,
``/collective_rpc``, ...) are not covered by vLLM's API key: launched servers listen on a
socket only this user can reach (``_fleet.py``); run listed ones on a trusted network.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
import msgspec

from .._durable import atomic_write_bytes
from .._http import parse_version, read_capped
from ..errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = [
    "LOADING_TAG",
    "LOAD_METHOD",
    "SafetensorsWeights",
    "VllmWeightSync",
    "weights_file_name",
]

#: The worker extension's method (``_extension/rollout_recovery_vllm_extension.py``).
LOAD_METHOD = "rollout_recovery_load"
#: What a server is named while it loads: no version (``parse_version`` gives None).
LOADING_TAG = "loading"
# What a control route's reply may weigh.
_REPLY_CAP = 64 * 2**10
# How long the resume after a failed push may take: the push's own deadline may be spent.
_RESUME_TIMEOUT_S = 10.0
_FILE = re.compile(r"^weights-v(\d+)\.safetensors$")


def weights_file_name(version: int) -> str:
    return f"weights-v{version:010d}.safetensors"


class _RpcReply(msgspec.Struct):
    results: list[dict[str, Any] | None]


class _VersionReply(msgspec.Struct):
    weight_version: str | None = None


class _ResetReply(msgspec.Struct):
    success: bool


def _decode(raw: bytes, shape: type[Any]) -> Any:
    try:
        return msgspec.json.decode(raw, type=shape)
    except (msgspec.DecodeError, RecursionError):
        return None


class SafetensorsWeights(Protocol):
    """What this sync pushes: a versioned snapshot that renders itself as a safetensors
    file (``llm.TorchWeights``)."""

    @property
    def version(self) -> int: ...

    def safetensors_bytes(self, dtype: str) -> bytes: ...


class VllmWeightSync:
    """A ``WeightSync[SafetensorsWeights]`` (``TorchWeights``) for vLLM servers; see the
    module docstring.

    ``directory`` holds the weight files (created if missing); the newest ``keep`` versions
    written are kept, older files are removed. ``dtype`` is the name the files are written
    in (the servers' dtype: half the bytes of fp32 for a bf16 server, and the same rounding
    as vLLM's own cast).
    """

    name: Literal["vllm"] = "vllm"
    tracks_versions = True
    exclusive = True

    def __init__(self, directory: Path, *, dtype: str = "bfloat16", keep: int = 3) -> None:
        if keep < 1:
            raise InvalidArgumentError(f"keep must be >= 1, got {keep}", path="$.keep")
        self._directory = Path(directory)
        self._dtype = dtype
        self._keep = keep
        self._files: dict[int, asyncio.Task[Path]] = {}

    @property
    def directory(self) -> Path:
        return self._directory

    # -- the weight files -------------------------------------------------------------------

    @staticmethod
    def check(version: int, weights: object) -> None:
        """Refuse weights this sync cannot write, or of another version than announced.

        Takes any object: the job calls it where the config, not the types, chose this
        sync for a trainer (the registry's HTTP builder, ``control/_backends.py``)."""
        found = getattr(weights, "version", None)
        if not callable(getattr(weights, "safetensors_bytes", None)) or not isinstance(found, int):
            raise InvalidArgumentTypeError(
                "the vllm weight sync pushes weights with a version and safetensors_bytes() "
                f"(TorchWeights), got {type(weights).__name__}"
            )
        if found != version:
            raise InvalidArgumentError(f"weights are version {found}, pushed as {version}")

    def _serialize(self, weights: SafetensorsWeights) -> bytes:
        data = weights.safetensors_bytes(self._dtype)
        if not isinstance(data, bytes):
            raise InvalidArgumentTypeError("safetensors_bytes() must return bytes")
        return data

    def _write(self, version: int, weights: SafetensorsWeights) -> Path:
        path = self._directory / weights_file_name(version)
        data = self._serialize(weights)
        self._directory.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
        return path

    def _prune(self) -> None:
        """Forget and delete all but the newest ``keep`` versions (files of earlier runs
        in the directory included)."""
        keep = sorted(self._files)[-self._keep :]
        for version in [v for v in self._files if v not in keep]:
            del self._files[version]
        if not self._directory.is_dir():
            return
        for entry in self._directory.iterdir():
            match = _FILE.match(entry.name)
            if match and int(match.group(1)) not in keep:
                entry.unlink(missing_ok=True)

    async def weights_file(self, version: int, weights: SafetensorsWeights) -> Path:
        """The file of ``version``, written on the first call for it (shared by every
        server's push); a write that failed is retried by the next call."""
        task = self._files.get(version)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            self.check(version, weights)  # the caller's error, raised in the caller
            task = asyncio.ensure_future(asyncio.to_thread(self._write, version, weights))
            self._files[version] = task
            await asyncio.shield(task)
            self._prune()
        return await asyncio.shield(task)

    # -- one push ---------------------------------------------------------------------------

    async def push(
        self,
        client: httpx.AsyncClient,
        url: str,
        version: int,
        weights: SafetensorsWeights,
        timeout: float,
    ) -> int | None:
        return await self._push(client, url, version, weights, timeout, keep_calls=False)

    async def push_keeping_calls(
        self,
        client: httpx.AsyncClient,
        url: str,
        version: int,
        weights: SafetensorsWeights,
        timeout: float,
    ) -> int | None:
        """The push of ``on_weight_update = "interrupt"`` (``InterruptingWeightSync``):
        ``/pause?mode=keep`` freezes the requests in flight between two tokens, and the
        prefix-cache reset preempts them (``reset_running_requests``), so vLLM recomputes
        their KV under the new weights when they resume; their later tokens are the new
        version's, and their ``weight_versions`` spans say from which token."""
        return await self._push(client, url, version, weights, timeout, keep_calls=True)

    async def _push(
        self,
        client: httpx.AsyncClient,
        url: str,
        version: int,
        weights: SafetensorsWeights,
        timeout: float,
        *,
        keep_calls: bool,
    ) -> int | None:
        path = await self.weights_file(version, weights)
        await _exchange(
            client,
            "POST",
            f"{url}/pause",
            params={"mode": "keep"} if keep_calls else {"mode": "wait", "clear_cache": "true"},
            timeout=timeout,
        )
        try:
            await _tag(client, url, LOADING_TAG, timeout)
            rpc = await _exchange(
                client,
                "POST",
                f"{url}/collective_rpc",
                json={"method": LOAD_METHOD, "args": [str(path), str(version)]},
                timeout=timeout,
            )
            if not _loaded(_decode(rpc, _RpcReply), version):
                return None
            await _tag(client, url, str(version), timeout)
            reset = _decode(
                await _exchange(
                    client,
                    "POST",
                    f"{url}/reset_prefix_cache",
                    # Paused requests hold KV blocks: the reset preempts them (they are
                    # recomputed on resume), or it would fail while they run.
                    params={"reset_running_requests": "true"} if keep_calls else None,
                    timeout=timeout,
                ),
                _ResetReply,
            )
            if reset is None or not reset.success:
                return None
        finally:
            await _resume(client, url)
        info = _decode(
            await _exchange(client, "GET", f"{url}/weight_info", timeout=timeout), _VersionReply
        )
        return None if info is None else parse_version(info.weight_version)


def _loaded(reply: _RpcReply | None, version: int) -> bool:
    """Every worker answered, each naming ``version``."""
    if reply is None or not reply.results:
        return False
    return all(
        isinstance(result, dict) and result.get("version") == str(version)
        for result in reply.results
    )


async def _exchange(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    timeout: float,
    json: Any = None,
    params: dict[str, str] | None = None,
) -> bytes:
    """The reply body; ``httpx.HTTPStatusError`` for a refusal, ``b""`` past the cap."""
    async with client.stream(method, url, json=json, params=params, timeout=timeout) as response:
        response.raise_for_status()
        body = await read_capped(response, _REPLY_CAP)
        return b"" if body is None else body


async def _tag(client: httpx.AsyncClient, url: str, name: str, timeout: float) -> None:
    # vLLM takes the version as a string (an int is a 400).
    await _exchange(
        client, "POST", f"{url}/update_weight_version", json={"new_version": name}, timeout=timeout
    )


async def _resume(client: httpx.AsyncClient, url: str) -> None:
    """Resume the server; a failure is left to the pool (the push already failed or its
    calls time out, and the next push pauses and resumes again)."""
    try:
        async with asyncio.timeout(_RESUME_TIMEOUT_S):
            await _exchange(client, "POST", f"{url}/resume", timeout=_RESUME_TIMEOUT_S)
    except (httpx.HTTPError, TimeoutError):
        pass
