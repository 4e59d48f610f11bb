"""A server's word on its weights, checked: replies and probes against what it confirmed.

Issue 24 item 11: a server that acknowledged every push but never loaded one was trusted
(20 steps trained on version-0 samples while each reply said ``X-Weight-Version: 0``).
Item 13: spans naming a version the job never had (9223372036854775807 while it was at 8)
were trained. Item 14: a Unicode digit (``"²"``) in a version field stopped the run, or
silently killed the task that pushes a server its weights.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from http_support import FakeFleet, FakeServer, HttpRig, generated_for, generation, make_rig
from rollout_support import snapshot

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.rollout import AttemptResult
from rollout_recovery.rollout._http_backend import _check_named_versions
from rollout_recovery.rollout._wire import DataFailure

GUARD_S = 30.0


def _staged_versions(rig: HttpRig) -> list[int]:
    keys = sorted(rig.data_plane.keys(CaptureWriter.staging_partition))
    rows = rig.data_plane.get(CaptureWriter.staging_partition, keys)
    return [row.metadata["weight_version"] for row in rows]


async def _confirmed(rig: HttpRig, version: int, server: FakeServer) -> None:
    """The trainer's weights ``version`` pushed; ``server`` confirmed them."""
    rig.backend.pool.start()
    rig.backend.update_weights(version, snapshot(version))
    await rig.events.wait(lambda: rig.backend.pool.versions()[server.url] == version, GUARD_S)


async def _attempts(rig: HttpRig, count: int, version: int) -> list[Any]:
    """``count`` attempts one after another, each dispatched at ``version``; then closed."""
    try:
        return [
            await rig.backend.run_attempt(rig.request(i, weight_version=version), rig.writer)
            for i in range(count)
        ]
    finally:
        await rig.backend.aclose()


def _sealed(result: Any, reason: str) -> None:
    assert isinstance(result, AttemptResult), result
    assert result.receipt.failure_reason == f"data_error:{reason}", result.receipt


# ------------------------------------------------------- item 11: acknowledged, not loaded


def test_a_server_whose_replies_name_older_weights_than_it_confirmed_is_not_trusted() -> None:
    """The issue's liar: it confirms version 1 but serves version 0, and says so in every
    reply's ``X-Weight-Version`` (it has no ``/weight_info`` to be caught by earlier)."""
    rig = make_rig(1, dead_after=3)
    liar = rig.fleet[0]
    liar.serves, liar.weight_info_route = 0, False

    async def scenario() -> Any:
        await _confirmed(rig, 1, liar)
        try:
            return await rig.backend.run_attempt(rig.request(0, weight_version=1), rig.writer)
        finally:
            await rig.backend.aclose()

    result = asyncio.run(scenario())
    _sealed(result, "weight_version_mismatch")  # its tokens are not trained as version 1
    assert 1 not in _staged_versions(rig)
    # Out at the first lie (no streak of three), and the run's events say why.
    assert rig.backend.pool.states()[liar.url] == "dead"
    [(server, event)] = rig.events.of("server_bad_data")
    assert (server, event["reason"]) == (liar.url, "weight_version_mismatch")
    assert rig.backend.pool.versions()[liar.url] is None  # must confirm again


def test_a_probe_finds_a_server_serving_other_weights_than_it_confirmed() -> None:
    """``/weight_info`` on every probe: the liar is out before it takes a call."""
    rig = make_rig(2, dead_after=3)
    liar, honest = rig.fleet[0], rig.fleet[1]
    liar.serves = 0

    async def scenario() -> list[Any]:
        rig.backend.pool.start()
        rig.backend.update_weights(1, snapshot(1))
        await rig.events.wait(lambda: bool(rig.events.of("server_weights_mismatch")), GUARD_S)
        await rig.events.wait(lambda: rig.backend.pool.versions()[honest.url] == 1, GUARD_S)
        return await _attempts(rig, 4, version=1)

    results = asyncio.run(scenario())
    [(server, event)] = rig.events.of("server_weights_mismatch")
    assert server == liar.url
    assert event == {"via": "/weight_info", "confirmed": 1, "named": "'0'"}
    assert all(isinstance(r, AttemptResult) and not r.mask_sample for r in results)
    assert liar.calls == 0 and honest.calls == 8


def test_an_honest_server_is_never_taken_for_a_liar() -> None:
    rig = make_rig(2, dead_after=1)

    async def scenario() -> list[Any]:
        await _confirmed(rig, 1, rig.fleet[0])
        await _confirmed(rig, 1, rig.fleet[1])
        return await _attempts(rig, 6, version=1)

    results = asyncio.run(scenario())
    assert all(isinstance(r, AttemptResult) and not r.mask_sample for r in results)
    assert set(rig.backend.pool.states().values()) == {"healthy"}
    assert rig.events.of("server_weights_mismatch") == rig.events.of("server_bad_data") == []
    assert set(_staged_versions(rig)) == {1}


@pytest.mark.parametrize(
    ("named", "confirmed", "newest", "reason"),
    [
        (["3"], 3, 3, None),
        (["3", "4"], 3, 5, None),  # a push landed during the call: its word
        (["step-4"], 3, 4, None),
        ([], 3, 3, None),  # a dialect and server that say nothing
        (["2"], 3, 3, "weight_version_mismatch"),
        (["3", "2"], 3, 3, "weight_version_mismatch"),
        (["4"], 3, 3, "unversioned_tokens"),
        (["9223372036854775807"], 8, 8, "unversioned_tokens"),
        (["²"], 3, 3, "unversioned_tokens"),
        (["None"], 3, 3, "unversioned_tokens"),
        (["-1"], None, 3, "unversioned_tokens"),
        (["0"], None, 3, None),  # nothing confirmed: only the newest bounds it
    ],
)
def test_the_versions_a_reply_names_lie_between_what_was_confirmed_and_the_newest(
    named: list[object], confirmed: int | None, newest: int, reason: str | None
) -> None:
    if reason is None:
        _check_named_versions(named, confirmed=confirmed, newest=newest)
        return
    with pytest.raises(DataFailure) as failure:
        _check_named_versions(named, confirmed=confirmed, newest=newest)
    assert failure.value.reason == reason and failure.value.blames_server


# -------------------------------------------- item 13: spans of a version the job never had


def _spans_of(version: str) -> Any:
    def hook(server: FakeServer, body: dict[str, Any]) -> httpx.Response | None:
        prompt = body["token_ids"]
        tokens = generated_for(prompt, body["sampling_params"]["max_tokens"])
        reply = generation(prompt, tokens, 0)
        reply["choices"][0]["weight_versions"][0]["version"] = version
        return httpx.Response(200, json=reply)

    return hook


@pytest.mark.parametrize("mode", ["interrupt", "continue"])
@pytest.mark.parametrize("version", ["9223372036854775807", "²", "step-٣", "1" * 5000])
def test_spans_naming_a_version_the_job_never_had_are_unversioned_tokens(
    mode: str, version: str
) -> None:
    rig = make_rig(1, dialect="vllm-generate", on_weight_update=mode)
    rig.fleet[0].hook = _spans_of(version)

    async def scenario() -> Any:
        rig.backend.pool.start()
        await rig.events.wait(lambda: rig.backend.pool.versions()[rig.fleet[0].url] == 0)
        try:
            return await rig.backend.run_attempt(rig.request(0), rig.writer)
        finally:
            await rig.backend.aclose()

    result = asyncio.run(scenario())
    _sealed(result, "unversioned_tokens")
    assert _staged_versions(rig) == []  # nothing staged under a version we never had
    assert rig.backend.pool.states()[rig.fleet[0].url] == "dead"


# --------------------------------------------- item 14: a Unicode digit in a version field


def test_a_push_reply_naming_a_unicode_digit_is_a_failed_push_not_a_dead_task() -> None:
    def unicode_version(fleet: FakeFleet) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            response = fleet.handle(request)
            if request.url.path == "/update_weights" and request.url.host == "fake0":
                return httpx.Response(200, json={"weight_version": "²"})
            return response

        return httpx.MockTransport(handle)

    rig = make_rig(2, transport=unicode_version)

    async def scenario() -> None:
        rig.backend.pool.start()
        # Pushed again and again (each probe retries): the task lives on.
        await rig.events.wait(
            lambda: (
                len([d for s, d in rig.events.of("weights_loaded") if s == rig.fleet[0].url]) >= 2
            ),
            GUARD_S,
        )
        await rig.backend.aclose()

    asyncio.run(scenario())
    loaded = [d["version"] for s, d in rig.events.of("weights_loaded") if s == rig.fleet[0].url]
    assert set(loaded) == {None}
    assert rig.backend.pool.states()[rig.fleet[0].url] != "healthy"


def test_weight_info_naming_a_unicode_digit_is_a_mismatch() -> None:
    def unicode_info(fleet: FakeFleet) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/weight_info":
                return httpx.Response(200, json={"weight_version": "²"})
            return fleet.handle(request)

        return httpx.MockTransport(handle)

    rig = make_rig(1, transport=unicode_info)

    async def scenario() -> None:
        rig.backend.pool.start()
        await rig.events.wait(lambda: bool(rig.events.of("server_weights_mismatch")), GUARD_S)
        await rig.backend.aclose()

    asyncio.run(scenario())
    [(_, event)] = rig.events.of("server_weights_mismatch")
    assert event["named"] == "'²'"
