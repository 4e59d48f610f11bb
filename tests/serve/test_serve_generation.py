"""The generation rule: what is sampled, from which table, with which logprob, reproducibly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_recovery.policy import NumpyGRPOTrainer, PolicySnapshot
from rollout_recovery.policy._tasks import (
    ANSWER,
    BOS,
    DIGIT_BASE,
    EOS,
    FILLER_BASE,
    NUM_DIGITS,
    NUM_THOUGHT,
    THINK,
    THOUGHT_BASE,
    VOCAB_SIZE,
    digit_token,
    render,
)
from rollout_recovery.serve import PolicyServer, ServeSettings
from rollout_recovery.serve._app import WEIGHT_VERSION_HEADER

SEED = 3
PROMPT = [BOS, FILLER_BASE + 1, digit_token(6), FILLER_BASE + 5, THINK]
ANSWER_PROMPT = [*PROMPT, THOUGHT_BASE, THOUGHT_BASE + 2, ANSWER]


def _snapshot() -> PolicySnapshot:
    return NumpyGRPOTrainer(seed=SEED).weights()


def _complete(client: httpx.Client, prompt: list[int], **fields: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "return_token_ids": True, **fields}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    choice: dict[str, Any] = response.json()["choices"][0]
    return choice


def test_the_served_weights_are_the_trainers_initial_weights(server: PolicyServer) -> None:
    expected = _snapshot()
    assert server.weights.version == 0
    for name, table in expected.params.items():
        assert np.array_equal(server.weights.params[name], table)


def test_reasoning_samples_thoughts_like_the_policy_with_the_seed(client: httpx.Client) -> None:
    choice = _complete(client, PROMPT, max_tokens=7, seed=42, logprobs=0)
    tokens, logprobs = _snapshot().sample_reasoning(6, 7, np.random.default_rng(42))
    assert choice["token_ids"] == tokens
    assert choice["logprobs"]["token_logprobs"] == logprobs
    assert choice["finish_reason"] == "length"
    assert choice["text"] == render(tokens)


def test_an_answer_is_digit_then_eos_and_stops(client: httpx.Client) -> None:
    choice = _complete(client, ANSWER_PROMPT, max_tokens=16, seed=9, logprobs=0)
    tokens, logprobs = _snapshot().sample_answer(6, np.random.default_rng(9))
    assert choice["token_ids"] == tokens
    assert DIGIT_BASE <= tokens[0] < DIGIT_BASE + NUM_DIGITS and tokens[1] == EOS
    assert choice["logprobs"]["token_logprobs"] == logprobs
    assert choice["finish_reason"] == "stop"
    cut = _complete(client, ANSWER_PROMPT, max_tokens=1, seed=9)
    assert cut["token_ids"] == tokens[:1]
    assert cut["finish_reason"] == "length"


def test_a_seeded_request_is_reproducible_and_the_seed_matters(client: httpx.Client) -> None:
    first = _complete(client, PROMPT, max_tokens=12, seed=5, logprobs=2)
    again = _complete(client, PROMPT, max_tokens=12, seed=5, logprobs=2)
    other = _complete(client, PROMPT, max_tokens=12, seed=6, logprobs=2)
    assert first == again
    assert first["token_ids"] != other["token_ids"]
    # Both routes sample the same tokens for the same seed, as vLLM does.
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 12, "seed": 5}}
    generated = client.post("/inference/v1/generate", json=body).json()["choices"][0]
    assert generated["token_ids"] == first["token_ids"]


def test_a_negative_seed_is_its_unsigned_twin(client: httpx.Client) -> None:
    negative = _complete(client, PROMPT, max_tokens=8, seed=-1)
    unsigned = _complete(client, PROMPT, max_tokens=8, seed=2**64 - 1)
    assert negative["token_ids"] == unsigned["token_ids"]


def test_unseeded_requests_follow_the_servers_seed() -> None:
    def unseeded(seed: int) -> list[list[int]]:
        with (
            PolicyServer(ServeSettings(seed=seed)) as server,
            httpx.Client(base_url=server.url) as client,
        ):
            return [_complete(client, PROMPT, max_tokens=12)["token_ids"] for _ in range(3)]

    first, same, other = unseeded(1), unseeded(1), unseeded(2)
    assert first == same
    assert first[0] != first[1]  # each request draws afresh
    assert first != other


def test_logprobs_are_what_the_trainer_recomputes(client: httpx.Client) -> None:
    snapshot = _snapshot()
    for prompt in (PROMPT, ANSWER_PROMPT):
        choice = _complete(client, prompt, max_tokens=2, logprobs=0)
        row = [*prompt, *choice["token_ids"]]
        mask = [0.0] * len(prompt) + [1.0] * len(choice["token_ids"])
        recomputed = snapshot.token_logprobs(row, mask)[len(prompt) :]
        assert choice["logprobs"]["token_logprobs"] == [float(x) for x in recomputed]


def test_top_logprobs_list_the_sampled_token_then_the_most_likely(client: httpx.Client) -> None:
    snapshot = _snapshot()
    choice = _complete(client, PROMPT, max_tokens=6, seed=1, logprobs=3)
    table = snapshot.thought_logprobs[6]
    best = sorted(range(NUM_THOUGHT), key=lambda c: (-table[c], c))[:3]
    for token, entry in zip(choice["token_ids"], choice["logprobs"]["top_logprobs"], strict=True):
        keys = list(entry)
        assert keys[0] == render([token]) or keys[0] == f" {render([token])}"
        expected = [render([THOUGHT_BASE + c]) for c in best if THOUGHT_BASE + c != token]
        assert [k.strip() for k in keys[1:]] == expected[: len(keys) - 1]
        assert len(entry) == (3 if token - THOUGHT_BASE in best else 4)
        for key, value in entry.items():
            column = [render([THOUGHT_BASE + c]) for c in range(NUM_THOUGHT)].index(key.strip())
            assert value == table[column]


def test_a_token_the_policy_cannot_emit_has_the_floor_logprob(client: httpx.Client) -> None:
    body = {"token_ids": ANSWER_PROMPT, "sampling_params": {"max_tokens": 2, "logprobs": 3}}
    choice = client.post("/inference/v1/generate", json=body).json()["choices"][0]
    eos = choice["logprobs"]["content"][1]
    assert (eos["token_id"], eos["logprob"], eos["rank"]) == (EOS, 0.0, 1)
    others = eos["top_logprobs"][1:]
    assert [o["logprob"] for o in others] == [-9999.0, -9999.0]
    assert [o["token_id"] for o in others] == [0, 1]  # ties in id order
    assert [o["rank"] for o in others] == [2, 2]


def test_generate_ranks_count_the_more_likely_tokens(client: httpx.Client) -> None:
    table = _snapshot().thought_logprobs[6]
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 8, "logprobs": 0, "seed": 4}}
    choice = client.post("/inference/v1/generate", json=body).json()["choices"][0]
    for entry in choice["logprobs"]["content"]:
        column = entry["token_id"] - THOUGHT_BASE
        assert entry["rank"] == 1 + int(np.sum(table > table[column]))
        assert entry["top_logprobs"] == [
            {"token_id": entry["token_id"], "logprob": entry["logprob"], "rank": entry["rank"]}
        ]


def test_rendered_tokens_concatenate_to_the_text(client: httpx.Client) -> None:
    choice = _complete(client, PROMPT, max_tokens=5, logprobs=0)
    tokens = choice["logprobs"]["tokens"]
    assert "".join(tokens) == choice["text"]
    assert [t.strip() for t in tokens] == [render([t]) for t in choice["token_ids"]]
    offsets = choice["logprobs"]["text_offset"]
    assert [choice["text"][o:].split()[0] for o in offsets] == [t.strip() for t in tokens]


def test_token_ids_are_echoed_only_when_asked(client: httpx.Client) -> None:
    body = {"prompt": PROMPT, "max_tokens": 3}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["token_ids"] is None and choice["prompt_token_ids"] is None
    assert choice["logprobs"] is None


def test_a_prompt_in_a_one_element_list_is_taken(client: httpx.Client) -> None:
    nested = _complete(client, [PROMPT], max_tokens=4, seed=8)
    flat = _complete(client, PROMPT, max_tokens=4, seed=8)
    assert nested == flat
    assert nested["prompt_token_ids"] == PROMPT


def test_without_max_tokens_the_defaults_are_vllms() -> None:
    with (
        PolicyServer(ServeSettings(max_model_len=40)) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        completion = client.post("/v1/completions", json={"prompt": PROMPT}).json()
        assert completion["usage"]["completion_tokens"] == 16
        body = {"token_ids": PROMPT, "sampling_params": {}}
        generated = client.post("/inference/v1/generate", json=body).json()
        assert generated["usage"]["completion_tokens"] == 40 - len(PROMPT)
        body = {"prompt": PROMPT, "max_tokens": None}
        filled = client.post("/v1/completions", json=body).json()
        assert filled["usage"]["completion_tokens"] == 40 - len(PROMPT)


def test_every_generation_names_its_weight_version(client: httpx.Client) -> None:
    completion = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
    assert completion.headers[WEIGHT_VERSION_HEADER] == "0"
    assert "weight_version" not in completion.json()
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 3}}
    generated = client.post("/inference/v1/generate", json=body)
    assert generated.headers[WEIGHT_VERSION_HEADER] == "0"
    assert generated.json()["choices"][0]["weight_versions"] == [
        {"version": "0", "start": 0, "end": 3}
    ]
    assert WEIGHT_VERSION_HEADER not in client.get("/v1/models").headers


# -- the property ------------------------------------------------------------------------

MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def shared_client() -> Iterator[httpx.Client]:
    settings_ = ServeSettings(seed=SEED, max_model_len=MAX_MODEL_LEN)
    with PolicyServer(settings_) as server, httpx.Client(base_url=server.url) as client:
        yield client


@st.composite
def _requests(draw: st.DrawFn) -> dict[str, Any]:
    before = draw(st.lists(st.integers(0, VOCAB_SIZE - 1), max_size=20))
    after = draw(st.lists(st.integers(0, VOCAB_SIZE - 1), max_size=20))
    ending = draw(st.sampled_from([[], [THINK], [ANSWER]]))
    prompt = [*before, digit_token(draw(st.integers(0, NUM_DIGITS - 1))), *after, *ending]
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": draw(st.integers(1, MAX_MODEL_LEN - len(prompt))),
        "logprobs": draw(st.integers(0, 5)),
        "return_token_ids": True,
        "return_tokens_as_token_ids": draw(st.booleans()),
    }
    seed = draw(st.none() | st.integers(0, 2**64 - 1))
    if seed is not None:
        body["seed"] = seed
    return body


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=_requests())
def test_ids_logprob_tokens_logprobs_and_usage_agree(
    shared_client: httpx.Client, body: dict[str, Any]
) -> None:
    response = shared_client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    choice, usage = answer["choices"][0], answer["usage"]
    prompt, ids = body["prompt"], choice["token_ids"]
    logprobs = choice["logprobs"]
    assert choice["prompt_token_ids"] == prompt
    assert 1 <= len(ids) <= body["max_tokens"]
    if body["return_tokens_as_token_ids"]:
        assert logprobs["tokens"] == [f"token_id:{t}" for t in ids]
    else:
        assert [t.strip() for t in logprobs["tokens"]] == [render([t]) for t in ids]
    assert len(logprobs["token_logprobs"]) == len(ids) == len(logprobs["top_logprobs"])
    for token, value, entry in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert next(iter(entry.items())) == (token, value)
        assert len(entry) in {body["logprobs"], body["logprobs"] + 1}
    assert usage["prompt_tokens"] == len(prompt)
    assert usage["completion_tokens"] == len(ids)
    assert usage["total_tokens"] == len(prompt) + len(ids)
    # The logprobs are exactly what the trainer recomputes from the whole row.
    row, mask = [*prompt, *ids], [0.0] * len(prompt) + [1.0] * len(ids)
    recomputed = _snapshot().token_logprobs(row, mask)[len(prompt) :]
    assert logprobs["token_logprobs"] == [float(x) for x in recomputed]
    if prompt[-1] == ANSWER:
        assert ids == [ids[0], EOS][: len(ids)]
        assert choice["finish_reason"] == ("stop" if len(ids) == 2 else "length")
    else:
        assert len(ids) == body["max_tokens"]
        assert all(THOUGHT_BASE <= t < THOUGHT_BASE + NUM_THOUGHT for t in ids)
        assert choice["finish_reason"] == "length"
