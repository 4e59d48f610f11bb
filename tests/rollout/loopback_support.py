"""A real HTTP/1.1 server on 127.0.0.1, in the test's own event loop, that misbehaves on cue.

``httpx.MockTransport`` has no sockets, so it cannot show what httpx's per-read timeouts
let through. This server speaks just enough HTTP/1.1 for the backend (keep-alive,
Content-Length bodies) and answers each path as told: ``ok`` (``/health``,
``/update_weights`` and ``/v1/completions`` as ``rollout-recovery serve`` would), ``drip``
(a status line, headers and an endless body, one byte per ``drip_interval_s``: every read
succeeds, the reply never ends), or ``flood`` (a chunked body of ``flood_bytes``, written
as fast as the client reads it). ``script[path]`` lists behaviours for the next requests
to ``path``, before ``behaviour`` applies again. :meth:`stop` closes the socket and every connection
(connection refused from then on); :meth:`restart` listens on the same port again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from typing import Literal

from http_support import completion, generated_for

Behaviour = Literal["ok", "drip", "flood"]


class LoopbackServer:
    def __init__(self, *, drip_interval_s: float = 0.02, flood_bytes: int = 100 * 2**20) -> None:
        self.behaviour: dict[str, Behaviour] = {}
        self.script: dict[str, list[Behaviour]] = {}
        self.drip_interval_s = drip_interval_s
        self.flood_bytes = flood_bytes
        self.version: int | None = None
        self.requests: dict[str, int] = {}
        # Bytes of flood bodies the client took before it hung up, per connection.
        self.flooded: list[int] = []
        self.flood_cut = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._port = 0
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    async def start(self) -> str:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self._port, reuse_address=True
        )
        self._port = self._server.sockets[0].getsockname()[1]
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        # Abort every connection (as a killed process would) and let each handler see it
        # and end: cancelling a handler task makes asyncio log an error.
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    # -- one connection ------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._handlers.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {
            name.strip().lower(): value.strip()
            for name, value in (line.split(":", 1) for line in lines[1:] if ":" in line)
        }
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests[path] = self.requests.get(path, 0) + 1
        scripted = self.script.get(path)
        behaviour = scripted.pop(0) if scripted else self.behaviour.get(path, "ok")
        if behaviour == "drip":
            await self._drip(writer)
            return False
        if behaviour == "flood":
            await self._flood(writer)
            return False
        status, reply = self._answer(method, path, body)
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(reply)}\r\n\r\n".encode()
            + reply
        )
        await writer.drain()
        return True

    def _answer(self, method: str, path: str, body: bytes) -> tuple[str, bytes]:
        if path == "/health":
            return "200 OK", b""
        if path == "/update_weights" and method == "POST":
            self.version = int(json.loads(body)["version"])
            return "200 OK", json.dumps({"weight_version": str(self.version)}).encode()
        if path == "/v1/completions" and method == "POST":
            request = json.loads(body)
            tokens = generated_for(request["prompt"], request["max_tokens"])
            return "200 OK", json.dumps(completion(request["prompt"], tokens)).encode()
        return "404 Not Found", b'{"error": {"message": "not found"}}'

    async def _drip(self, writer: asyncio.StreamWriter) -> None:
        # A valid chunked reply that never ends and never grows past any byte cap: one
        # one-space chunk after another.
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        for byte in itertools.chain(head, itertools.cycle(b"1\r\n \r\n")):
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(self.drip_interval_s)

    async def _flood(self, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b" " * 2**20
        sent = 0
        try:
            while sent < self.flood_bytes:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
                sent += len(chunk)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            self.flooded.append(sent)
            if sent < self.flood_bytes:
                self.flood_cut.set()
