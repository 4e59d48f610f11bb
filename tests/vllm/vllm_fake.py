"""A fake vLLM 0.32 server in dev mode behind ``httpx.MockTransport``, with vLLM's traps.

It answers the routes the vLLM weight sync, the pool's probes and the HTTP backend use (``/health``,
``/v1/completions``, ``/pause``, ``/resume``, ``/collective_rpc``,
``/update_weight_version``, ``/weight_info``, ``/reset_prefix_cache``) and models what a
real engine does wrong unless the sync handles it:

- *stale prefix cache*: a prompt seen before is answered from its cached prefix, i.e.
  with the logprobs of the weights that computed the cache, until the cache is cleared
  (``/reset_prefix_cache``, or ``/pause`` with ``clear_cache=true``);
- *a load under a request*: a request held open (``hold``) generates its first half
  under the weights loaded when it arrived and its second half under the weights loaded
  when it is released, exactly as an unpaused vLLM switches weights mid-request.

The weights a token came from are visible in its logprob: :func:`logprob_of` (version).
Every request is logged in order (``server.log``), so a test can check what happened
before what. A load reads the version from the weight file's safetensors header, as the
worker extension does.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import httpx
from http_support import completion, generated_for


def logprob_of(version: int) -> float:
    """The logprob every token generated under weights ``version`` gets."""
    return -0.01 * (1 + version)


def file_version(path: str) -> str | None:
    """The ``weight_version`` in a safetensors file's metadata."""
    data = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header: dict[str, Any] = json.loads(data[8 : 8 + length])
    metadata: dict[str, str] = header.get("__metadata__") or {}
    return metadata.get("weight_version")


@dataclass
class FakeVllm:
    url: str
    #: The weights in the engine (what tokens are generated from).
    loaded: int = 0
    #: What /weight_info names (vLLM starts with none).
    tag: str | None = None
    paused: bool = False
    alive: bool = True
    #: prompt -> the version that computed its cached prefix.
    cache: dict[tuple[int, ...], int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    in_flight: int = 0
    #: When set, each completion waits on it half way (see the module docstring).
    hold: asyncio.Event | None = None
    #: Set when a completion reaches its hold point.
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    fail_load: bool = False
    #: When set, ``/update_weight_version`` refuses the loading tag (keeps the old name).
    refuse_loading_tag: bool = False
    #: /health probes answered (a clock made of the pool's own probe loop).
    probes: int = 0
    #: /weight_info asked by probes (not in ``log``).
    weight_infos: int = 0
    #: Notified after every request: ``await server.wait_for(lambda: ...)``.
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _resumed: asyncio.Event = field(default_factory=asyncio.Event)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._resumed.set()
        self._idle.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(predicate)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        # A request over a socket suspends its sender; through MockTransport it would
        # not, and one push would run whole before another server's push started.
        await asyncio.sleep(0)
        try:
            return await self._handle(request)
        finally:
            async with self.changed:
                self.changed.notify_all()

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        if not self.alive:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if path == "/health":
            self.probes += 1
            return httpx.Response(200)
        if path == "/v1/completions":
            return await self._complete(json.loads(request.content))
        if path == "/weight_info":
            # The pool's probes ask it (a push does not): counted, not logged, so the
            # log is the push's steps and the calls.
            self.weight_infos += 1
            return httpx.Response(200, json={"weight_version": self.tag})
        query = request.url.query.decode()
        self.log.append(f"{path}?{query}" if query and path != "/update_weight_version" else path)
        if path == "/pause":
            self.paused = True
            self._resumed.clear()
            if request.url.params.get("mode") != "keep":
                async with self.changed:
                    self.changed.notify_all()  # paused, waiting: a test may act now
                await self._idle.wait()  # mode=wait: running requests finish first
            if request.url.params.get("clear_cache") == "true":
                self.cache.clear()
            return httpx.Response(200, json={"status": "paused"})
        if path == "/resume":
            self.paused = False
            self._resumed.set()
            return httpx.Response(200, json={"status": "resumed"})
        if path == "/update_weight_version":
            name = json.loads(request.content)["new_version"]
            if self.refuse_loading_tag and name == "loading":
                return httpx.Response(200, json={"success": False, "new_version": self.tag})
            self.tag = name
            return httpx.Response(200, json={"success": True, "new_version": self.tag})
        if path == "/reset_prefix_cache":
            self.cache.clear()
            return httpx.Response(200, json={"success": True})
        if path == "/collective_rpc":
            body = json.loads(request.content)
            if self.fail_load or body.get("method") != "rollout_recovery_load":
                return httpx.Response(500, json={"error": "load failed"})
            file, version = body["args"]
            if file_version(file) != version:
                return httpx.Response(500, json={"error": "wrong file"})
            self.loaded = int(version)
            self.log.append(f"loaded {version}")
            return httpx.Response(200, json={"results": [{"version": version, "tensors": 1}]})
        return httpx.Response(404, json={"error": {"message": "not found"}})

    async def _complete(self, body: dict[str, Any]) -> httpx.Response:
        await self._resumed.wait()  # paused: new requests queue
        prompt = tuple(body["prompt"])
        self.in_flight += 1
        self._idle.clear()
        self.log.append("call start")
        try:
            first = self.cache.get(prompt, self.loaded)
            tokens = generated_for(list(prompt), body["max_tokens"])
            half = len(tokens) // 2
            if self.hold is not None:
                self.holding.set()
                await self.hold.wait()
            second = self.cache.get(prompt, self.loaded) if half else first
            self.cache.setdefault(prompt, first)
            logprobs = [logprob_of(first)] * half + [logprob_of(second)] * (len(tokens) - half)
            reply = completion(list(prompt), tokens)
            reply["choices"][0]["logprobs"]["token_logprobs"] = logprobs
            return httpx.Response(200, json=reply)
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()
            self.log.append("call end")


class FakeVllmFleet:
    def __init__(self, count: int, *, loaded: int = 0) -> None:
        self.servers = {
            f"http://vllm{i}:8000": FakeVllm(f"http://vllm{i}:8000", loaded=loaded)
            for i in range(count)
        }
        #: Every request to any server, in the order they arrived: (server, path).
        self.order: list[tuple[str, str]] = []

    def __getitem__(self, index: int) -> FakeVllm:
        return list(self.servers.values())[index]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        self.order.append((base, request.url.path))
        return await self.servers[base].handle(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


@dataclass(frozen=True)
class FakeWeights:
    """What the sync needs of ``TorchWeights``: a version and a safetensors file."""

    version: int

    def write_safetensors(self, file: BinaryIO, dtype: str | None = None) -> None:
        header = json.dumps({"__metadata__": {"weight_version": str(self.version)}}).encode()
        file.write(struct.pack("<Q", len(header)) + header)
        file.truncate(8 + len(header))  # it may hold a superseded version's bytes
