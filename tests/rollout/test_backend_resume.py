"""``run_attempt(..., prefix)`` on the simulated and HTTP backends: an attempt lost mid-episode is
continued by the next attempt of its sibling, which generates only the calls after it."""

from __future__ import annotations

import httpx
from http_support import TASKS as HTTP_TASKS
from http_support import make_rig as make_http_rig
from rollout_support import TASKS, failure_of, make_rig, run, snapshot

from rollout_recovery.capture import (
    CaptureWriter,
    LinearizedRollout,
    StagedPrefix,
)
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.dataplane import DataPlane
from rollout_recovery.policy import TaskConfig
from rollout_recovery.rollout import (
    AttemptRequest,
    DigitTask,
    FailureReason,
    FaultsConfig,
    GenerationConfig,
    SimulatedAgentBackend,
)


def prefix_of(store: DataPlane, rollout_id: str) -> StagedPrefix:
    keys = [
        k for k in store.keys(CaptureWriter.staging_partition) if k.startswith(rollout_id + "/")
    ]
    found = StagedPrefix.read(store, rollout_id, keys)
    assert isinstance(found, StagedPrefix), found
    return found


def retry_of(request: AttemptRequest, attempt: str) -> AttemptRequest:
    return AttemptRequest(
        group_id=request.group_id,
        generation_index=request.generation_index,
        rollout_id=request.rollout_id.rpartition("_a")[0] + "_a" + attempt,
        prompt=request.prompt,
        weight_version=request.weight_version,
    )


def test_the_simulated_backend_continues_an_attempt_that_failed_mid_episode() -> None:
    async def main() -> None:
        rig = make_rig(FaultsConfig.only(attempt_failure_rate=1.0))
        backend = rig.backend
        first = rig.request(3)
        failure_of(await backend.run_attempt(first, rig.writer), FailureReason.ATTEMPT_FAILED)
        prefix = prefix_of(rig.data_plane, first.rollout_id)
        assert len(prefix.calls) == 1  # it failed at its second call

        backend.set_faults(FaultsConfig.only())
        staged_before = len(rig.writer.staged)
        second = retry_of(first, "b2")
        result = await backend.run_attempt(second, rig.writer, prefix)
        assert result.inherited_calls == 1 and result.inherited_tokens == prefix.tokens
        assert len(rig.writer.staged) - staged_before == 2  # the copy, then the answer
        row = fetch_and_verify(
            result.receipt, rig.data_plane, expected_rollout_id=second.rollout_id
        )
        assert isinstance(row, LinearizedRollout), row
        copy = prefix_of(rig.data_plane, second.rollout_id).calls[0]
        assert copy.token_ids.tolist() == prefix.calls[0].token_ids.tolist()
        await backend.aclose()

    run(main)


def test_the_simulated_backend_with_many_thinking_calls_resumes_where_it_crashed() -> None:
    async def main() -> None:
        rig = make_rig()
        backend = SimulatedAgentBackend(
            GenerationConfig(workers=1, call_latency_s=0.0, latency_jitter=0.0),
            faults=FaultsConfig.only(worker_crash_rate=1.0),
            episodes=DigitTask(TASKS, TaskConfig(thinking_calls=3, reasoning_tokens=4)),
            seed=0,
            initial_weights=snapshot(),
            data_plane=rig.data_plane,
            stage_in_thread=False,
        )
        first = rig.request(5)
        failure_of(await backend.run_attempt(first, rig.writer), FailureReason.WORKER_CRASHED)
        # The crash came at its second call; the next attempt crashes its worker at its own
        # second call too, having staged two calls, and the third finishes the episode.
        second = retry_of(first, "b2")
        lost = await backend.run_attempt(
            second, rig.writer, prefix_of(rig.data_plane, first.rollout_id)
        )
        failure_of(lost, FailureReason.WORKER_CRASHED)
        prefix = prefix_of(rig.data_plane, second.rollout_id)
        assert len(prefix.calls) == 2
        backend.set_faults(FaultsConfig.only())
        third = retry_of(first, "b3")
        result = await backend.run_attempt(third, rig.writer, prefix)
        assert result.inherited_calls == 2 and len(result.receipt.manifest) == 4
        row = fetch_and_verify(result.receipt, rig.data_plane)
        assert isinstance(row, LinearizedRollout), row
        await backend.aclose()

    run(main)


def test_the_http_backend_continues_and_sends_only_the_calls_after_the_prefix() -> None:
    async def main() -> None:
        rig = make_http_rig(servers=1, budget=0, dead_after=100)
        server = rig.fleet[0]

        def fail_second(_server: object, body: dict[str, object]) -> httpx.Response | None:
            return httpx.Response(503) if server.calls == 2 else None

        server.hook = fail_second
        first = rig.request(2)
        outcome = await rig.backend.run_attempt(first, rig.writer)
        failure_of(outcome, FailureReason.SERVER_UNAVAILABLE)
        prefix = prefix_of(rig.data_plane, first.rollout_id)
        assert len(prefix.calls) == 1

        server.hook = None
        calls_before = server.calls
        second = retry_of(first, "b2")
        result = await rig.backend.run_attempt(second, rig.writer, prefix)
        assert server.calls - calls_before == 1  # the answer; the reasoning was inherited
        assert result.inherited_calls == 1
        row = fetch_and_verify(result.receipt, rig.data_plane)
        assert isinstance(row, LinearizedRollout), row
        extras = prefix_of(rig.data_plane, second.rollout_id).calls[0].extras
        assert extras is not None and extras["resumed_from"] == prefix.calls[0].staging_key
        assert extras["server"] == prefix.calls[0].extras["server"]  # type: ignore[index]
        assert HTTP_TASKS[2]["prompt_token_ids"] == row.token_ids[: row.prompt_len].tolist()
        await rig.backend.aclose()

    run(main)


def test_a_closed_backend_stages_nothing_and_says_it_is_closed() -> None:
    """Each backend checks that it is closed before it stages a prefix's calls again: a
    closed one returns the failure and writes no row."""

    async def main() -> None:
        sim = make_rig(FaultsConfig.only(attempt_failure_rate=1.0))
        http = make_http_rig(servers=1, budget=0, dead_after=100)
        server = http.fleet[0]
        server.hook = lambda _server, _body: httpx.Response(503) if server.calls == 2 else None
        cases = [
            (sim.writer, sim.data_plane, sim.backend, sim.request(9), "ATTEMPT_FAILED"),
            (http.writer, http.data_plane, http.backend, http.request(9), "SERVER_UNAVAILABLE"),
        ]
        for writer, plane, backend, first, lost_as in cases:
            lost = await backend.run_attempt(first, writer)
            failure_of(lost, FailureReason[lost_as])
            prefix = prefix_of(plane, first.rollout_id)
            assert prefix.calls
            await backend.aclose()
            staged = sorted(plane.keys(CaptureWriter.staging_partition))
            closed = await backend.run_attempt(retry_of(first, "2"), writer, prefix)
            failure_of(closed, FailureReason.BACKEND_CLOSED)
            assert sorted(plane.keys(CaptureWriter.staging_partition)) == staged

    run(main)
