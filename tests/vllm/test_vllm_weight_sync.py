"""The vLLM weight sync and the pool's exclusive pushes, against a fake vLLM with its traps.

What each test catches (``vllm_fake.py`` models the engine's behaviour):

- the push's order of routes (pause, name no version, load, name it, clear, resume);
- a restore: no call reaches a server before it holds the restored weights;
- a load under a request (trap 3): a call never carries tokens of two versions, and a
  call is never stamped with a version other than the one that generated it;
- a stale prefix cache (trap 2): after a push a cached prompt is answered by the new weights;
- a failed load leaves the server resumed, naming no version, and out of rotation.

The third trap, the stale tied ``lm_head``, lives in the worker: ``test_vllm_extension.py``
and the real-vLLM test ``tests/integration/llm/test_vllm_weight_sync_real.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_support import TASKS, EventLog
from vllm_fake import FakeVllm, FakeVllmFleet, FakeWeights, file_version, logprob_of

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.errors import InvalidArgumentError, InvalidArgumentTypeError
from rollout_recovery.policy import TaskConfig
from rollout_recovery.policy._tasks import VOCAB_SIZE
from rollout_recovery.rollout import (
    AttemptRequest,
    AttemptResult,
    DigitTask,
    GenerationConfig,
    HttpConfig,
    HttpGenerationBackend,
)
from rollout_recovery.vllm._sync import LOADING_TAG, VllmWeightSync, weights_file_name

GUARD_S = 30.0
PUSH = [
    "/pause?mode=wait&clear_cache=true",
    "/update_weight_version",
    "/collective_rpc",
    "loaded {v}",
    "/update_weight_version",
    "/reset_prefix_cache",
    "/resume",
    "/weight_info",
]


class Rig:
    def __init__(self, tmp_path: Path, servers: int = 1, *, loaded: int = 0, version: int = 0):
        self.fleet = FakeVllmFleet(servers, loaded=loaded)
        self.sync = VllmWeightSync(tmp_path / "weights")
        self.events = EventLog()
        self.data_plane = MemoryDataPlane()
        self.writer = CaptureWriter(self.data_plane)
        self.backend = HttpGenerationBackend(
            HttpConfig(
                servers=tuple(self.fleet.servers),
                model="m",
                per_server_concurrency=4,
                probe_interval_s=0.01,
                dead_after_failures=2,
                redispatch_backoff_s=0.0,
            ),
            generation=GenerationConfig(),
            # Two calls an episode: the tests read the call log.
            episodes=DigitTask(TASKS, TaskConfig(thinking_calls=1, reasoning_tokens=4)),
            vocab_size=VOCAB_SIZE,
            weight_sync=self.sync,
            stage_in_thread=False,
            initial_version=version,
            initial_weights=FakeWeights(version),
            client=httpx.AsyncClient(transport=self.fleet.transport()),
            on_event=self.events,
        )
        self.count = 0

    @property
    def server(self) -> FakeVllm:
        return self.fleet[0]

    def request(self, idx: int = 0) -> AttemptRequest:
        self.count += 1
        return AttemptRequest(
            group_id=f"grp{idx}",
            generation_index=0,
            rollout_id=f"grp{idx}_g0_a{self.count}",
            prompt=TASKS[idx],
            weight_version=0,
        )

    def staged(self) -> list[dict[str, Any]]:
        """Every staged call: its stamp and the logprobs of its generated tokens."""
        keys = self.data_plane.keys(CaptureWriter.staging_partition)
        out = []
        for row in self.data_plane.get(CaptureWriter.staging_partition, keys):
            generated = row.logprobs[row.token_mask == 1].tolist()
            out.append({"stamp": row.metadata["weight_version"], "logprobs": generated})
        return out


def _push(version: int) -> list[str]:
    return [step.format(v=version) for step in PUSH]


def _assert_each_call_is_one_version_and_stamped_with_it(rig: Rig) -> None:
    staged = rig.staged()
    assert staged
    for call in staged:
        assert call["logprobs"] == pytest.approx(
            [logprob_of(call["stamp"])] * len(call["logprobs"])
        )


def test_a_push_pauses_names_no_version_loads_names_it_clears_and_resumes(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.backend.run_attempt(rig.request(0), rig.writer)
        rig.backend.update_weights(1, FakeWeights(1))
        await rig.events.wait(lambda: rig.backend.pool.versions()[rig.server.url] == 1, GUARD_S)
        await rig.backend.aclose()

    rig = Rig(tmp_path)
    asyncio.run(scenario(rig))
    calls = ["call start", "call end"] * 2  # the episode's two calls
    assert rig.server.log == _push(0) + calls + _push(1)
    assert rig.server.tag == "1" and rig.server.loaded == 1 and not rig.server.paused
    assert file_version(str(tmp_path / "weights" / weights_file_name(1))) == "1"


@pytest.mark.parametrize("held", ["12", "10", None])
def test_after_a_restore_no_call_reaches_a_server_before_it_holds_the_restored_weights(
    tmp_path: Path, held: str | None
) -> None:
    """The servers outlived the job (adopted by the rerun) and hold weights of version 12,
    which the restore rolled back; they name ``held``: 12, the restored version's own
    number (other weights pushed under it before the crash), or none (a push cut half
    way). The backend starts at the restored version 10 and loads it first, whatever they
    name."""

    async def scenario(rig: Rig) -> AttemptResult:
        for server in rig.fleet.servers.values():
            server.tag = held
        try:
            return await rig.backend.run_attempt(rig.request(0), rig.writer)
        finally:
            await rig.backend.aclose()

    rig = Rig(tmp_path, servers=2, loaded=12, version=10)
    asyncio.run(scenario(rig))
    for server in rig.fleet.servers.values():
        assert server.log[: len(PUSH)] == _push(10)
    assert {call["stamp"] for call in rig.staged()} == {10}
    _assert_each_call_is_one_version_and_stamped_with_it(rig)


def test_new_weights_wait_for_the_call_in_flight_and_no_call_is_stamped_with_old_weights(
    tmp_path: Path,
) -> None:
    """Trap 3. A call is held half way when new weights arrive: the server takes no new
    call and loads nothing until that call ended (it is one version, the one it is stamped
    with); a call started meanwhile runs on the new weights, stamped with them."""

    async def scenario(rig: Rig) -> list[str]:
        server = rig.server
        rig.backend.pool.start()
        await rig.events.wait(lambda: rig.backend.pool.versions()[server.url] == 0, GUARD_S)
        server.hold = asyncio.Event()
        first = asyncio.create_task(rig.backend.run_attempt(rig.request(0), rig.writer))
        await server.holding.wait()
        rig.backend.update_weights(1, FakeWeights(1))
        second = asyncio.create_task(rig.backend.run_attempt(rig.request(1), rig.writer))
        # The pool's own probes are the clock: plenty of them pass with nothing sent.
        probes = server.probes
        await server.wait_for(lambda: server.probes >= probes + 10)
        during_hold = list(server.log)
        server.hold.set()
        await asyncio.gather(first, second)
        await rig.backend.aclose()
        return during_hold

    rig = Rig(tmp_path)
    during_hold = asyncio.run(scenario(rig))
    assert during_hold == [*_push(0), "call start"]
    log = rig.server.log
    loaded = log.index("loaded 1")
    # The held call ended before the load; every later call (the held episode's answer
    # call, the other episode) waited for the new weights.
    assert log[len(PUSH) : loaded] == ["call start", "call end", *PUSH[:3]]
    assert {call["stamp"] for call in rig.staged()} == {0, 1}
    _assert_each_call_is_one_version_and_stamped_with_it(rig)


def test_a_cached_prompt_is_answered_by_the_new_weights_after_a_push(tmp_path: Path) -> None:
    """Trap 2: the same episode (same prompts) before and after a push."""

    async def scenario(rig: Rig) -> None:
        await rig.backend.run_attempt(rig.request(3), rig.writer)
        assert rig.server.cache  # the engine cached the prompts
        rig.backend.update_weights(1, FakeWeights(1))
        await rig.events.wait(lambda: rig.backend.pool.versions()[rig.server.url] == 1, GUARD_S)
        await rig.backend.run_attempt(rig.request(3), rig.writer)
        await rig.backend.aclose()

    rig = Rig(tmp_path)
    asyncio.run(scenario(rig))
    assert sorted(call["stamp"] for call in rig.staged()) == [0, 0, 1, 1]
    _assert_each_call_is_one_version_and_stamped_with_it(rig)


def test_a_failed_load_resumes_the_server_names_no_version_and_keeps_it_out(
    tmp_path: Path,
) -> None:
    async def scenario(rig: Rig) -> None:
        server = rig.server
        rig.backend.pool.start()
        await rig.events.wait(lambda: rig.backend.pool.versions()[server.url] == 0, GUARD_S)
        server.fail_load = True
        rig.backend.update_weights(1, FakeWeights(1))
        await rig.events.wait(lambda: rig.backend.pool.states()[server.url] != "healthy", GUARD_S)
        assert server.tag == LOADING_TAG and not server.paused and server.loaded == 0
        assert server.log[-2:] == ["/collective_rpc", "/resume"]
        attempt = asyncio.create_task(rig.backend.run_attempt(rig.request(0), rig.writer))
        probes = server.probes
        await server.wait_for(lambda: server.probes >= probes + 10)
        assert "call start" not in server.log
        server.fail_load = False  # the next probe pushes again
        await attempt
        await rig.backend.aclose()

    rig = Rig(tmp_path)
    asyncio.run(scenario(rig))
    assert {call["stamp"] for call in rig.staged()} == {1}
    _assert_each_call_is_one_version_and_stamped_with_it(rig)


def test_weight_files_are_written_once_per_version_and_only_the_newest_are_kept(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "weights"
    directory.mkdir()
    (directory / weights_file_name(99)).write_bytes(b"an earlier run's")
    sync = VllmWeightSync(directory, keep=3)

    async def scenario() -> list[Path]:
        paths = []
        for version in range(1, 6):
            paths += await asyncio.gather(
                sync.weights_file(version, FakeWeights(version)),
                sync.weights_file(version, FakeWeights(version)),
            )
        return paths

    paths = asyncio.run(scenario())
    assert paths[-2] == paths[-1]
    assert sorted(p.name for p in directory.iterdir()) == [weights_file_name(v) for v in (3, 4, 5)]
    assert file_version(str(directory / weights_file_name(5))) == "5"


def test_weights_the_sync_cannot_write_are_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    sync = VllmWeightSync(tmp_path)
    with pytest.raises(InvalidArgumentError, match="version 2, pushed as 3"):
        sync.check(3, FakeWeights(2))
    with pytest.raises(InvalidArgumentTypeError, match="got dict"):
        sync.check(0, {"w": 1})
    with pytest.raises(InvalidArgumentError, match="keep"):
        VllmWeightSync(tmp_path, keep=0)


def test_an_interrupting_push_pauses_with_keep_and_does_not_wait_for_a_call_in_flight(
    tmp_path: Path,
) -> None:
    """``on_weight_update = "interrupt"``: ``/pause?mode=keep`` (the held call stays
    frozen, not waited for), load, name, reset the cache preempting the frozen requests
    (recomputed under the new weights), resume."""

    async def scenario(rig: Rig) -> list[str]:
        server = rig.server
        server.hold = asyncio.Event()
        first = asyncio.create_task(rig.backend.run_attempt(rig.request(0), rig.writer))
        await server.holding.wait()
        async with httpx.AsyncClient(transport=rig.fleet.transport()) as client:
            reported = await rig.sync.push_keeping_calls(
                client, server.url, 1, FakeWeights(1), GUARD_S
            )
        assert reported == 1
        during_hold = list(server.log)
        server.hold.set()
        await first
        await rig.backend.aclose()
        return during_hold

    rig = Rig(tmp_path)
    during_hold = asyncio.run(scenario(rig))
    assert during_hold == [
        *_push(0),
        "call start",
        "/pause?mode=keep",
        "/update_weight_version",
        "/collective_rpc",
        "loaded 1",
        "/update_weight_version",
        "/reset_prefix_cache?reset_running_requests=true",
        "/resume",
        "/weight_info",
    ]
