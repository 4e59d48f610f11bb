"""The HTTP backend's API key: sent with every request, never recorded; a server that
refuses it is an infra failure, never a row masked as bad data (issue 15 items 18, 19)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from http_support import EPISODES, TASKS, EventLog, FakeFleet, FakeServer, HttpRig, make_rig
from rollout_support import snapshot

from rollout_recovery._unix_http import private_socket_dir
from rollout_recovery.capture import CaptureWriter, LinearizedRollout
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.errors import ConfigError
from rollout_recovery.policy import NumpyGRPOTrainer, PolicySnapshot
from rollout_recovery.rollout import (
    AttemptFailure,
    AttemptRequest,
    FailureReason,
    GenerationConfig,
    HttpConfig,
    HttpGenerationBackend,
)
from rollout_recovery.rollout._http_backend import classify_status
from rollout_recovery.rollout._server_url import server_url_problem
from rollout_recovery.serve import PolicyServer, ServeSettings

KEY = "job-key_0123456789abcdef"


def _recording(seen: list[httpx.Request]) -> Any:
    def transport(fleet: FakeFleet) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return fleet.handle(request)

        return httpx.MockTransport(handle)

    return transport


def test_every_request_presents_the_key_and_nothing_records_it() -> None:
    seen: list[httpx.Request] = []

    async def scenario(rig: HttpRig) -> None:
        rig.backend.pool.start()  # probes
        await rig.events.wait(lambda: set(rig.backend.pool.states().values()) == {"healthy"})
        rig.backend.update_weights(2, snapshot(2))  # weight pushes
        await rig.events.wait(lambda: set(rig.backend.pool.versions().values()) == {2})
        for index in range(3):  # calls
            await rig.backend.run_attempt(rig.request(index, weight_version=2), rig.writer)
        await rig.backend.aclose()

    rig = make_rig(2, transport=_recording(seen), api_key=KEY)
    asyncio.run(scenario(rig))
    paths = {request.url.path for request in seen}
    assert {"/health", "/update_weights", "/v1/completions"} <= paths
    assert {request.headers.get("authorization") for request in seen} == {f"Bearer {KEY}"}
    # Nothing the backend records holds the key: events, telemetry, staged rows.
    recorded = repr(
        (
            rig.events.events,
            rig.backend.telemetry(),
            rig.backend.drain_events(),
            [
                row.metadata
                for row in rig.data_plane.get(
                    CaptureWriter.staging_partition,
                    sorted(rig.data_plane.keys(CaptureWriter.staging_partition)),
                )
            ],
        )
    )
    assert KEY not in recorded


def test_without_a_key_no_authorization_is_sent() -> None:
    seen: list[httpx.Request] = []

    async def scenario(rig: HttpRig) -> None:
        await rig.backend.run_attempt(rig.request(0), rig.writer)
        await rig.backend.aclose()

    asyncio.run(scenario(make_rig(1, transport=_recording(seen))))
    assert seen and all("authorization" not in request.headers for request in seen)


def test_the_key_is_kept_nowhere_but_the_client_headers() -> None:
    async def scenario() -> None:
        rig = make_rig(1, api_key=KEY)
        try:
            kept = {name: value for name, value in vars(rig.backend).items() if name != "_client"}
            assert KEY not in repr(kept)
        finally:
            await rig.backend.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("status", [401, 403, 421])
def test_a_server_that_refuses_this_client_is_an_infra_failure(status: int) -> None:
    refused = httpx.Response(status, json={"error": {"message": "no", "code": status}})
    assert classify_status(status, refused.json()) is None

    def refuse(server: FakeServer, body: dict[str, Any]) -> httpx.Response:
        return refused

    async def scenario(rig: HttpRig) -> list[Any]:
        try:
            return [await rig.backend.run_attempt(rig.request(i), rig.writer) for i in range(4)]
        finally:
            await rig.backend.aclose()

    rig = make_rig(2, dead_after=100)
    rig.fleet[0].hook = refuse
    results = asyncio.run(scenario(rig))
    # Resent to the server that takes the calls: no row masked as a data failure.
    for result in results:
        assert not result.mask_sample
        verified = fetch_and_verify(
            result.receipt, rig.data_plane, expected_rollout_id=result.rollout_id
        )
        assert isinstance(verified, LinearizedRollout)
    assert rig.backend.data_failures == {}
    assert rig.events.of("call_redispatched")


# -- against a real server with a key --------------------------------------------------------


def _backend(
    url: str, api_key: str | None, events: EventLog, *, no_server_wait_s: float = 30.0
) -> HttpGenerationBackend:
    trainer = NumpyGRPOTrainer(seed=0)
    return HttpGenerationBackend(
        HttpConfig(
            servers=(url,),
            model="rollout-recovery-numpy",
            probe_interval_s=0.05,
            no_server_wait_s=no_server_wait_s,
        ),
        generation=GenerationConfig(),
        episodes=EPISODES,
        vocab_size=trainer.vocab_size,
        api_key=api_key,
        stage_in_thread=False,
        initial_version=trainer.weight_version,
        initial_weights=trainer.weights(),
        on_event=events,
    )


def _request(index: int) -> AttemptRequest:
    return AttemptRequest(
        group_id=f"grp{index}",
        generation_index=0,
        rollout_id=f"grp{index}_g0_a1",
        prompt=TASKS[index],
        weight_version=0,
    )


def _takes_calls_and_weights(server: PolicyServer) -> None:
    """A backend with the server's key runs an attempt on it and pushes it version 1."""
    events = EventLog()

    async def scenario() -> None:
        backend = _backend(server.url, KEY, events)
        try:
            result = await backend.run_attempt(_request(0), CaptureWriter(MemoryDataPlane()))
            assert not result.mask_sample
            backend.update_weights(1, PolicySnapshot(1, NumpyGRPOTrainer(seed=9).weights().params))
            await events.wait(lambda: backend.pool.versions()[server.url] == 1, timeout=30)
        finally:
            await backend.aclose()

    asyncio.run(scenario())
    assert server.weights.version == 1


def test_a_keyed_server_takes_calls_and_weights_from_a_backend_with_its_key() -> None:
    with PolicyServer(ServeSettings(api_key=KEY)) as server:
        _takes_calls_and_weights(server)


def test_a_keyed_server_on_a_unix_socket_takes_calls_and_weights() -> None:
    """As a launched server listens (issue 24 item 10): its URL names its socket, and the
    backend's own client reaches it there, probes, calls and weight pushes alike."""
    sockets = private_socket_dir("rollout-recovery-test-")
    try:
        settings = ServeSettings(api_key=KEY, uds=str(sockets / "server-0.sock"))
        with PolicyServer(settings) as server:
            assert server.url.startswith("http+unix://localhost/")
            _takes_calls_and_weights(server)
    finally:
        sockets.rmdir()


def test_a_backend_with_another_key_never_gets_a_keyed_server_into_rotation() -> None:
    async def scenario(server: PolicyServer) -> None:
        backend = _backend(server.url, "not-the-key", EventLog(), no_server_wait_s=1.0)
        try:
            failure = await backend.run_attempt(_request(0), CaptureWriter(MemoryDataPlane()))
            assert isinstance(failure, AttemptFailure)
            assert failure.reason is FailureReason.NO_LIVE_SERVER
            assert "not-the-key" not in str(failure)
        finally:
            await backend.aclose()

    with PolicyServer(ServeSettings(api_key=KEY)) as server:
        asyncio.run(scenario(server))
        assert server.weights.version == 0


# -- URLs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://u:hunter2@h:1", "credentials"),
        ("http://hunter2@h:1", "credentials"),
        ("http://h:1/?key=hunter2", "query"),
        ("http://h:1/#hunter2", "fragment"),
        ("http://h:1", None),
        ("https://h.internal:8000/base/", None),
    ],
)
def test_a_url_with_a_secret_is_refused_without_quoting_it(url: str, problem: str | None) -> None:
    found = server_url_problem(url)
    assert (found is None) == (problem is None)
    if problem is None:
        return
    assert problem in found and "hunter2" not in found
    with pytest.raises(ConfigError) as caught:
        config_from_builtins({"http": {"servers": ["http://ok:1", url]}})
    assert caught.value.path == "$.http.servers[1]"
    assert "hunter2" not in str(caught.value)
