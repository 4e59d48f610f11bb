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
import errno
import fcntl
import os
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import httpx
import pytest
from http_support import TASKS, EventLog
from vllm_fake import FakeVllm, FakeVllmFleet, FakeWeights, file_version, logprob_of

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidStateError,
)
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
from rollout_recovery.rollout._server_pool import _WHY_CHARS, _capped
from rollout_recovery.vllm._sync import (
    LOADING_TAG,
    VllmWeightSync,
    shared_memory_dir,
    shared_memory_weights,
    weights_file_name,
)

GUARD_S = 30.0
PUSH = [
    "/pause?mode=wait&clear_cache=true",
    "/update_weight_version",
    "/collective_rpc",
    "loaded {v}",
    "/update_weight_version",
    "/resume",
]


class GatedWeights(FakeWeights):
    """Fake weights whose file is written only once ``gate`` is set (in the writer's
    thread), counting the writes."""

    gate: ClassVar[threading.Event] = threading.Event()
    writes: ClassVar[list[int]] = []

    def write_safetensors(self, file: BinaryIO, dtype: str | None = None) -> None:
        self.writes.append(self.version)
        assert self.gate.wait(GUARD_S)
        super().write_safetensors(file, dtype)


@pytest.fixture
def gated() -> type[GatedWeights]:
    GatedWeights.gate = threading.Event()
    GatedWeights.writes = []
    return GatedWeights


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

    def request(self, idx: int = 0, version: int = 0) -> AttemptRequest:
        """An attempt dispatched at ``version`` (the oldest weights it may sample)."""
        self.count += 1
        return AttemptRequest(
            group_id=f"grp{idx}",
            generation_index=0,
            rollout_id=f"grp{idx}_g0_a{self.count}",
            prompt=TASKS[idx],
            weight_version=version,
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
        # Dispatched at the new version (as on policy): no server at 0 may serve it.
        second = asyncio.create_task(rig.backend.run_attempt(rig.request(1, 1), rig.writer))
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
    ]


def test_the_file_is_written_once_for_every_server_before_their_calls_are_waited_for(
    tmp_path: Path, gated: type[GatedWeights]
) -> None:
    """Two servers, each with a call held half way when version 1 arrives: its file is
    written (once) while both calls still run, so the push after the calls is only the
    requests; and no server loads before its own call ended."""

    async def scenario(rig: Rig) -> None:
        rig.backend.pool.start()
        gated.gate.set()
        await rig.events.wait(lambda: set(rig.backend.pool.versions().values()) == {0}, GUARD_S)
        gated.gate.clear()
        for server in rig.fleet.servers.values():
            server.hold = asyncio.Event()
        held = [
            asyncio.create_task(rig.backend.run_attempt(rig.request(i), rig.writer))
            for i in range(2)
        ]
        for server in rig.fleet.servers.values():
            await server.holding.wait()
        rig.backend.update_weights(1, gated(1))
        path = rig.sync.directory / weights_file_name(1)
        gated.gate.set()
        await asyncio.to_thread(_wait_for_file, path)
        # The file is in place once its writer renamed it; each server's sync task then
        # marks its server draining, on the loop: only from then on can no new call (the
        # episode's next) reach it before its push. On a loaded machine the held calls
        # once ended first.
        pooled = list(rig.backend.pool._workers)
        assert len(pooled) == 2
        async with asyncio.timeout(GUARD_S):
            while not all(server.draining for server in pooled):
                await asyncio.sleep(0.001)  # a condition polled, bounded by the guard
        for server in rig.fleet.servers.values():
            assert server.log[-1] == "call start", server.log  # nothing sent yet
            server.hold.set()
        await asyncio.gather(*held)
        await rig.events.wait(lambda: set(rig.backend.pool.versions().values()) == {1}, GUARD_S)
        await rig.backend.aclose()

    rig = Rig(tmp_path, servers=2)
    rig.backend._pool.set_weights(0, gated(0), push=False)
    asyncio.run(scenario(rig))
    assert gated.writes == [0, 1]
    for server in rig.fleet.servers.values():
        # The held call, then the push (the episode's answer call after it).
        assert server.log[len(PUSH) : 2 * len(PUSH) + 2] == ["call start", "call end", *_push(1)]
    for _, detail in rig.events.of("weights_loaded"):
        assert {"seconds", "write_s", "version"} <= set(detail)


def _wait_for_file(path: Path) -> None:
    for _ in range(int(GUARD_S / 0.01)):
        if path.exists():
            return
        threading.Event().wait(0.01)  # a worker thread's poll, not the test's clock
    raise AssertionError(f"{path} never written")


def test_while_the_file_is_written_a_lagging_server_serves_only_calls_its_version_may(
    tmp_path: Path, gated: type[GatedWeights]
) -> None:
    """Version 1 arrives; its file is held back. An attempt dispatched at version 0
    (inside a staleness window) is served by the server at 0, stamped 0; one dispatched
    at 1 waits for the server to hold 1. Then the file, the push, and the second call."""

    async def scenario(rig: Rig) -> None:
        server = rig.server
        rig.backend.pool.start()
        gated.gate.set()
        await rig.events.wait(lambda: rig.backend.pool.versions()[server.url] == 0, GUARD_S)
        gated.gate.clear()
        rig.backend.update_weights(1, gated(1))
        old = await rig.backend.run_attempt(rig.request(0, 0), rig.writer)
        assert isinstance(old, AttemptResult)
        new = asyncio.create_task(rig.backend.run_attempt(rig.request(1, 1), rig.writer))
        probes = server.probes
        await server.wait_for(lambda: server.probes >= probes + 10)
        assert server.log.count("call start") == 2  # the old attempt's two calls only
        assert not (rig.sync.directory / weights_file_name(1)).exists()
        gated.gate.set()
        await new
        await rig.backend.aclose()

    rig = Rig(tmp_path)
    rig.backend._pool.set_weights(0, gated(0), push=False)
    asyncio.run(scenario(rig))
    assert sorted(call["stamp"] for call in rig.staged()) == [0, 0, 1, 1]
    _assert_each_call_is_one_version_and_stamped_with_it(rig)
    log = rig.server.log
    assert log.index("loaded 1") < len(log) - log[::-1].index("call start") - 1


def test_a_shared_memory_directory_is_private_and_refused_if_it_is_not(tmp_path: Path) -> None:
    directory = shared_memory_dir("run-x", root=tmp_path)
    assert directory is not None and directory.is_dir()
    user = directory.parent
    assert user.name == f"rollout-recovery-{os.getuid()}"
    for path in (user, directory):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert shared_memory_dir("run-x", root=tmp_path) == directory  # a rerun finds its own
    user.chmod(0o755)
    with pytest.raises(InvalidStateError, match="private"):
        shared_memory_dir("run-x", root=tmp_path)
    assert shared_memory_dir("run-x", root=tmp_path / "none") is None


def test_a_shared_memory_directory_another_user_holds_sends_the_files_elsewhere_with_a_notice(
    tmp_path: Path,
) -> None:
    """Anyone may create ``/dev/shm/rollout-recovery-<uid>`` first (sticky: its owner
    cannot remove it): the job writes to disk instead of failing."""
    root = tmp_path / "shm"
    (root / f"rollout-recovery-{os.getuid()}").mkdir(parents=True, mode=0o777)
    (root / f"rollout-recovery-{os.getuid()}").chmod(0o777)
    notices: list[str] = []
    with shared_memory_weights(tmp_path / "run", root=root, log=notices.append) as directory:
        assert directory is None
    assert len(notices) == 1 and "not a private directory" in notices[0]
    assert list((root / f"rollout-recovery-{os.getuid()}").iterdir()) == []


def test_a_job_removes_the_shared_memory_of_runs_no_job_holds_and_only_those(
    tmp_path: Path,
) -> None:
    """A job killed with SIGKILL and never rerun (or whose run directory moved) left its
    weights in RAM: the next job's start removes them, never a live run's."""
    root = tmp_path / "shm"
    root.mkdir()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(gone.stdout)
    held = tmp_path / "live" / ".lock"
    held.parent.mkdir()
    held.write_text("")
    free = tmp_path / "killed" / ".lock"
    free.parent.mkdir()
    free.write_text("")

    def left(key: str, owner: str | None) -> Path:
        directory = shared_memory_dir(key, root)
        assert directory is not None
        (directory / weights_file_name(1)).write_bytes(b"w")
        if owner is not None:
            (directory / "owner").write_text(owner)
        return directory

    killed = left("run-killed", f"{free}\n{dead_pid}\n")
    moved = left("run-moved", f"{tmp_path / 'moved-away' / '.lock'}\n{dead_pid}\n")
    live = left("run-live", f"{held}\n{dead_pid}\n")
    running = left("run-running", f"{free}\n{os.getpid()}\n")  # its run dir moved
    unnamed = left("run-unnamed", None)
    with held.open() as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # a live job's lock
        mine = tmp_path / "run"
        with shared_memory_weights(mine, root=root, lock_file=tmp_path / ".lock") as directory:
            assert directory is not None
            assert not killed.exists() and not moved.exists()
            assert live.exists() and running.exists() and unnamed.exists()
            lock, pid = (directory / "owner").read_text().split()
            assert (lock, int(pid)) == (str(tmp_path / ".lock"), os.getpid())


def test_the_run_shared_memory_directory_is_named_by_run_and_removed_at_the_end(
    tmp_path: Path,
) -> None:
    root = tmp_path / "shm"
    root.mkdir()
    with shared_memory_weights(tmp_path / "run", root=root) as first:
        assert first is not None
        (first / weights_file_name(1)).write_bytes(b"w")
        with shared_memory_weights(tmp_path / "other", root=root) as other:
            assert other is not None and other != first
        with shared_memory_weights(tmp_path / "run" / ".." / "run", root=root) as again:
            assert again == first
            # The nested context for the same run removed it on its exit.
    assert not first.exists()


def test_shared_memory_files_superseded_or_left_by_a_dead_writer_go_and_close_removes_all(
    tmp_path: Path,
) -> None:
    directory = shared_memory_dir("run-y", root=tmp_path)
    assert directory is not None
    # A run killed while it wrote version 7 (its pid is no one's now), and an earlier file.
    (directory / f".{weights_file_name(7)}.999999999.tmp").write_bytes(b"half")
    (directory / weights_file_name(6)).write_bytes(b"old")
    sync = VllmWeightSync(directory)

    async def scenario() -> None:
        for version in (8, 9):
            await sync.prepare(version, FakeWeights(version))
            files = sorted(p.name for p in directory.iterdir())
            assert files == [weights_file_name(version)]  # the one before it superseded
            path = directory / weights_file_name(version)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert file_version(str(path)) == str(version)

    asyncio.run(scenario())
    sync.close()
    assert not directory.exists()
    sync.close()  # closing again is a no-op


def test_a_version_a_push_is_loading_is_not_removed_when_a_newer_one_is_written(
    tmp_path: Path,
) -> None:
    """The pushes of version 1 and 2 overlap: 2's file does not take 1's away from the
    server that is about to open it, nor rewrites it: 2's file is a new one (1's took
    the pages of 0's, which no push was reading)."""

    fleet = FakeVllmFleet(1)
    sync = VllmWeightSync(tmp_path / "weights")
    server = fleet[0]

    def inode(version: int) -> int:
        return os.stat(sync.directory / weights_file_name(version)).st_ino

    async def scenario() -> tuple[int | None, int | None]:
        async with httpx.AsyncClient(transport=fleet.transport()) as client:
            await sync.prepare(0, FakeWeights(0))
            zero = inode(0)
            server.hold = asyncio.Event()
            blocker = asyncio.create_task(
                client.post(f"{server.url}/v1/completions", json=_completion_body())
            )
            await server.holding.wait()
            first = asyncio.create_task(sync.push(client, server.url, 1, FakeWeights(1), GUARD_S))
            await server.wait_for(lambda: server.log[-1:] == ["/pause?mode=wait&clear_cache=true"])
            await sync.prepare(2, FakeWeights(2))  # the pause waits for the held call
            assert inode(1) == zero and inode(2) != zero
            assert file_version(str(sync.directory / weights_file_name(1))) == "1"
            server.hold.set()
            await blocker
            one = await first
            assert not (sync.directory / weights_file_name(1)).exists()
            two = await sync.push(client, server.url, 2, FakeWeights(2), GUARD_S)
            return one, two

    assert asyncio.run(scenario()) == (1, 2)


def _completion_body() -> dict[str, Any]:
    return {"prompt": [1, 2, 3], "max_tokens": 2, "model": "m"}


def test_pushes_to_several_servers_run_side_by_side(tmp_path: Path) -> None:
    """Every server's push starts at once: each pauses before any resumes."""

    async def scenario(rig: Rig) -> None:
        rig.backend.pool.start()
        await rig.events.wait(lambda: set(rig.backend.pool.versions().values()) == {0}, GUARD_S)
        start = len(rig.fleet.order)
        rig.backend.update_weights(1, FakeWeights(1))
        await rig.events.wait(lambda: set(rig.backend.pool.versions().values()) == {1}, GUARD_S)
        await rig.backend.aclose()
        pushes = [step for step in rig.fleet.order[start:] if step[1] in ("/pause", "/resume")]
        assert sorted(pushes[:3]) == sorted((url, "/pause") for url in rig.fleet.servers)
        assert {path for _, path in pushes[3:]} == {"/resume"}

    asyncio.run(scenario(Rig(tmp_path, servers=3)))


def test_a_server_that_keeps_its_name_while_loading_gets_no_load(tmp_path: Path) -> None:
    """vLLM refusing the loading tag would leave the old name on a half-loaded engine:
    the push stops before the load, and the server is resumed."""
    fleet = FakeVllmFleet(1)
    server = fleet[0]
    server.refuse_loading_tag = True
    sync = VllmWeightSync(tmp_path / "weights")

    async def scenario() -> int | None:
        async with httpx.AsyncClient(transport=fleet.transport()) as client:
            return await sync.push(client, server.url, 1, FakeWeights(1), GUARD_S)

    assert asyncio.run(scenario()) is None
    assert "/collective_rpc" not in server.log and server.log[-1] == "/resume"
    assert server.loaded == 0 and not server.paused


@dataclass(frozen=True)
class _HeldWeights(FakeWeights):
    """Fake weights whose file is written once their own ``gate`` is set."""

    gate: threading.Event = field(default_factory=threading.Event)

    def write_safetensors(self, file: BinaryIO, dtype: str | None = None) -> None:
        assert self.gate.wait(GUARD_S)
        super().write_safetensors(file, dtype)


def test_a_push_waiting_for_its_file_keeps_it_when_a_newer_one_is_written_first(
    tmp_path: Path,
) -> None:
    """The push of 1 waits for 1's file while 2's is written and done: 1's file, once
    written, is not pruned before the push has counted itself as loading it."""
    fleet = FakeVllmFleet(1)
    server = fleet[0]
    sync = VllmWeightSync(tmp_path / "weights")
    gate = threading.Event()

    async def scenario() -> int | None:
        async with httpx.AsyncClient(transport=fleet.transport()) as client:
            first = asyncio.create_task(
                sync.push(client, server.url, 1, _HeldWeights(1, gate), GUARD_S)
            )
            await asyncio.sleep(0)  # the push of 1 is waiting for its file
            await sync.prepare(2, FakeWeights(2))
            gate.set()
            return await first

    assert asyncio.run(scenario()) == 1
    assert server.loaded == 1


REQUEST_PHASES = ("pause_s", "unname_s", "load_s", "tag_s", "resume_s")


def test_a_push_event_says_where_its_seconds_went_phase_by_phase(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        rig.backend.pool.start()
        await rig.events.wait(lambda: rig.backend.pool.versions()[rig.server.url] == 0, GUARD_S)
        rig.backend.update_weights(1, FakeWeights(1))
        await rig.events.wait(lambda: rig.backend.pool.versions()[rig.server.url] == 1, GUARD_S)
        rig.server.fail_load = True
        rig.backend.update_weights(2, FakeWeights(2))
        await rig.events.wait(lambda: bool(rig.events.of("weights_push_failed")), GUARD_S)
        await rig.backend.aclose()

    rig = Rig(tmp_path)
    asyncio.run(scenario(rig))
    # Read from the failure's own event: the next probe retries the push at once, and
    # the retry's phases replace the failed one's in ``push_phases`` (a read after the
    # server left "healthy" could see only the retry's ``file_s``).
    _, failed = rig.events.of("weights_push_failed")[0]
    assert failed["version"] == 2 and "collective_rpc" in str(failed["why"])
    assert failed["seconds"] >= sum(failed[name] for name in REQUEST_PHASES if name in failed)
    loaded = {d["version"]: d for _, d in rig.events.of("weights_loaded")}
    pushed = loaded[1]
    assert set(REQUEST_PHASES) | {"file_s", "write_s", "drain_s", "seconds"} <= set(pushed)
    assert all(pushed[name] >= 0.0 for name in (*REQUEST_PHASES, "file_s", "drain_s"))
    # The requests are inside the push's seconds; the file's write inside ``write_s``.
    assert sum(pushed[name] for name in REQUEST_PHASES) <= pushed["seconds"] + 1e-3
    assert pushed["file_s"] <= pushed["write_s"] + 1e-3
    # A failed load says where it stopped: no version named, the server resumed.
    assert {"pause_s", "unname_s", "load_s", "resume_s"} <= set(failed)
    assert "tag_s" not in failed


def test_a_server_whose_pushes_keep_failing_reports_the_first_failure_of_each_streak(
    tmp_path: Path,
) -> None:
    """A server that answers its probes but fails every load is retried each probe
    interval; journaling an event per retry would grow the journal for as long as it
    fails. The first failure of a streak reports, and a push that loads ends the streak."""

    def loads(server: FakeVllm) -> int:
        return server.log.count("/collective_rpc")

    async def scenario(rig: Rig) -> None:
        server = rig.server
        rig.backend.pool.start()
        await rig.events.wait(lambda: rig.backend.pool.versions()[server.url] == 0, GUARD_S)
        for version in (1, 2):
            server.fail_load = True
            tried = loads(server)
            rig.backend.update_weights(version, FakeWeights(version))
            await server.wait_for(lambda t=tried: loads(server) >= t + 4)  # three retries
            server.fail_load = False
            await rig.events.wait(
                lambda v=version: rig.backend.pool.versions()[server.url] == v, GUARD_S
            )
        await rig.backend.aclose()

    rig = Rig(tmp_path)
    asyncio.run(scenario(rig))
    failed = [detail for _, detail in rig.events.of("weights_push_failed")]
    assert [detail["version"] for detail in failed] == [1, 2]


def test_a_failures_text_is_capped_saying_how_much_was_left_out() -> None:
    assert _capped("x" * _WHY_CHARS) == "x" * _WHY_CHARS
    long = "y" * (_WHY_CHARS + 7)
    assert _capped(long) == "y" * _WHY_CHARS + "... (7 more characters)"


def test_a_push_whose_file_fails_reports_none_of_an_earlier_pushs_phases(
    tmp_path: Path,
) -> None:
    class NoRoom(FakeWeights):
        def write_safetensors(self, *args: object, **kwargs: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

    async def scenario() -> dict[str, float]:
        fleet = FakeVllmFleet(1)
        url = fleet[0].url
        sync = VllmWeightSync(tmp_path / "weights")
        async with httpx.AsyncClient(transport=fleet.transport()) as client:
            assert await sync.push(client, url, 1, FakeWeights(1), GUARD_S) == 1
            assert "load_s" in sync.push_phases(url)
            with pytest.raises(OSError):
                await sync.push(client, url, 2, NoRoom(2), GUARD_S)
            return sync.push_phases(url)

    assert asyncio.run(scenario()) == {}


def test_a_new_version_takes_the_pages_of_the_file_it_supersedes(tmp_path: Path) -> None:
    """Each version's file is the superseded one's, rewritten (one inode for the run),
    and each holds its own version when its push loads it."""

    async def scenario(rig: Rig) -> list[tuple[int, str | None]]:
        seen = []
        rig.backend.pool.start()
        for version in range(4):
            if version:
                rig.backend.update_weights(version, FakeWeights(version))
            await rig.events.wait(
                lambda v=version: rig.backend.pool.versions()[rig.server.url] == v, GUARD_S
            )
            path = rig.sync.directory / weights_file_name(version)
            seen.append((os.stat(path).st_ino, file_version(str(path))))
        await rig.backend.aclose()
        return seen

    rig = Rig(tmp_path)
    seen = asyncio.run(scenario(rig))
    assert [found for _, found in seen] == ["0", "1", "2", "3"]
    assert len({inode for inode, _ in seen}) == 1
    assert rig.server.loaded == 3


def test_a_small_weights_file_is_written_on_the_loop_a_large_one_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread's hand-off back to a busy loop cost a tiny model's push more than its
    file: a file of at most 4 MB is written at once, a larger one off the loop."""
    import torch

    from rollout_recovery.llm._weights import TorchWeights

    threaded: list[int] = []
    real = asyncio.to_thread

    async def counting(function: Any, *args: Any) -> Any:
        threaded.append(args[0])  # the version
        return await real(function, *args)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    sync = VllmWeightSync(tmp_path / "weights", dtype="bfloat16")
    small = TorchWeights(1, {"w": torch.ones(1024)})
    large = TorchWeights(2, {"w": torch.ones(3 * 2**20)})  # 6 MB in bf16
    fake = FakeWeights(3)  # no size said: off the loop

    async def scenario() -> list[str | None]:
        found = []
        for weights in (small, large, fake):
            path = await sync.weights_file(weights.version, weights)
            found.append(file_version(str(path)))
        return found

    assert asyncio.run(scenario()) == ["1", "2", "3"]
    assert threaded == [2, 3]


class _Views:
    """Stands for the snapshot's views of a placed file (what holds its pages)."""


def _placed(sync: VllmWeightSync, version: int) -> _Views:
    """Place ``version``'s file as the trainer's snapshot does; the views of it."""
    views = _Views()

    def write(file: BinaryIO) -> _Views:
        FakeWeights(version).write_safetensors(file)
        return views

    sync.place(version, write)
    return views


class _NeverWritten(FakeWeights):
    def write_safetensors(self, file: BinaryIO, dtype: str | None = None) -> None:
        raise AssertionError("a placed file is written again")


def test_a_placed_file_is_its_versions_file_for_every_push(tmp_path: Path) -> None:
    """The trainer's snapshot written as version 1's file is what the push loads: not
    written again, and its own write reported as the push's ``file_s``."""

    async def scenario(rig: Rig) -> None:
        rig.backend.pool.start()
        await rig.events.wait(lambda: rig.backend.pool.versions()[rig.server.url] == 0, GUARD_S)
        views = _placed(rig.sync, 1)
        inode = os.stat(rig.sync.directory / weights_file_name(1)).st_ino
        rig.backend.update_weights(1, _NeverWritten(1))
        await rig.events.wait(lambda: rig.backend.pool.versions()[rig.server.url] == 1, GUARD_S)
        assert os.stat(rig.sync.directory / weights_file_name(1)).st_ino == inode
        assert rig.server.loaded == 1
        del views
        await rig.backend.aclose()

    rig = Rig(tmp_path)
    asyncio.run(scenario(rig))
    (pushed,) = [d for _, d in rig.events.of("weights_loaded") if d["version"] == 1]
    assert pushed["file_s"] > 0.0


def test_a_file_a_snapshot_views_is_never_rewritten_and_a_later_version_takes_its_pages(
    tmp_path: Path,
) -> None:
    """In the job the pool holds version N's snapshot while N+1 is placed, so N's file
    cannot be rewritten then: it stays as a spare and N+2 takes its pages (two files in
    turn). A snapshot held longer (a background checkpoint's encoding) keeps its file
    whole: the next version takes a fresh file, and one the views left once they go."""
    sync = VllmWeightSync(tmp_path / "weights", dtype="float32")

    def inode(version: int) -> int:
        return os.stat(sync.directory / weights_file_name(version)).st_ino

    held = _placed(sync, 1)  # the pool's
    inodes = [inode(1)]
    for version in range(2, 6):
        newest = _placed(sync, version)
        held = newest  # the pool moves on to it; the version before is let go
        inodes.append(inode(version))
        assert len(list(sync.directory.iterdir())) == 2
    assert len(set(inodes)) == 2 and inodes[0::2] == [inodes[0]] * 3

    checkpoint = held  # version 5's views, held by an encoding
    five = os.open(sync.directory / weights_file_name(5), os.O_RDONLY)
    six = _placed(sync, 6)
    held = six
    seven = _placed(sync, 7)  # 5 and 6 both viewed: a fresh file
    # 5's file may be gone from the directory (one spare is kept: 6's), never rewritten.
    assert file_version(f"/proc/self/fd/{five}") == "5"
    os.close(five)
    assert inode(6) in inodes and inode(7) not in inodes
    held = seven
    del checkpoint, six
    _placed(sync, 8)  # the views of 5 and 6 gone: one of theirs
    assert inode(8) in inodes
    sync.close()
    assert not sync.directory.exists()
