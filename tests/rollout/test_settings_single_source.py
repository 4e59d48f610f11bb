"""A knob's default is written once, next to its TOML field, and every pool and backend
knob can be set from TOML (issue 16: defaults written twice disagreed, some knobs could
not be set at all)."""

from __future__ import annotations

import asyncio
import dataclasses

from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.policy import NumpyGRPOTrainer, TaskConfig, TaskSet
from rollout_recovery.rollout import GenerationConfig, HttpConfig, HttpGenerationBackend
from rollout_recovery.rollout._http_backend import HttpBackendSettings
from rollout_recovery.rollout._server_pool import PoolSettings

# The pool's field names against [http]'s, where they differ.
_POOL_TO_HTTP = {"concurrency": "per_server_concurrency"}
# The pool's fields another section owns.
_NOT_HTTP = {"on_weight_update"}


def test_the_pool_and_backend_defaults_are_the_toml_defaults() -> None:
    http, task = HttpConfig(), TaskConfig()
    pool = PoolSettings()
    for field in dataclasses.fields(PoolSettings):
        if field.name in _NOT_HTTP:
            continue
        assert getattr(pool, field.name) == getattr(http, _POOL_TO_HTTP.get(field.name, field.name))
    assert pool.on_weight_update == GenerationConfig().on_weight_update
    settings = HttpBackendSettings(model="m", pool=pool, vocab_size=8)
    for name in ("request_timeout_s", "call_redispatch_budget", "redispatch_backoff_s"):
        assert getattr(settings, name) == getattr(http, name), name
    assert settings.logprob_mode == http.logprob_mode
    assert (settings.thinking_calls, settings.reasoning_tokens) == (
        task.thinking_calls,
        task.reasoning_tokens,
    )


def test_every_pool_knob_is_set_from_toml() -> None:
    changed = {
        "per_server_concurrency": 5,
        "probe_interval_s": 0.25,
        "probe_timeout_s": 0.75,
        "dead_after_failures": 7,
        "sync_timeout_s": 4.5,
        "no_server_wait_s": 12.0,
        "bad_data_quarantine_s": 9.0,
    }
    config = config_from_builtins({"http": {**changed, "servers": ["http://127.0.0.1:9"]}})
    backend = HttpGenerationBackend.from_config(
        config.http,
        generation=config.generation,
        task=config.task,
        vocab_size=8,
        task_set=TaskSet.from_config(config.task, seed=0),
        initial_version=0,
        initial_weights=NumpyGRPOTrainer(seed=0).weights(),
    )
    pool = backend.settings.pool
    asyncio.run(backend.aclose())
    for field in dataclasses.fields(PoolSettings):
        if field.name in _NOT_HTTP:
            continue
        http_name = _POOL_TO_HTTP.get(field.name, field.name)
        assert getattr(pool, field.name) == changed[http_name], field.name
