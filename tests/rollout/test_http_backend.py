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

from rollout_recovery.capture import (
    STAGING_PARTITION,
    LinearizedRollout,
    Rejection,
    fetch_and_verify,
)
from rollout_recovery.errors import GenerationError
from rollout_recovery.policy import ANSWER
from rollout_recovery.rollout import AttemptResult


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def _attempt(rig: HttpRig, idx: int = 0, **kwargs: Any) -> AttemptResult:
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
    keys = sorted(rig.data_plane.keys(STAGING_PARTITION))
    return [row.metadata["extras"] for row in rig.data_plane.get(STAGING_PARTITION, keys)]


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
    with pytest.raises(GenerationError) as caught:
        run(_attempt(rig))
    assert caught.value.reason == "server_unavailable"
    assert "2 redispatches" in str(caught.value)
    assert rig.data_plane.keys(STAGING_PARTITION) == []
    assert rig.backend.redispatches == 2


def test_a_fleet_that_stays_down_fails_attempts_instead_of_waiting_forever() -> None:
    rig = make_rig(2, no_server_wait_s=0.2, dead_after=1)
    for server in rig.fleet.servers.values():
        server.alive = False
    with pytest.raises(GenerationError) as caught:
        run(_attempt(rig))
    assert caught.value.reason == "no_live_server"


# ------------------------------------------------------------------------ data failures


def _data_failure(hook: Any) -> tuple[HttpRig, AttemptResult]:
    rig = make_rig(1)
    rig.fleet[0].hook = hook
    return rig, run(_attempt(rig))


def _assert_sealed_failure(rig: HttpRig, result: AttemptResult, reason: str) -> None:
    assert result.receipt["capture_poisoned"] is True
    assert result.receipt["failure_reason"] == f"data_error:{reason}"
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
            lambda p, t: completion(p, t, prompt_token_ids=None), "malformed_response", id="no-echo"
        ),
        pytest.param(lambda p, t: completion(p, []), "empty_generation", id="empty"),
        pytest.param(lambda p, t: {"choices": []}, "malformed_response", id="no-choice"),
        pytest.param(
            lambda p, t: completion(
                p,
                [2**31, *t[1:]],
                logprobs={
                    "tokens": [f"token_id:{x}" for x in [2**31, *t[1:]]],
                    "token_logprobs": [-1.0] * len(t),
                },
            ),
            "malformed_response",
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
    assert len(result.receipt["manifest"]) == 1


def test_a_non_json_200_is_a_data_failure() -> None:
    rig, result = _data_failure(_failing_with(httpx.Response(200, text="<html>")))
    _assert_sealed_failure(rig, result, "malformed_response")


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
