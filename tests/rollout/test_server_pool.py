"""The server pool's states: death, no traffic to the dead, rejoin only with current weights."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from http_support import EventLog, FakeFleet, FakeServer, HttpRig, make_rig
from loopback_support import LoopbackServer
from rollout_support import snapshot

from rollout_recovery._clock import VirtualClockLoop, monotonic
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.errors import ConfigError, InvalidArgumentError
from rollout_recovery.rollout import AttemptResult, HttpConfig
from rollout_recovery.rollout._server_pool import ServerPool
from rollout_recovery.rollout._weight_sync import WEIGHT_SYNCS

# How long a test waits for a state it expects: generous, for a loaded 2-core machine.
GUARD_S = 30.0


def _states(rig: HttpRig) -> dict[str, str]:
    return rig.backend.pool.states()


def test_a_server_that_stops_answering_dies_and_gets_no_more_calls() -> None:
    async def scenario(rig: HttpRig) -> None:
        rig.backend.pool.start()
        await rig.events.wait(lambda: set(_states(rig).values()) == {"healthy"})
        dead = rig.fleet[0]
        dead.alive = False
        await rig.events.wait(lambda: _states(rig)[dead.url] == "dead")
        calls_before = dead.calls
        for i in range(6):
            await rig.backend.run_attempt(rig.request(i), rig.writer)
        assert dead.calls == calls_before
        await rig.backend.aclose()

    rig = make_rig(2, dead_after=2)
    asyncio.run(scenario(rig))
    transitions = [
        (d["from"], d["to"]) for s, d in rig.events.of("server_state") if s == rig.fleet[0].url
    ]
    assert ("joining", "healthy") in transitions
    assert transitions[-1][1] == "dead"
    assert rig.backend.server_stats()[rig.fleet[0].url].deaths == 1


def test_a_server_that_comes_back_rejoins_only_with_the_current_weights() -> None:
    async def scenario(rig: HttpRig) -> None:
        pool = rig.backend.pool
        pool.start()
        await rig.events.wait(lambda: set(_states(rig).values()) == {"healthy"})
        back = rig.fleet[0]
        back.alive = False
        await rig.events.wait(lambda: _states(rig)[back.url] == "dead")
        rig.backend.update_weights(3, snapshot(3))
        await rig.events.wait(lambda: pool.versions()[rig.fleet[1].url] == 3)
        # It answers probes again but refuses the push: it must stay out of rotation.
        back.version = 0  # a restarted server holds its initial weights
        back.refuse_pushes = True
        back.alive = True
        await rig.events.wait(lambda: _states(rig)[back.url] in ("recovering", "dead"))
        for i in range(4):
            await rig.backend.run_attempt(rig.request(i, weight_version=3), rig.writer)
        assert back.calls == 0
        assert all(e["server"] != back.url for e in _extras_after(rig, 0))
        calls_while_stale = back.calls
        back.refuse_pushes = False
        await rig.events.wait(lambda: _states(rig)[back.url] == "healthy")
        assert back.pushes[-1] == 3
        # Back in rotation: the least loaded server gets the next calls.
        for i in range(4):
            await rig.backend.run_attempt(rig.request(i, weight_version=3), rig.writer)
        assert back.calls > calls_while_stale
        await rig.backend.aclose()

    rig = make_rig(2, dead_after=2)
    asyncio.run(scenario(rig))
    assert rig.backend.server_stats()[rig.fleet[0].url].rejoins == 1


def _extras_after(rig: HttpRig, _: int) -> list[dict[str, Any]]:
    from rollout_recovery.capture import CaptureWriter

    keys = rig.data_plane.keys(CaptureWriter.staging_partition)
    return [
        row.metadata["extras"] for row in rig.data_plane.get(CaptureWriter.staging_partition, keys)
    ]


def test_a_joining_server_that_never_confirms_the_weights_gets_no_traffic() -> None:
    async def scenario(rig: HttpRig) -> None:
        rig.fleet[0].refuse_pushes = True
        for i in range(4):
            await rig.backend.run_attempt(rig.request(i), rig.writer)
        await rig.backend.aclose()

    rig = make_rig(2, dead_after=1000)
    asyncio.run(scenario(rig))
    assert rig.fleet[0].calls == 0 and rig.fleet[1].calls == 8
    assert rig.backend.pool.states()[rig.fleet[0].url] != "healthy"


def test_without_version_tracking_every_answering_server_is_current() -> None:
    async def scenario(rig: HttpRig) -> None:
        for i in range(4):
            await rig.backend.run_attempt(rig.request(i, weight_version=9), rig.writer)
        await rig.backend.aclose()

    rig = make_rig(2, weight_sync="none")
    asyncio.run(scenario(rig))
    assert rig.fleet[0].pushes == [] and rig.fleet[1].pushes == []
    # Stamped with the dispatch version: the client's only knowledge.
    assert {e["dispatch_weight_version"] for e in _extras_after(rig, 0)} == {9}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("per_server_concurrency", 0),
        ("dead_after_failures", 0),
        ("probe_interval_s", 0.0),
        ("probe_timeout_s", -1.0),
        ("bad_data_quarantine_s", 0.0),
    ],
)
def test_a_bad_pool_knob_is_refused_where_the_config_is_read(field: str, value: Any) -> None:
    # The pool takes [http] as read: validated once, at the boundary.
    with pytest.raises(ConfigError) as caught:
        config_from_builtins({"http": {field: value}})
    assert caught.value.path == f"$.http.{field}"


@pytest.mark.parametrize(
    ("servers", "field"),
    [(["http://a:1", "http://a:1/"], "$.http.servers[1]"), (["ftp://a:1"], "$.http.servers[0]")],
    ids=["duplicate", "not-http"],
)
def test_bad_server_lists_are_refused_where_the_config_is_read(
    servers: list[str], field: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_builtins({"http": {"servers": servers}})
    assert caught.value.path == field


def test_a_pool_needs_a_server() -> None:
    # [http] servers may be empty (the job launches servers and lists them): the pool
    # itself is built with at least one.
    with pytest.raises(InvalidArgumentError, match="server"):
        ServerPool(HttpConfig(), weight_sync=WEIGHT_SYNCS["none"], client=httpx.AsyncClient())


# ------------------------------------------------- total deadlines, per-server probes


async def _drip_and_restart(probe_timeout_s: float) -> tuple[dict[str, str], int]:
    """Two loopback servers: one drips every /health reply, the other is stopped until
    the pool has it dead, then started again on the same port. Returns the states once
    the restarted one is healthy again, and its rejoin count."""
    drip, restarted = LoopbackServer(), LoopbackServer()
    drip.behaviour["/health"] = "drip"
    await drip.start()
    await restarted.start()
    events = EventLog()
    async with httpx.AsyncClient() as client:
        pool = ServerPool(
            HttpConfig(
                servers=(drip.url, restarted.url),
                probe_interval_s=0.05,
                probe_timeout_s=probe_timeout_s,
                dead_after_failures=2,
            ),
            weight_sync=WEIGHT_SYNCS["none"],
            client=client,
            on_event=events,
        )
        try:
            pool.start()
            await events.wait(lambda: pool.states()[restarted.url] == "healthy", GUARD_S)
            await restarted.stop()
            await events.wait(lambda: pool.states()[restarted.url] == "dead", GUARD_S)
            await restarted.restart()
            await events.wait(lambda: pool.states()[restarted.url] == "healthy", GUARD_S)
            if probe_timeout_s < GUARD_S:
                await events.wait(lambda: pool.states()[drip.url] == "dead", GUARD_S)
            return pool.states(), pool.stats()[restarted.url].rejoins
        finally:
            await pool.aclose()
            await drip.stop()
            await restarted.stop()


def test_a_probe_has_a_total_deadline_so_a_dripping_server_is_marked_dead() -> None:
    """Every read of a dripped /health reply succeeds: only a deadline on the whole probe
    ends it, and the server is marked dead like one that does not answer."""
    states, rejoins = asyncio.run(_drip_and_restart(probe_timeout_s=0.5))
    assert list(states.values()) == ["dead", "healthy"] and rejoins == 1


def test_a_slow_probe_never_delays_another_servers_probes_or_rejoin() -> None:
    """Each server is probed by its own task: while one probe hangs (its deadline far
    off), another server dies, comes back and rejoins."""
    states, rejoins = asyncio.run(_drip_and_restart(probe_timeout_s=10 * GUARD_S))
    assert list(states.values()) == ["joining", "healthy"] and rejoins == 1


def test_a_weight_push_that_never_completes_is_cut_and_retried() -> None:
    """A push whose reply drips is cut at sync_timeout_s in total; the next probe pushes
    again, and the server joins once a push goes through."""

    async def scenario() -> tuple[str, int | None, int]:
        server = LoopbackServer()
        server.script["/update_weights"] = ["drip"]
        await server.start()
        events = EventLog()
        async with httpx.AsyncClient() as client:
            pool = ServerPool(
                HttpConfig(servers=(server.url,), probe_interval_s=0.05, sync_timeout_s=0.5),
                weight_sync=WEIGHT_SYNCS["policy"],
                client=client,
                on_event=events,
            )
            pool.set_weights(0, snapshot(0))
            try:
                pool.start()
                await events.wait(lambda: pool.states()[server.url] == "healthy", GUARD_S)
                return pool.states()[server.url], server.version, server.requests["/update_weights"]
            finally:
                await pool.aclose()
                await server.stop()

    state, version, pushes = asyncio.run(scenario())
    assert (state, version) == ("healthy", 0)
    assert pushes == 2  # the dripped one, cut, then one that went through


def test_a_weight_push_reply_that_is_garbage_counts_as_a_failed_push() -> None:
    """A push reply nested past any sane depth is no version, not an exception in the
    sync task: the push fails, and the server never joins."""

    def nested(fleet: FakeFleet) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/update_weights" and request.url.host == "fake0":
                # In a field no one reads (skipping it still recurses), and under the
                # reply cap, so it is decoded.
                nested = b"[" * 20_000 + b"]" * 20_000
                return httpx.Response(200, content=b'{"x": ' + nested + b"}")
            return fleet.handle(request)

        return httpx.MockTransport(handle)

    async def scenario(rig: HttpRig) -> None:
        rig.backend.pool.start()
        await rig.events.wait(lambda: _states(rig)[rig.fleet[1].url] == "healthy")
        await rig.events.wait(
            lambda: any(
                d.get("version") is None
                for s, d in rig.events.of("weights_loaded")
                if s == rig.fleet[0].url
            )
        )
        await rig.backend.aclose()

    rig = make_rig(2, transport=nested)
    asyncio.run(scenario(rig))
    assert _states(rig)[rig.fleet[0].url] != "healthy"


# ---------------------------------------------------- bad replies count against health


def _html(server: FakeServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, text="<html><body>It works!</body></html>")


async def _attempts_until(rig: HttpRig, done: Callable[[], bool], limit: int = 50) -> None:
    """Run attempts one by one until ``done()``; before each, wait until the garbage
    server is no longer suspect (a probe revived it, or it is dead), so each attempt sees
    a settled pool."""
    bad = rig.fleet[0].url
    for i in range(limit):
        if done():
            return
        await rig.events.wait(lambda: _states(rig)[bad] not in ("suspect", "joining"), GUARD_S)
        await rig.backend.run_attempt(rig.request(i % 20), rig.writer)
    raise AssertionError(f"not done after {limit} attempts: {_states(rig)}")


def test_a_server_answering_garbage_is_taken_out_of_rotation() -> None:
    """A server that answers every call with 200 and an HTML page still answers its
    probes: K bad replies in a row and it is dead, quarantined, and gets no more calls."""

    async def scenario(rig: HttpRig) -> list[AttemptResult]:
        rig.backend.pool.start()
        await rig.events.wait(lambda: set(_states(rig).values()) == {"healthy"}, GUARD_S)
        await _attempts_until(rig, lambda: _states(rig)[rig.fleet[0].url] == "dead")
        after = [await rig.backend.run_attempt(rig.request(i), rig.writer) for i in range(8)]
        await rig.backend.aclose()
        return after

    rig = make_rig(2, dead_after=3)
    rig.fleet[0].hook = _html
    after = asyncio.run(scenario(rig))
    bad = rig.fleet[0].url
    assert rig.fleet[0].calls == 3  # K calls, then none
    assert all(not result.mask_sample for result in after)
    [(server, event)] = rig.events.of("server_bad_data")
    assert server == bad
    assert event == {"reason": "malformed_reply", "in_a_row": 3, "quarantine_s": 30.0}
    telemetry = rig.backend.telemetry()["servers"]
    assert telemetry[bad]["state"] == "dead" and telemetry[bad]["data_failures"] == 3
    assert telemetry[rig.fleet[1].url]["data_failures"] == 0


def test_refused_requests_say_nothing_about_the_server() -> None:
    """A 4xx is the request's fault (any server would refuse it): it trains as a masked
    row, and never takes the server out of rotation."""

    async def scenario(rig: HttpRig) -> None:
        for i in range(8):
            await rig.backend.run_attempt(rig.request(i), rig.writer)
        await rig.backend.aclose()

    rig = make_rig(1, dead_after=2)
    rig.fleet[0].hook = lambda server, body: httpx.Response(
        400, json={"error": {"message": "bad sampling params"}}
    )
    asyncio.run(scenario(rig))
    assert rig.fleet[0].calls == 8
    assert _states(rig)[rig.fleet[0].url] == "healthy"
    assert rig.events.of("server_bad_data") == []
    assert rig.backend.server_stats()[rig.fleet[0].url].data_failures == 8


def test_a_quarantined_server_rejoins_on_probation() -> None:
    """After its quarantine a garbage server rejoins like any dead one, but one more bad
    reply takes it straight out again; a good reply clears its record. On a virtual
    clock: each quarantine lasts exactly ``bad_data_quarantine_s`` (up to one probe)."""
    quarantine_s, probe_s = 30.0, 0.5
    out_for: list[float] = []

    async def scenario(rig: HttpRig) -> None:
        pool, bad = rig.backend.pool, rig.fleet[0]
        pool.start()
        await _attempts_until(rig, lambda: _states(rig)[bad.url] == "dead")
        died = monotonic()  # attempts over MockTransport take no virtual time
        # The quarantine passes; it rejoins with the current weights, and gets the next
        # call (it has had the fewest).
        await rig.events.wait(lambda: pool.stats()[bad.url].rejoins == 1, 2 * quarantine_s)
        out_for.append(monotonic() - died)
        await rig.backend.run_attempt(rig.request(0), rig.writer)
        assert bad.calls == 3 and pool.stats()[bad.url].deaths == 2
        died = monotonic()
        bad.hook = None  # fixed
        await rig.events.wait(lambda: pool.stats()[bad.url].rejoins == 2, 2 * quarantine_s)
        out_for.append(monotonic() - died)
        for i in range(6):
            await rig.backend.run_attempt(rig.request(i), rig.writer)
        assert bad.calls > 3
        await rig.backend.aclose()

    rig = make_rig(2, dead_after=2, bad_data_quarantine_s=quarantine_s, probe_interval_s=probe_s)
    rig.fleet[0].hook = _html
    loop = VirtualClockLoop(autojump=True)
    try:
        loop.run_until_complete(scenario(rig))
    finally:
        loop.close()
    assert len(out_for) == 2
    assert all(quarantine_s <= seconds <= quarantine_s + 2 * probe_s for seconds in out_for)
    assert [e["in_a_row"] for _, e in rig.events.of("server_bad_data")] == [2, 3]
    assert _states(rig)[rig.fleet[0].url] == "healthy"


def _servers_by_attempt(rig: HttpRig) -> dict[str, set[str]]:
    """The servers that answered each staged attempt's calls (their extras say)."""
    from rollout_recovery.capture import CaptureWriter

    keys = rig.data_plane.keys(CaptureWriter.staging_partition)
    answered: dict[str, set[str]] = {}
    for row in rig.data_plane.get(CaptureWriter.staging_partition, keys):
        answered.setdefault(row.metadata["rollout_id"], set()).add(row.metadata["extras"]["server"])
    return answered


def test_the_servers_of_rows_the_trainer_refused_are_blamed_and_leave_rotation() -> None:
    """Item 12: an attempt's calls stay on one server, so a row is one server's; the
    servers of rows whose logprobs the trainer refused are marked like a server caught
    lying about its weights, but one that alone answered a row the trainer cleared (it
    only shared a row with the liar), and a row not remembered is counted, not guessed."""

    async def scenario(rig: HttpRig) -> tuple[list[str], int, dict[str, set[str]]]:
        rig.backend.pool.start()
        await rig.events.wait(lambda: set(_states(rig).values()) == {"healthy"}, GUARD_S)
        for i in range(6):
            await rig.backend.run_attempt(rig.request(i), rig.writer)
        answered = _servers_by_attempt(rig)
        liar, honest = rig.fleet[0].url, rig.fleet[1].url
        guilty = [r for r, servers in answered.items() if servers == {liar}]
        cleared = [r for r, servers in answered.items() if servers == {honest}]
        rig.backend._answered("mixed", liar)  # a row redispatched between the two
        rig.backend._answered("mixed", honest)
        blamed = rig.backend.blame_servers(
            [*guilty, "mixed", "restored_before_a_restart"], cleared=cleared, step=3
        )
        calls = rig.fleet[0].calls
        for i in range(4):
            await rig.backend.run_attempt(rig.request(i), rig.writer)
        assert rig.fleet[0].calls == calls  # out of rotation
        await rig.backend.aclose()
        return *blamed, answered

    rig = make_rig(2, dead_after=3)
    servers, untraced, answered = asyncio.run(scenario(rig))
    liar, honest = rig.fleet[0].url, rig.fleet[1].url
    assert all(len(servers) == 1 for servers in answered.values()), answered
    assert {url for servers in answered.values() for url in servers} == {liar, honest}
    assert (servers, untraced) == ([liar], 1)
    assert [s for s, _ in rig.events.of("server_logprob_mismatch")] == [liar]
    [(server, event)] = rig.events.of("server_bad_data")
    assert server == liar and event["reason"] == "logprob_mismatch" and event["in_a_row"] == 1
    assert _states(rig) == {liar: "dead", honest: "healthy"}
