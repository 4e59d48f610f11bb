"""A fake fleet of vLLM-style servers behind ``httpx.MockTransport``.

Each fake server answers ``/health``, ``/update_weights``, ``/weight_info``,
``/v1/completions`` and ``/inference/v1/generate`` the way ``rollout-recovery serve`` does
(a generation answer names its weight version in ``X-Weight-Version``; the generate route
also in its spans), with the task's right answer, so a test can break exactly one thing (a
server's liveness, a status, a field of the reply, the weights it serves) and watch what
the backend makes of it. Tests wait on events the backend emits, never on the clock.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.policy import TaskConfig, TaskSet
from rollout_recovery.policy._tasks import (
    ANSWER,
    DIGIT_BASE,
    EOS,
    THOUGHT_BASE,
    VOCAB_SIZE,
    correct_answer,
    prompt_digit,
)
from rollout_recovery.rollout import (
    AttemptRequest,
    DigitTask,
    GenerationConfig,
    HttpConfig,
    HttpGenerationBackend,
)
from rollout_recovery.rollout._weight_sync import WeightSyncName
from rollout_recovery.rollout._wire import DialectName

TASKS = TaskSet(20, seed=5, prompt_group_every=4)
# Two calls an episode (a thought, the answer): the tests count calls.
EPISODES = DigitTask(TASKS, TaskConfig(thinking_calls=1, reasoning_tokens=4))
LOGPROB = -0.25

# A reply hook: (server, request body) -> a response to send instead, or None for normal.
Hook = Callable[["FakeServer", dict[str, Any]], httpx.Response | None]


def generated_for(prompt: list[int], max_tokens: int) -> list[int]:
    """What a perfect policy generates: thoughts, or the right answer and EOS."""
    if prompt[-1] == ANSWER:
        return [DIGIT_BASE + correct_answer(prompt_digit(prompt)), EOS][:max_tokens]
    return [THOUGHT_BASE + i % 8 for i in range(max_tokens)]


def completion(prompt: list[int], tokens: list[int], **overrides: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "text": "",
        "logprobs": {
            "text_offset": list(range(len(tokens))),
            "token_logprobs": [LOGPROB] * len(tokens),
            "tokens": [f"token_id:{t}" for t in tokens],
            "top_logprobs": None,
        },
        "finish_reason": "length",
        "stop_reason": None,
        "prompt_logprobs": None,
        "prompt_token_ids": prompt,
        "token_ids": tokens,
    }
    choice.update(overrides)
    return {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [choice]}


def generation(prompt: list[int], tokens: list[int], version: int | None) -> dict[str, Any]:
    """An ``/inference/v1/generate`` reply, every token of weights ``version``."""
    return {
        "request_id": "generate-tokens-1",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "token_ids": tokens,
                "logprobs": {"content": [{"token_id": t, "logprob": LOGPROB} for t in tokens]},
                "weight_versions": [{"version": str(version), "start": 0, "end": len(tokens)}],
                "finish_reason": "length",
            }
        ],
    }


@dataclass
class FakeServer:
    url: str
    alive: bool = True
    version: int | None = None
    calls: int = 0
    pushes: list[int] = field(default_factory=list)
    hook: Hook | None = None
    refuse_pushes: bool = False
    #: The weights it really serves, whatever it confirmed (None: what it confirmed).
    serves: int | None = None
    #: False: it has no /weight_info route (404).
    weight_info_route: bool = True

    @property
    def served(self) -> int | None:
        return self.version if self.serves is None else self.serves


class FakeFleet:
    def __init__(self, count: int) -> None:
        self.servers = {
            f"http://fake{i}:8000": FakeServer(f"http://fake{i}:8000") for i in range(count)
        }

    def __getitem__(self, index: int) -> FakeServer:
        return list(self.servers.values())[index]

    def handle(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        server = self.servers[base]
        if not server.alive:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/update_weights":
            if server.refuse_pushes:
                return httpx.Response(500, json={"error": {"message": "no"}})
            version = json.loads(request.content)["version"]
            server.version = version
            server.pushes.append(version)
            return httpx.Response(200, json={"weight_version": str(version)})
        if path in ("/pause", "/resume"):  # an interrupting push: nothing runs here between
            return httpx.Response(200, json={})
        if path == "/weight_info" and server.weight_info_route:
            return httpx.Response(200, json={"weight_version": str(server.served)})
        if path in ("/v1/completions", "/inference/v1/generate"):
            body = json.loads(request.content)
            server.calls += 1
            if server.hook is not None:
                replaced = server.hook(server, body)
                if replaced is not None:
                    return replaced
            headers = {} if server.served is None else {"X-Weight-Version": str(server.served)}
            if path == "/v1/completions":
                tokens = generated_for(body["prompt"], body["max_tokens"])
                return httpx.Response(200, json=completion(body["prompt"], tokens), headers=headers)
            prompt, sampling = body["token_ids"], body["sampling_params"]
            tokens = generated_for(prompt, sampling["max_tokens"])
            return httpx.Response(
                200, json=generation(prompt, tokens, server.served), headers=headers
            )
        return httpx.Response(404, json={"error": {"message": "not found"}})


class EventLog:
    """The backend's events, awaitable: ``await log.wait(lambda: ...)``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, object]]] = []
        self._changed: asyncio.Condition | None = None
        self._pending: set[asyncio.Task[None]] = set()

    def __call__(self, kind: str, server: str, detail: dict[str, object]) -> None:
        self.events.append((kind, server, detail))
        if self._changed is not None:
            condition = self._changed
            task = asyncio.get_running_loop().create_task(self._notify(condition))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    @staticmethod
    async def _notify(condition: asyncio.Condition) -> None:
        async with condition:
            condition.notify_all()

    async def wait(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        if self._changed is None:
            self._changed = asyncio.Condition()
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    def of(self, kind: str) -> list[tuple[str, dict[str, object]]]:
        return [(server, detail) for k, server, detail in self.events if k == kind]


@dataclass
class HttpRig:
    fleet: FakeFleet
    backend: HttpGenerationBackend
    data_plane: MemoryDataPlane
    writer: CaptureWriter
    events: EventLog
    counter: list[int] = field(default_factory=lambda: [0])

    def request(self, idx: int = 0, *, weight_version: int = 0) -> AttemptRequest:
        self.counter[0] += 1
        return AttemptRequest(
            group_id=f"grp{idx}",
            generation_index=0,
            rollout_id=f"grp{idx}_g0_a{self.counter[0]}",
            prompt=TASKS[idx],
            weight_version=weight_version,
        )


def make_rig(
    servers: int = 2,
    *,
    dialect: DialectName = "vllm-completions",
    weight_sync: WeightSyncName = "policy",
    budget: int = 3,
    dead_after: int = 2,
    no_server_wait_s: float = 5.0,
    transport: Callable[[FakeFleet], httpx.MockTransport] | None = None,
    urls: list[str] | None = None,
    probe_interval_s: float = 0.01,
    probe_timeout_s: float = 1.0,
    sync_timeout_s: float = 10.0,
    request_timeout_s: float = 30.0,
    max_reply_bytes: int | None = None,
    bad_data_quarantine_s: float = 30.0,
    api_key: str | None = None,
    on_weight_update: str = "continue",
) -> HttpRig:
    """A backend over ``servers`` fake servers, or over real ``urls`` (the fleet is then
    empty and the client a real one)."""
    from rollout_support import snapshot

    fleet = FakeFleet(0 if urls else servers)
    events = EventLog()
    # Real urls: the backend makes (and closes) its own client.
    client = (
        None
        if urls
        else httpx.AsyncClient(
            transport=transport(fleet) if transport else httpx.MockTransport(fleet.handle)
        )
    )
    data_plane = MemoryDataPlane()
    http = HttpConfig(
        servers=tuple(urls or fleet.servers),
        dialect=dialect,
        weight_sync=weight_sync,
        model="m",
        per_server_concurrency=4,
        probe_interval_s=probe_interval_s,
        probe_timeout_s=probe_timeout_s,
        sync_timeout_s=sync_timeout_s,
        dead_after_failures=dead_after,
        no_server_wait_s=no_server_wait_s,
        bad_data_quarantine_s=bad_data_quarantine_s,
        request_timeout_s=request_timeout_s,
        call_redispatch_budget=budget,
        redispatch_backoff_s=0.0,
    )
    backend = HttpGenerationBackend(
        http,
        generation=GenerationConfig(on_weight_update=on_weight_update),  # type: ignore[arg-type]
        episodes=EPISODES,
        vocab_size=VOCAB_SIZE,
        max_reply_bytes=max_reply_bytes,
        api_key=api_key,
        stage_in_thread=False,
        initial_version=0,
        initial_weights=snapshot(0),
        client=client,
        on_event=events,
    )
    return HttpRig(fleet, backend, data_plane, CaptureWriter(data_plane), events)
