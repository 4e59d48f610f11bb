"""The HTTP backend with ``on_weight_update = "interrupt"`` against a real ``serve`` over
sockets: a weight push does not wait for the call in flight; the server pauses it between
tokens, loads and resumes it, and the staged call carries spans that tile its tokens, each
span's logprobs those of its version's policy."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rollout_recovery.capture import CaptureWriter, LinearizedRollout
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.errors import ConfigError, InvalidArgumentError
from rollout_recovery.policy import PolicySnapshot, TaskConfig, TaskSet
from rollout_recovery.policy._numpy_policy import initial_params
from rollout_recovery.policy._tasks import VOCAB_SIZE
from rollout_recovery.rollout import (
    AttemptRequest,
    DigitTask,
    GenerationConfig,
    HttpConfig,
    HttpGenerationBackend,
)
from rollout_recovery.serve import PolicyServer, ServeSettings

TASKS = TaskSet(20, seed=5, prompt_group_every=4)
REASONING = 6
SPLIT_AFTER = 1  # the first call is held after its token at this position
WAIT_S = 30.0
V0 = PolicySnapshot(0, initial_params(1, 2.0))
V1 = PolicySnapshot(1, initial_params(2, 2.0))


class Hold:
    """Holds the first call after its token at ``SPLIT_AFTER`` until released (once)."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()
        self._armed = True
        self._lock = threading.Lock()

    def __call__(self, position: int) -> None:
        with self._lock:
            fire = self._armed and position == SPLIT_AFTER
            if fire:
                self._armed = False
        if fire:
            self.reached.set()
            assert self.release.wait(WAIT_S)


@pytest.fixture
def hold() -> Hold:
    return Hold()


@pytest.fixture
def server(hold: Hold) -> Iterator[PolicyServer]:
    settings = ServeSettings(port=0, token_latency_s=0.001)
    with PolicyServer(settings, initial_weights=V0, on_token=hold) as running:
        yield running


def _backend(
    server: PolicyServer, mode: str, on_event: Any = None, weight_sync: str = "policy"
) -> HttpGenerationBackend:
    return HttpGenerationBackend(
        HttpConfig(
            servers=(server.url,),
            dialect="vllm-generate",
            weight_sync=weight_sync,  # type: ignore[arg-type]
            model="rollout-recovery-numpy",
            probe_interval_s=0.05,
        ),
        generation=GenerationConfig(on_weight_update=mode),  # type: ignore[arg-type]
        # A thought, then the answer.
        episodes=DigitTask(TASKS, TaskConfig(thinking_calls=1, reasoning_tokens=REASONING)),
        vocab_size=VOCAB_SIZE,
        stage_in_thread=False,
        initial_version=0,
        initial_weights=V0,
        on_event=on_event,
    )


def _run(server: PolicyServer, hold: Hold, mode: str) -> tuple[MemoryDataPlane, Any, list[Any]]:
    out: list[Any] = []

    async def main() -> None:
        loaded = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_event(kind: str, url: str, detail: dict[str, object]) -> None:
            if kind == "weights_loaded" and detail.get("version") == 1:
                loop.call_soon(loaded.set)

        backend = _backend(server, mode, on_event)
        plane = MemoryDataPlane()
        writer = CaptureWriter(plane)
        request = AttemptRequest(
            group_id="grp2",
            generation_index=0,
            rollout_id="grp2_g0_a1",
            prompt=TASKS[2],
            weight_version=0,
        )
        attempt = asyncio.ensure_future(backend.run_attempt(request, writer))
        assert await asyncio.to_thread(hold.reached.wait, WAIT_S)
        # The trainer's new weights while the first call is in flight: with "interrupt"
        # the push does not wait for it (it is still held here).
        backend.update_weights(1, V1)
        async with asyncio.timeout(WAIT_S):
            await loaded.wait()
        hold.release.set()
        result = await attempt
        await backend.aclose()
        out.extend([plane, result, writer])

    asyncio.run(main())
    return out[0], out[1], out[2:]


def _staged(plane: MemoryDataPlane, result: Any) -> list[dict[str, Any]]:
    keys = [call.staging_key for call in result.receipt.manifest]
    return [row.metadata for row in plane.get(CaptureWriter.staging_partition, keys)]


def test_a_push_does_not_wait_for_the_call_which_finishes_under_the_new_weights(
    server: PolicyServer, hold: Hold
) -> None:
    plane, result, _ = _run(server, hold, "interrupt")
    first, answer = _staged(plane, result)
    split = SPLIT_AFTER + 1
    assert first["extras"]["weight_version_spans"] == [
        {"version": "0", "start": 0, "end": split},
        {"version": "1", "start": split, "end": REASONING},
    ]
    assert first["weight_version"] == 1  # the newest weights the call saw
    assert answer["extras"]["weight_version_spans"] == [{"version": "1", "start": 0, "end": 2}]
    row = fetch_and_verify(result.receipt, plane, expected_rollout_id=result.rollout_id)
    assert isinstance(row, LinearizedRollout), row
    generated = np.flatnonzero(row.token_mask == 1.0).tolist()
    assert [p for s in row.token_version_spans for p in range(s.start, s.end)] == generated
    assert row.min_weight_version == 0 and row.max_weight_version == 1
    for span in row.token_version_spans:
        policy = V0 if span.version == 0 else V1
        expected = policy.token_logprobs(row.token_ids, row.token_mask)
        np.testing.assert_array_equal(
            row.logprobs[span.start : span.end],
            expected[span.start : span.end].astype(np.float32),
        )
    assert [s.version for s in row.token_version_spans] == [0, 1, 1]  # the answer: v1


def test_continue_keeps_the_call_on_the_weights_it_started_with(
    server: PolicyServer, hold: Hold
) -> None:
    plane, result, _ = _run(server, hold, "continue")
    first, _answer = _staged(plane, result)
    assert first["extras"]["weight_version_spans"] == [
        {"version": "0", "start": 0, "end": REASONING}
    ]
    assert first["weight_version"] == 0


def test_interrupt_needs_a_dialect_with_spans_and_a_sync_that_pauses(
    server: PolicyServer,
) -> None:
    # The config refuses both, naming the field, when it is read.
    base = {"generation": {"backend": "http", "on_weight_update": "interrupt"}}
    for http, field in (
        ({"dialect": "vllm-completions"}, "$.http.dialect"),
        ({"dialect": "vllm-generate", "weight_sync": "version-tag"}, "$.http.weight_sync"),
    ):
        with pytest.raises(ConfigError) as refused:
            config_from_builtins({**base, "http": http})
        assert refused.value.path == field
    # A sync handed in by code still cannot load weights under calls in flight.
    with pytest.raises(InvalidArgumentError, match="cannot load weights under calls"):
        _backend(server, "interrupt", weight_sync="version-tag")
