"""The LLM job on vLLM servers, built from its config alone, against a fake vLLM server
(``tests/vllm/vllm_fake.py`` behind ``httpx.MockTransport``): no vLLM needed.

``[trainer] kind = "torch"``, ``[task] kind = "emit_token"``, ``[generation] backend =
"http"`` and ``[http] weight_sync = "vllm"`` must give the torch trainer, the emit-token
episodes on the HTTP backend (one call per attempt: the task's prompt, ``max_tokens``,
the trainer's temperature) and the vLLM weight sync loading every version into the
server. The real servers run the same job in ``tests/integration/llm``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from vllm_fake import FakeVllmFleet

from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.job import run_job
from rollout_recovery.job._components import default_components
from rollout_recovery.llm._emit_task import EmitTokenTask
from rollout_recovery.llm._model_source import model_directory
from rollout_recovery.llm._trainer import TorchGRPOTrainer
from rollout_recovery.policy._tasks import THOUGHT_BASE
from rollout_recovery.rollout import HttpGenerationBackend

SERVER = "http://vllm0:8000"
STEPS = 3
MAX_TOKENS = 4


def _config(model_cache: Path, **http: object) -> dict[str, Any]:
    return {
        "job": {
            "steps": STEPS,
            "prompts_per_step": 2,
            "generations_per_prompt": 2,
            "staleness_window": 0,
        },
        # The fake generates THOUGHT_BASE, THOUGHT_BASE + 1, ...: a quarter of 4 tokens.
        "task": {"kind": "emit_token", "target_token": THOUGHT_BASE, "max_tokens": MAX_TOKENS},
        "model": {"source": "tiny-llama", "cache_dir": str(model_cache)},
        # The fake's logprobs are no model's (``logprob_of(version)``): at the default
        # tolerance every step was refused and the server quarantined for 30 s after it.
        "trainer": {"kind": "torch", "learning_rate": 5e-3, "logprob_tolerance": 100.0},
        "generation": {"backend": "http", "attempt_deadline_s": 60.0},
        "http": {"weight_sync": "vllm", "servers": [SERVER], **http},
        "checkpoint": {"every_steps": 2},
    }


def test_the_llm_job_runs_on_vllm_servers_from_its_config_alone(
    tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = FakeVllmFleet(1)
    completions: list[dict[str, Any]] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions":
            completions.append(json.loads(request.content))
        return await fleet.handle(request)

    # The backend makes its own client: every client made while the job runs talks to
    # the fake server.
    real_client = httpx.AsyncClient

    def fake_client(*args: Any, **kwargs: Any) -> httpx.AsyncClient:
        return real_client(*args, **{**kwargs, "transport": httpx.MockTransport(handle)})

    monkeypatch.setattr(httpx, "AsyncClient", fake_client)
    config = config_from_builtins(_config(model_cache))
    run = tmp_path / "run"
    result = run_job(run, config)
    assert result.summary.steps == STEPS

    # Every version was loaded into the server before it generated with it: the initial
    # weights first, then the version each step produced.
    loads = [line for line in fleet[0].log if line.startswith("loaded ")]
    assert loads[:STEPS] == [f"loaded {v}" for v in range(STEPS)]
    assert (run / "servers" / "weights").is_dir()  # [vllm] weights_dir, in the run

    # One call per attempt: an emit-token prompt of the task, max_tokens, the trainer's
    # temperature (1.0), token ids in.
    model = model_directory(config.model)
    bos = json.loads((model / "config.json").read_text())["bos_token_id"]
    task = EmitTokenTask(4096, seed=0, vocab_size=333, target_token=THOUGHT_BASE, bos_token_id=bos)
    prompts = {tuple(task[i]["prompt_token_ids"]) for i in range(4096)}
    attempts = STEPS * 2 * 2
    assert len(completions) >= attempts
    for body in completions:
        assert tuple(body["prompt"]) in prompts
        assert body["max_tokens"] == MAX_TOKENS and body["temperature"] == 1.0

    # The reward is the task's: a quarter of the fake's 4 tokens are the target.
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(STEPS))
    assert all(m["mean_reward"] == pytest.approx(0.25) for m in metrics), metrics[0]


def test_the_llm_components_on_http_are_the_trainer_and_the_emit_token_episodes(
    model_cache: Path, tmp_path: Path
) -> None:
    config = config_from_builtins(_config(model_cache))
    # What run_job resolves before it builds the components: where weight files go.
    weights_dir = str(tmp_path / "weights")
    config = msgspec.structs.replace(
        config, vllm=msgspec.structs.replace(config.vllm, weights_dir=weights_dir)
    )
    parts = default_components(config, MemoryDataPlane())
    assert isinstance(parts.trainer, TorchGRPOTrainer)
    assert isinstance(parts.dataset, EmitTokenTask)
    assert isinstance(parts.backend, HttpGenerationBackend)
    assert parts.backend._temperature == parts.trainer.temperature
    assert parts.backend._vocab_size == parts.trainer.vocab_size == 333
    assert list(parts.backend.pool.versions()) == [SERVER]
