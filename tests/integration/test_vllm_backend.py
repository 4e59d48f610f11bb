"""The HTTP backend against real vLLM 0.32 servers (``bash .ci/vllm-integration``).

Two servers for the module, a tiny random Llama (vocab 333: the task's token ids, all
below 38, are valid prompts). What must hold with a real engine, not only with our own
server: multi-turn episodes staged token-exact and accepted by ``verify_and_linearize``,
a tampered staged row rejected, the generate route's weight-version spans recorded, and a
SIGKILL of a server's process group in the middle of a request (made certain by pausing
the servers first) classified as an infra failure and redispatched to the other server.
Skips without the vLLM variables.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest

from rollout_recovery.capture import CaptureWriter, LinearizedRollout, Rejection
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.policy import TaskConfig, TaskSet
from rollout_recovery.policy._tasks import ANSWER
from rollout_recovery.rollout import (
    AttemptRequest,
    AttemptResult,
    DigitTask,
    GenerationConfig,
    HttpConfig,
    HttpGenerationBackend,
)
from rollout_recovery.rollout._weight_sync import WeightSyncName
from rollout_recovery.rollout._wire import DialectName

if TYPE_CHECKING:  # conftest is not importable by name at run time (several exist)
    from conftest import VllmServer, VllmServerFactory

pytestmark = pytest.mark.vllm

TASKS = TaskSet(64, seed=11, prompt_group_every=4)
# The tiny Llama's vocabulary: what its replies are checked against (no trainer here).
TINY_VOCAB = 333
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def servers(vllm_server_factory: VllmServerFactory) -> list[VllmServer]:
    return [vllm_server_factory(), vllm_server_factory()]


def _backend(
    urls: list[str],
    *,
    dialect: DialectName = "vllm-completions",
    weight_sync: WeightSyncName = "none",
    reasoning_tokens: int = 6,
    transport: httpx.AsyncBaseTransport | None = None,
) -> HttpGenerationBackend:
    return HttpGenerationBackend(
        HttpConfig(
            servers=tuple(urls),
            dialect=dialect,
            weight_sync=weight_sync,
            model="tiny",
            per_server_concurrency=4,
            probe_interval_s=0.2,
            probe_timeout_s=2.0,
            dead_after_failures=2,
            request_timeout_s=TIMEOUT_S,
            call_redispatch_budget=2,
            redispatch_backoff_s=0.05,
        ),
        generation=GenerationConfig(),
        # A thought, then the answer: the tests count two calls.
        episodes=DigitTask(
            TASKS, TaskConfig(thinking_calls=1, reasoning_tokens=reasoning_tokens)
        ),
        vocab_size=TINY_VOCAB,
        stage_in_thread=False,
        initial_version=0,
        initial_weights=None,
        client=httpx.AsyncClient(transport=transport) if transport else None,
    )


def _request(idx: int, attempt: int = 0, weight_version: int = 0) -> AttemptRequest:
    return AttemptRequest(
        group_id=f"grp{idx}",
        generation_index=0,
        rollout_id=f"grp{idx}_g0_a{attempt}",
        prompt=TASKS[idx],
        weight_version=weight_version,
    )


async def _run(backend: HttpGenerationBackend, writer: CaptureWriter, idxs: range) -> list[Any]:
    try:
        return list(await asyncio.gather(*(backend.run_attempt(_request(i), writer) for i in idxs)))
    finally:
        await backend.aclose()


def _extras(store: MemoryDataPlane, rollout_id: str) -> list[dict[str, Any]]:
    keys = [
        k for k in store.keys(CaptureWriter.staging_partition) if k.startswith(rollout_id + "/")
    ]
    rows = store.get(CaptureWriter.staging_partition, keys)
    # Commit order: the reasoning call is the one without a parent.
    return sorted(
        (row.metadata["extras"] | {"_parent": row.metadata["parent_call_id"]} for row in rows),
        key=lambda e: e["_parent"] is not None,
    )


def test_multi_turn_episodes_are_captured_token_exact(servers: list[VllmServer]) -> None:
    store = MemoryDataPlane()
    writer = CaptureWriter(store)
    urls = [s.url for s in servers]
    results: list[AttemptResult] = asyncio.run(_run(_backend(urls), writer, range(6)))
    for idx, result in enumerate(results):
        verified = fetch_and_verify(result.receipt, store, expected_rollout_id=result.rollout_id)
        assert isinstance(verified, LinearizedRollout), verified
        prompt = TASKS[idx]["prompt_token_ids"]
        tokens = verified.token_ids.tolist()
        # prompt | 6 generated | ANSWER (carried) | 2 generated: token in, token out.
        assert tokens[: len(prompt)] == prompt
        assert tokens[len(prompt) + 6] == ANSWER
        assert verified.token_mask.tolist() == ([0] * len(prompt) + [1] * 6 + [0] + [1] * 2)
        assert len(verified.call_ids) == 2
        first, second = _extras(store, result.rollout_id)
        assert first["endpoint"] == "/v1/completions" and first["logprob_mode"] == "raw_logprobs"
        assert {first["server"], second["server"]} <= set(urls)
    # Both servers served: the pool spreads calls.
    servers_used = {e["server"] for r in results for e in _extras(store, r.rollout_id)}
    assert servers_used == set(urls)

    # The staged logprobs are the engine's: vLLM recomputes the same values as prompt
    # logprobs of the whole sequence (bf16 numerics: a loose tolerance).
    verified = fetch_and_verify(results[0].receipt, store)
    assert isinstance(verified, LinearizedRollout)
    full = verified.token_ids.tolist()
    reply = httpx.post(
        f"{urls[0]}/v1/completions",
        json={"model": "tiny", "prompt": full, "max_tokens": 1, "prompt_logprobs": 0},
        timeout=TIMEOUT_S,
    ).json()
    recomputed = reply["choices"][0]["prompt_logprobs"]
    generated = np.flatnonzero(verified.token_mask == 1)
    for position in generated:
        entry = recomputed[position][str(full[position])]
        assert abs(entry["logprob"] - float(verified.logprobs[position])) < 0.15


def test_a_tampered_staged_row_is_rejected(servers: list[VllmServer]) -> None:
    store = MemoryDataPlane()
    writer = CaptureWriter(store)
    (result,) = asyncio.run(_run(_backend([servers[0].url]), writer, range(1)))
    key = result.receipt.manifest[0].staging_key
    (row,) = store.get(CaptureWriter.staging_partition, [key])
    token_ids = row.token_ids.copy()
    token_ids[-1] = (int(token_ids[-1]) + 1) % TINY_VOCAB  # one generated id, metadata untouched
    store.put(CaptureWriter.staging_partition, {key: dataclasses.replace(row, token_ids=token_ids)})
    rejected = fetch_and_verify(result.receipt, store)
    assert isinstance(rejected, Rejection) and rejected.code == "digest_mismatch", rejected


def test_generate_route_records_weight_version_spans(servers: list[VllmServer]) -> None:
    store = MemoryDataPlane()
    writer = CaptureWriter(store)
    urls = [s.url for s in servers]
    backend = _backend(urls, dialect="vllm-generate", weight_sync="version-tag")

    async def scenario() -> AttemptResult:
        try:
            backend.update_weights(7, None)
            await _until(lambda: set(backend.pool.versions().values()) == {7})
            return await backend.run_attempt(_request(3, weight_version=7), writer)
        finally:
            await backend.aclose()

    result = asyncio.run(scenario())
    verified = fetch_and_verify(result.receipt, store)
    assert isinstance(verified, LinearizedRollout), verified
    assert verified.max_weight_version == 7  # stamped with the version the server confirmed
    for extras in _extras(store, result.rollout_id):
        assert extras["endpoint"] == "/inference/v1/generate"
        assert extras["server_weight_version"] == "7"
        spans = extras["weight_version_spans"]
        assert spans[0]["version"] == "7" and spans[0]["start"] == 0
        assert spans[-1]["end"] == extras["sampling_params"]["max_tokens"]


async def _until(predicate: Any, timeout: float = 30.0) -> None:
    # The pool reports weight versions through its probe loop; a bounded poll of our own
    # in-process state.
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


class _Watching(httpx.AsyncHTTPTransport):
    """Notes the server the first completion request goes to."""

    def __init__(self) -> None:
        super().__init__()
        self.first: str | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions" and self.first is None:
            self.first = f"http://{request.url.host}:{request.url.port}"
        return await super().handle_async_request(request)


def test_sigkill_mid_request_is_an_infra_failure_redispatched_to_the_other_server(
    servers: list[VllmServer],
) -> None:
    """Both servers are paused (``/pause?mode=keep``: requests queue, none runs) before the
    attempt starts, so its first call cannot finish on the server it goes to: the kill
    lands inside that call by construction, whatever the machine's load. The other server
    is resumed once the victim is dead, and takes the redispatched call."""
    store = MemoryDataPlane()
    writer = CaptureWriter(store)
    by_url = {s.url: s for s in servers}
    for url in by_url:
        httpx.post(f"{url}/pause", params={"mode": "keep"}, timeout=TIMEOUT_S).raise_for_status()
    watching = _Watching()
    backend = _backend(list(by_url), transport=watching)

    async def scenario() -> tuple[AttemptResult, str]:
        try:
            attempt = asyncio.create_task(backend.run_attempt(_request(5), writer))
            await _until(lambda: watching.first is not None)
            victim = watching.first
            assert victim is not None
            assert not attempt.done()  # a paused server answers nothing
            await asyncio.to_thread(by_url[victim].kill)
            survivor = next(url for url in by_url if url != victim)
            await asyncio.to_thread(
                lambda: httpx.post(f"{survivor}/resume", timeout=TIMEOUT_S).raise_for_status()
            )
            return await attempt, victim
        finally:
            await backend.aclose()

    try:
        result, victim = asyncio.run(scenario())
    finally:
        for server in servers:
            if not server.killed:
                httpx.post(f"{server.url}/resume", timeout=TIMEOUT_S)
    assert store.keys(CaptureWriter.staging_partition)  # staged by the survivor only
    verified = fetch_and_verify(result.receipt, store)
    assert isinstance(verified, LinearizedRollout), verified
    first, _ = _extras(store, result.rollout_id)
    survivor = next(url for url in by_url if url != victim)
    assert first["server"] == survivor and first["redispatches"] == 1
    assert backend.redispatches == 1
    stats = backend.server_stats()
    assert stats[victim].infra_failures >= 1 and stats[survivor].infra_failures == 0
    events = backend.drain_events()
    moved = [e for e in events if e["event"] == "call_redispatched"]
    assert moved and moved[0]["server"] == victim
