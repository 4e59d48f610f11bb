"""The HTTP backend over httpx.MockTransport: capture, cross-checks, failure classes."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from http_support import (
    LOGPROB,
    FakeFleet,
    FakeServer,
    HttpRig,
    completion,
    generated_for,
    make_rig,
)
from loopback_support import LoopbackServer
from rollout_support import failure_of

from rollout_recovery._clock import VirtualClockLoop
from rollout_recovery.capture import CaptureWriter, LinearizedRollout, Rejection
from rollout_recovery.capture._verify import fetch_and_verify
from rollout_recovery.policy._tasks import ANSWER, ANSWER_TOKENS, VOCAB_SIZE
from rollout_recovery.rollout import AttemptFailure, AttemptResult, FailureReason
from rollout_recovery.rollout._wire import CallSpec

# How long a test waits for what it expects: generous, for a loaded 2-core machine.
GUARD_S = 30.0


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def _attempt(rig: HttpRig, idx: int = 0, **kwargs: Any) -> AttemptResult | AttemptFailure:
    try:
        return await rig.backend.run_attempt(rig.request(idx, **kwargs), rig.writer)
    finally:
        await rig.backend.aclose()


def _verified(rig: HttpRig, result: AttemptResult) -> LinearizedRollout:
    verified = fetch_and_verify(
        result.receipt, rig.data_plane, expected_rollout_id=result.rollout_id
    )
    assert isinstance(verified, LinearizedRollout), verified
    return verified


def _rejection(rig: HttpRig, result: AttemptResult) -> Rejection:
    verified = fetch_and_verify(
        result.receipt, rig.data_plane, expected_rollout_id=result.rollout_id
    )
    assert isinstance(verified, Rejection), verified
    return verified


def _staged_extras(rig: HttpRig) -> list[dict[str, Any]]:
    keys = sorted(rig.data_plane.keys(CaptureWriter.staging_partition))
    return [
        row.metadata["extras"] for row in rig.data_plane.get(CaptureWriter.staging_partition, keys)
    ]


# -------------------------------------------------------------------------- happy path


def test_an_episode_is_captured_token_exact_with_its_extras() -> None:
    rig = make_rig(2)
    result = run(_attempt(rig, 3))
    verified = _verified(rig, result)
    prompt = list(rig.request(3).prompt["prompt_token_ids"])
    thoughts = generated_for(prompt, 4)
    answer = generated_for([*prompt, *thoughts, ANSWER], 2)
    assert verified.token_ids.tolist() == [*prompt, *thoughts, ANSWER, *answer]
    assert verified.logprobs[verified.token_mask == 1].tolist() == [LOGPROB] * 6
    assert result.reward == 1.0 and result.generated_tokens == 6
    first, second = (e for e in _staged_extras(rig) if e["endpoint"] == "/v1/completions")
    assert {first["server"], second["server"]} <= set(rig.fleet.servers)
    assert first["sampling_params"]["max_tokens"] in (2, 4)
    assert first["logprob_mode"] == "raw_logprobs"
    assert first["dispatch_weight_version"] == 0 and first["redispatches"] == 0


def test_calls_are_stamped_with_the_version_the_server_confirmed() -> None:
    from rollout_support import snapshot

    async def scenario(rig: HttpRig) -> AttemptResult:
        rig.backend.pool.start()
        await rig.events.wait(lambda: all(s.version == 0 for s in rig.fleet.servers.values()))
        rig.backend.update_weights(5, snapshot(5))
        await rig.events.wait(
            lambda: all(v == 5 for v in rig.backend.pool.versions().values()), timeout=10
        )
        return await _attempt(rig, 1, weight_version=5)

    rig = make_rig(2)
    result = run(scenario(rig))
    assert _verified(rig, result).max_weight_version == 5
    assert all(server.pushes[-1] == 5 for server in rig.fleet.servers.values())


def test_a_backend_built_in_the_loop_pushes_only_the_weights_a_restore_sets() -> None:
    # run_job builds the backend inside the running loop, and a restore then sets the
    # restored weights before anything is sent: no server loads the initial weights.
    from rollout_support import snapshot

    async def scenario() -> HttpRig:
        rig = make_rig(2)
        await asyncio.sleep(1.0)  # virtual: the restore reads its checkpoint meanwhile
        rig.backend.update_weights(5, snapshot(5))  # what a restore does
        await rig.events.wait(
            lambda: all(v == 5 for v in rig.backend.pool.versions().values()), timeout=10
        )
        await rig.backend.aclose()
        return rig

    loop = VirtualClockLoop(autojump=True)
    try:
        rig = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert all(server.pushes == [5] for server in rig.fleet.servers.values())


# ----------------------------------------------------------------------- infra failures


def _failing_with(response: httpx.Response | type[Exception]) -> Any:
    def hook(server: FakeServer, body: dict[str, Any]) -> httpx.Response | None:
        if isinstance(response, httpx.Response):
            return response
        raise response("boom")  # type: ignore[call-arg]

    return hook


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(httpx.Response(500, json={"error": {"message": "engine dead"}}), id="500"),
        pytest.param(httpx.Response(503, text="overloaded"), id="503"),
        pytest.param(httpx.Response(429, json={"error": {"message": "slow down"}}), id="429"),
        pytest.param(httpx.ReadTimeout, id="timeout"),
        pytest.param(httpx.RemoteProtocolError, id="reset"),
        pytest.param(httpx.ConnectError, id="refused"),
    ],
)
def test_an_infra_failure_is_redispatched_to_another_server(failure: Any) -> None:
    rig = make_rig(2, dead_after=100)
    rig.fleet[0].hook = _failing_with(failure)
    rig.fleet[1].hook = None
    results = run(_many(rig, 4))
    for result in results:
        assert _verified(rig, result).token_ids.size > 0
    assert rig.backend.redispatches >= 1
    bad, good = rig.fleet[0].url, rig.fleet[1].url
    stats = rig.backend.server_stats()
    assert stats[bad].infra_failures == rig.backend.redispatches
    assert stats[good].infra_failures == 0
    # Every staged call was served by the good server, and says how often it moved.
    extras = _staged_extras(rig)
    assert {e["server"] for e in extras} == {good}
    assert sum(e["redispatches"] for e in extras) == rig.backend.redispatches


async def _many(rig: HttpRig, count: int) -> list[AttemptResult]:
    try:
        return [await rig.backend.run_attempt(rig.request(i), rig.writer) for i in range(count)]
    finally:
        await rig.backend.aclose()


def test_an_exhausted_redispatch_budget_fails_the_attempt_with_nothing_staged() -> None:
    rig = make_rig(2, budget=2, dead_after=100)
    for server in rig.fleet.servers.values():
        server.hook = _failing_with(httpx.Response(502, text="bad gateway"))
    failure = failure_of(run(_attempt(rig)), FailureReason.SERVER_UNAVAILABLE)
    assert "2 redispatches" in failure.detail
    assert rig.data_plane.keys(CaptureWriter.staging_partition) == []
    assert rig.backend.redispatches == 2


def test_a_fleet_that_stays_down_fails_attempts_instead_of_waiting_forever() -> None:
    """On a virtual clock: the attempt waits ``no_server_wait_s`` for a live server,
    then fails; not sooner, not later, however loaded the machine."""
    wait_s = 30.0
    rig = make_rig(2, no_server_wait_s=wait_s, dead_after=1, probe_interval_s=0.5)
    for server in rig.fleet.servers.values():
        server.alive = False
    loop = VirtualClockLoop(autojump=True)
    try:
        outcome = loop.run_until_complete(_attempt(rig))
    finally:
        loop.close()
    failure_of(outcome, FailureReason.NO_LIVE_SERVER)
    assert loop.time() == pytest.approx(wait_s, abs=0.5)  # aclose after it takes no time


# ------------------------------------------------------------------------ data failures


def _data_failure(hook: Any) -> tuple[HttpRig, AttemptResult]:
    rig = make_rig(1)
    rig.fleet[0].hook = hook
    return rig, run(_attempt(rig))


def _assert_sealed_failure(rig: HttpRig, result: AttemptResult, reason: str) -> None:
    assert result.receipt.capture_poisoned is True
    assert result.receipt.failure_reason == f"data_error:{reason}"
    assert result.mask_sample is True
    assert _rejection(rig, result).reason == f"capture_poisoned:data_error:{reason}"
    assert rig.backend.redispatches == 0  # the same request would be refused again
    assert rig.backend.server_stats()[rig.fleet[0].url].data_failures == 1


def test_a_4xx_seals_a_failed_attempt_with_its_reason() -> None:
    rig, result = _data_failure(
        _failing_with(httpx.Response(400, json={"error": {"message": "bad sampling params"}}))
    )
    _assert_sealed_failure(rig, result, "http_400")


def test_a_context_overflow_is_a_data_failure() -> None:
    message = "This model's maximum context length is 512 tokens. However, you requested 900 tokens"
    rig, result = _data_failure(
        _failing_with(httpx.Response(400, json={"error": {"message": message, "code": 400}}))
    )
    _assert_sealed_failure(rig, result, "context_overflow")


def _answer_only(change: Any) -> Any:
    """Break only the answer call, so the failed attempt has one staged call."""

    def hook(server: FakeServer, body: dict[str, Any]) -> httpx.Response | None:
        prompt = body["prompt"]
        if prompt[-1] != ANSWER:
            return None
        tokens = generated_for(prompt, body["max_tokens"])
        return httpx.Response(200, json=change(prompt, tokens))

    return hook


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param(
            lambda p, t: completion(p[:-1], t), "token_mismatch", id="prompt-echo-differs"
        ),
        pytest.param(
            lambda p, t: completion(p, t, token_ids=[t[0] + 1, *t[1:]]),
            "token_mismatch",
            id="token-ids-differ-from-logprob-tokens",
        ),
        pytest.param(
            lambda p, t: completion(p, [*t, *t]), "token_mismatch", id="more-than-max-tokens"
        ),
        pytest.param(
            lambda p, t: completion(
                p, t, logprobs={"tokens": [f"token_id:{x}" for x in t], "token_logprobs": [-1.0]}
            ),
            "token_mismatch",
            id="logprob-count",
        ),
        pytest.param(
            lambda p, t: completion(
                p, t, logprobs={"tokens": [str(x) for x in t], "token_logprobs": [-1.0] * len(t)}
            ),
            "token_mismatch",
            id="logprob-tokens-not-token-ids",
        ),
        pytest.param(
            lambda p, t: completion(
                p, t, logprobs={"tokens": [f"token_id:{x}" for x in t], "token_logprobs": [0.5, -1]}
            ),
            "invalid_logprobs",
            id="positive-logprob",
        ),
        pytest.param(
            lambda p, t: completion(p, t, prompt_token_ids=None), "malformed_reply", id="no-echo"
        ),
        pytest.param(lambda p, t: completion(p, []), "empty_generation", id="empty"),
        pytest.param(lambda p, t: {"choices": []}, "malformed_reply", id="no-choice"),
        pytest.param(
            lambda p, t: completion(
                p,
                [2**31, *t[1:]],
                logprobs={
                    "tokens": [f"token_id:{x}" for x in [2**31, *t[1:]]],
                    "token_logprobs": [-1.0] * len(t),
                },
            ),
            "token_out_of_vocab",
            id="token-id-beyond-int32",
        ),
        pytest.param(
            lambda p, t: completion(
                p,
                t,
                logprobs={"tokens": [f"token_id:{x}" for x in t], "token_logprobs": [-1e300, -1]},
            ),
            "invalid_logprobs",
            id="logprob-not-finite-in-float32",
        ),
    ],
)
def test_a_reply_that_disagrees_with_itself_is_a_data_failure(change: Any, reason: str) -> None:
    rig, result = _data_failure(_answer_only(change))
    _assert_sealed_failure(rig, result, reason)
    # The reasoning call that did stage is listed, so finalization can clear its row.
    assert len(result.receipt.manifest) == 1


def test_a_non_json_200_is_a_data_failure() -> None:
    rig, result = _data_failure(_failing_with(httpx.Response(200, text="<html>")))
    _assert_sealed_failure(rig, result, "malformed_reply")


def test_a_call_the_controller_gives_up_on_is_no_verdict_on_its_server() -> None:
    """A deadline (the controller cancels the attempt) says nothing about the server: it
    stays healthy and nothing counts against it."""

    def slow(fleet: FakeFleet) -> httpx.MockTransport:
        async def handle(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/v1/completions":
                await asyncio.Event().wait()  # never answers
            return fleet.handle(request)

        return httpx.MockTransport(handle)

    rig = make_rig(1, dead_after=1, transport=slow)

    async def scenario() -> None:
        try:
            rig.backend.pool.start()
            await rig.events.wait(
                lambda: rig.backend.pool.states() == {rig.fleet[0].url: "healthy"}
            )
            for i in range(3):
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await rig.backend.run_attempt(rig.request(i), rig.writer)
        finally:
            await rig.backend.aclose()

    run(scenario())
    stats = rig.backend.server_stats()[rig.fleet[0].url]
    assert stats.infra_failures == 0 and stats.deaths == 0
    assert rig.backend.pool.states()[rig.fleet[0].url] == "healthy"


# ------------------------------------------------------------- hostile replies (issue 15)


def _reply_with(content: Any, status: int = 200) -> Any:
    def hook(server: FakeServer, body: dict[str, Any]) -> httpx.Response | None:
        return httpx.Response(status, content=content)

    return hook


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="nested-100k"),
        pytest.param(b'{"choices": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", id="nested-5k"),
        pytest.param(
            b'{"usage": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001, id="nested-unread-field"
        ),
        pytest.param(b'{"choices": [{"token_ids": "\xff\xfe"}]}', id="invalid-utf8"),
        pytest.param(b"<html><body>It works!</body></html>", id="html"),
        pytest.param(b"", id="empty"),
        pytest.param(b'{"choices": [{"token_ids": [1.5]}]}', id="float-id"),
        pytest.param(b'{"choices": [{"token_ids": [true]}]}', id="bool-id"),
        pytest.param(b'{"choices": {"0": {}}}', id="wrong-shape"),
    ],
)
def test_any_undecodable_reply_is_a_malformed_reply(content: bytes) -> None:
    rig, result = _data_failure(_reply_with(content))
    _assert_sealed_failure(rig, result, "malformed_reply")


def test_a_deeply_nested_error_body_is_still_a_classified_refusal() -> None:
    _, result = _data_failure(_reply_with(b"[" * 100_000 + b"]" * 100_000, status=400))
    assert result.receipt.failure_reason == "data_error:http_400"


def _flood(pulled: list[int], total: int, chunk: int = 2**20) -> Any:
    """A 200 whose body is ``total`` bytes, produced only as the client pulls them."""

    async def body() -> Any:
        sent = 0
        while sent < total:
            sent += chunk
            pulled[0] = sent
            yield b" " * chunk

    def hook(server: FakeServer, request: dict[str, Any]) -> httpx.Response | None:
        return httpx.Response(200, content=body())

    return hook


def test_an_oversize_reply_is_refused_at_the_cap_without_reading_the_rest() -> None:
    pulled = [0]
    rig, result = _data_failure(_flood(pulled, 100 * 2**20))
    _assert_sealed_failure(rig, result, "reply_too_large")
    # The default cap for a short call is a few MiB: at most one chunk past it was read.
    cap = rig.backend._reply_cap(CallSpec(prompt_token_ids=[0] * 16, max_tokens=4))
    assert 2**20 < cap < 8 * 2**20
    assert pulled[0] <= cap + 2**20


def test_a_declared_oversize_reply_is_refused_before_its_body() -> None:
    pulled = [0]

    def hook(server: FakeServer, request: dict[str, Any]) -> httpx.Response | None:
        response = _flood(pulled, 100 * 2**20)(server, request)
        response.headers["content-length"] = str(100 * 2**20)
        return response

    rig = make_rig(1, max_reply_bytes=10_000)
    rig.fleet[0].hook = hook
    result = run(_attempt(rig))
    _assert_sealed_failure(rig, result, "reply_too_large")
    assert pulled[0] == 0


def test_max_reply_bytes_bounds_every_reply() -> None:
    # A normal reply is a few hundred bytes: a cap of 100 refuses it.
    rig, result = _data_failure(None)
    assert result.mask_sample is False
    rig = make_rig(1, max_reply_bytes=100)
    _assert_sealed_failure(rig, run(_attempt(rig)), "reply_too_large")


def test_a_flooding_server_has_its_connection_dropped_at_the_cap() -> None:
    """Over a real socket: the client hangs up after the cap, so the server cannot send
    the rest of its 100 MiB."""

    async def scenario() -> tuple[AttemptResult, LoopbackServer]:
        server = LoopbackServer(flood_bytes=100 * 2**20)
        server.behaviour["/v1/completions"] = "flood"
        await server.start()
        rig = make_rig(urls=[server.url], weight_sync="none", dead_after=100)
        try:
            result = await rig.backend.run_attempt(rig.request(0), rig.writer)
            async with asyncio.timeout(GUARD_S):
                await server.flood_cut.wait()
            return result, server
        finally:
            await rig.backend.aclose()
            await server.stop()

    result, server = run(scenario())
    assert result.receipt.failure_reason == "data_error:reply_too_large"
    assert server.flooded[0] < 50 * 2**20


# ------------------------------------------------------------ vocabulary (issue 15, item 13)


@pytest.mark.parametrize(
    ("bad_id", "position"),
    [
        pytest.param(VOCAB_SIZE, 0, id="vocab-size"),
        pytest.param(10**6, ANSWER_TOKENS - 1, id="far-out"),
        pytest.param(-1, 0, id="negative"),
        pytest.param(2**31, 0, id="beyond-int32"),
    ],
)
def test_a_generated_id_outside_the_trainers_vocabulary_is_a_data_failure(
    bad_id: int, position: int
) -> None:
    def change(prompt: list[int], tokens: list[int]) -> dict[str, Any]:
        bad = list(tokens)
        bad[position] = bad_id
        return completion(
            prompt,
            bad,
            logprobs={
                "tokens": [f"token_id:{x}" for x in bad],
                "token_logprobs": [-1.0] * len(bad),
            },
        )

    rig, result = _data_failure(_answer_only(change))
    _assert_sealed_failure(rig, result, "token_out_of_vocab")
    # Only the reasoning call staged; the refused ids never reached the data plane.
    assert len(result.receipt.manifest) == 1
    staged = rig.data_plane.get(
        CaptureWriter.staging_partition, rig.data_plane.keys(CaptureWriter.staging_partition)
    )
    assert all(int(row.token_ids.max()) < VOCAB_SIZE for row in staged)
    # The event names the id and its position.
    [(_, event)] = rig.events.of("call_data_failed")
    assert event["reason"] == "token_out_of_vocab"
    assert f"choices[0].token_ids[{position}] is {bad_id}," in str(event["detail"])


def test_an_echoed_prompt_id_outside_the_vocabulary_is_a_data_failure() -> None:
    def change(prompt: list[int], tokens: list[int]) -> dict[str, Any]:
        return completion([*prompt[:-1], VOCAB_SIZE + 3], tokens)

    rig, result = _data_failure(_answer_only(change))
    _assert_sealed_failure(rig, result, "token_out_of_vocab")


# ------------------------------------------------------------ total deadlines (item 17)


def test_a_reply_dripped_byte_by_byte_is_cut_at_the_call_deadline_and_resent() -> None:
    """Over real sockets: every read of the dripped reply succeeds, so only a deadline on
    the whole call ends it; the call is an infra failure and is resent to the other
    server, and the attempt trains."""

    async def scenario() -> tuple[list[AttemptResult], HttpRig, LoopbackServer]:
        drip, healthy = LoopbackServer(), LoopbackServer()
        drip.behaviour["/v1/completions"] = "drip"
        await drip.start()
        await healthy.start()
        rig = make_rig(
            urls=[drip.url, healthy.url],
            weight_sync="none",
            dead_after=100,
            probe_interval_s=0.05,
            request_timeout_s=0.5,
        )
        try:
            rig.backend.pool.start()
            await rig.events.wait(
                lambda: set(rig.backend.pool.states().values()) == {"healthy"}, GUARD_S
            )
            async with asyncio.timeout(GUARD_S):
                results = [
                    await rig.backend.run_attempt(rig.request(i), rig.writer) for i in range(3)
                ]
            return results, rig, drip
        finally:
            await rig.backend.aclose()
            await drip.stop()
            await healthy.stop()

    results, rig, drip = run(scenario())
    for result in results:
        assert _verified(rig, result).token_ids.size > 0
    assert drip.requests["/v1/completions"] >= 1
    assert rig.backend.server_stats()[drip.url].infra_failures >= 1
    errors = [str(detail["error"]) for _, detail in rig.events.of("call_redispatched")]
    assert errors and all("no complete reply within 0.5 s" in error for error in errors)
