"""The official ``openai`` client talks to the server as to vLLM, token in and token out."""

from __future__ import annotations

import openai
import pytest

from rollout_recovery.policy._tasks import BOS, THINK, THOUGHT_BASE, digit_token
from rollout_recovery.serve import PolicyServer
from rollout_recovery.serve._app import WEIGHT_VERSION_HEADER

PROMPT = [BOS, digit_token(7), THINK]


@pytest.fixture
def client(server: PolicyServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def test_token_ids_and_logprobs_come_back(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model=PolicyServer.DEFAULT_MODEL_NAME,
        prompt=PROMPT,
        max_tokens=4,
        logprobs=0,
        seed=13,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True},
    )
    choice = completion.choices[0]
    extra = choice.model_extra or {}
    token_ids = extra["token_ids"]
    assert extra["prompt_token_ids"] == PROMPT
    assert len(token_ids) == 4
    assert all(THOUGHT_BASE <= t < THOUGHT_BASE + 8 for t in token_ids)
    assert choice.logprobs is not None
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in token_ids]
    token_logprobs = choice.logprobs.token_logprobs
    assert token_logprobs is not None and len(token_logprobs) == 4
    assert all(lp < 0 for lp in token_logprobs)
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (3, 4)


def test_the_weight_version_header_reaches_the_client(client: openai.OpenAI) -> None:
    raw = client.completions.with_raw_response.create(
        model=PolicyServer.DEFAULT_MODEL_NAME, prompt=PROMPT, max_tokens=1
    )
    assert raw.headers[WEIGHT_VERSION_HEADER] == "0"
    assert raw.parse().choices[0].text


def test_the_model_is_listed(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [PolicyServer.DEFAULT_MODEL_NAME]
    assert models.data[0].owned_by == "rollout-recovery"


def test_refusals_are_the_clients_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(
            model=PolicyServer.DEFAULT_MODEL_NAME, prompt=PROMPT, max_tokens=2, temperature=0.5
        )
    assert "temperature" in str(refused.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt=PROMPT, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="token-in only"):
        client.completions.create(
            model=PolicyServer.DEFAULT_MODEL_NAME, prompt="<bos> 7", max_tokens=2
        )
