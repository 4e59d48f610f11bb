"""The composition root: from the run config to the components a job plugs together.

:func:`default_components` builds what the config names through the run config's table of
backends (``control.BACKENDS``): the learner of ``[trainer]`` and ``[task]`` (the synthetic
tasks and the numpy GRPO policy, or the torch trainer and "emit token X") and the backend
``[generation] backend`` names (simulated agents, HTTP generation servers, Ray actors or
the trainer's model sampled in process). :func:`job_data_plane` opens the job's durable
row store (Ray's shards for a backend that needs Ray) and :func:`generation_servers`
starts local ``serve`` processes when a backend on HTTP servers has no server list (local
vLLM servers with ``[vllm] launch``). A user plugs their own dataset, backend and trainer
in through ``run_job(components=...)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec

from ..control import BACKENDS, PromptDataset, RunConfig
from ..dataplane import DataPlane, Row, SqliteDataPlane
from ..errors import ConfigError
from ..policy import Trainer
from ..rollout import GenerationBackend, HttpConfig
from ..rundir import RunDirectory
from ._server_fleet import LocalServerFleet

__all__ = [
    "JobComponents",
    "configured_api_key",
    "default_components",
    "generation_servers",
    "job_data_plane",
    "require_ray",
    "server_api_key",
    "wants_servers",
]

Weights = TypeVar("Weights")


@dataclass(slots=True)
class JobComponents(Generic[Weights]):
    """What a run plugs in: the dataset, a generation backend and a trainer.

    ``Weights`` ties the two: the backend loads what the trainer's ``weights()`` returns,
    and the type checker refuses a backend of other weights (a numpy policy's backend
    with a torch trainer). At run time the job does not check it.
    """

    dataset: PromptDataset
    backend: GenerationBackend[Weights]
    trainer: Trainer[Weights]
    #: What each step's metrics say about its completions (the LLM job's sample texts):
    #: called with the step and the canonical rows it trained (``Controller.samples``).
    samples: Callable[[int, Sequence[Row]], Mapping[str, Any]] | None = None


def default_components(config: RunConfig, data_plane: DataPlane) -> JobComponents[Any]:
    """What the config names: the learner of its trainer and task, and the backend of
    ``[generation] backend`` (``BACKENDS``), on the servers of ``config.http.servers``
    (which :func:`run_job` fills in when it starts local ones)."""
    api_key = server_api_key(config) if wants_servers(config) else None
    learner, backend = BACKENDS[config.generation.backend].build(
        config, data_plane=data_plane, api_key=api_key
    )
    return JobComponents(
        dataset=learner.dataset,
        backend=backend,
        trainer=learner.trainer,
        samples=learner.samples,
    )


# The key the HTTP backend presents, for the components built while run_job runs: the
# launched servers' key, or the value of [http] api_key_env. A context variable, not a
# config field: the config is written to job.toml and into every checkpoint, and the
# components see only the config.
_SERVER_API_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "server_api_key", default=None
)


def configured_api_key(http: HttpConfig) -> str | None:
    """The value of the variable ``[http] api_key_env`` names (None when it names none);
    a ``ConfigError`` naming the variable, never its value, when it is unset or empty."""
    if not http.api_key_env:
        return None
    key = os.environ.get(http.api_key_env, "")
    if not key:
        raise ConfigError(
            f"the environment variable {http.api_key_env} is unset or empty: export the "
            "servers' API key in it, or leave api_key_env empty",
            path="$.http.api_key_env",
        )
    return key


def wants_servers(config: RunConfig) -> bool:
    """Whether the job's backend generates through HTTP servers (directly or from Ray
    actors)."""
    return BACKENDS[config.generation.backend].uses_servers(config)


@contextlib.contextmanager
def _presenting(api_key: str | None) -> Iterator[None]:
    token = _SERVER_API_KEY.set(api_key)
    try:
        yield
    finally:
        _SERVER_API_KEY.reset(token)


def server_api_key(config: RunConfig) -> str | None:
    """The key the HTTP backend presents: the launched servers' own while :func:`run_job`
    runs, else the value of the variable ``[http] api_key_env`` names."""
    key = _SERVER_API_KEY.get()
    return key if key is not None else configured_api_key(config.http)


@contextlib.contextmanager
def job_data_plane(run: RunDirectory, config: RunConfig) -> Iterator[DataPlane]:
    """The job's durable store: one SQLite file, or, for a backend that runs on Ray, SQLite
    shards served by Ray actors (on a cluster this job attaches to or starts, and leaves as
    it found it)."""
    if not BACKENDS[config.generation.backend].needs_ray:
        with SqliteDataPlane(run.data_plane_file) as store:
            yield store
        return
    with config.ray.data_plane(run.shards_dir) as plane:
        yield plane


def require_ray(config: RunConfig) -> None:
    """Refuse, naming the extra, a backend that runs on Ray where Ray is not installed."""
    if not BACKENDS[config.generation.backend].needs_ray:
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(
            "needs Ray: pip install 'rollout-recovery[ray]'", path="$.generation.backend"
        ) from None


@contextlib.contextmanager
def generation_servers(
    run: RunDirectory, config: RunConfig, log: Callable[[str], None] = lambda _: None
) -> Iterator[RunConfig]:
    """The config the components see: with local servers started (and stopped on exit)
    when the HTTP backend has no server list (``[vllm] launch`` vLLM servers, else
    ``rollout-recovery serve`` processes), ``[vllm] weights_dir`` resolved for the vLLM
    weight sync, and an empty ``[vllm] model`` resolved to the torch trainer's. The job's
    own config keeps the empty list, so a resume, which starts
    new servers on new ports, is still the same job."""
    if not wants_servers(config):
        yield config
        return
    with _vllm_weights_dir(run, config, log) as resolved, _servers(run, resolved, log) as final:
        yield final


@contextlib.contextmanager
def _vllm_weights_dir(
    run: RunDirectory, config: RunConfig, log: Callable[[str], None] = lambda _: None
) -> Iterator[RunConfig]:
    """``[vllm] weights_dir`` resolved when empty: shared memory for launched servers (on
    this machine: a push touches no disk; removed when the job ends) where it has room
    for them and is private, else the run directory (listed servers may be elsewhere,
    with the run on a shared filesystem)."""
    if config.http.weight_sync != "vllm" or config.vllm.weights_dir:
        yield config
        return
    launched = config.vllm.launch > 0 and not config.http.servers
    model = Path(config.vllm.model) if config.vllm.model else None
    if launched and model is None:
        model = config.model.directory()  # the trainer's, which the servers start from
    with config.vllm.shared_memory_weights(
        run.root, enabled=launched, model=model, log=log, lock_file=run.lock_file
    ) as shared:
        weights_dir = str(shared if shared is not None else run.servers_dir / "weights")
        yield msgspec.structs.replace(
            config, vllm=msgspec.structs.replace(config.vllm, weights_dir=weights_dir)
        )


@contextlib.contextmanager
def _servers(
    run: RunDirectory, config: RunConfig, log: Callable[[str], None]
) -> Iterator[RunConfig]:
    http = config.http
    api_key = configured_api_key(http)
    if http.servers:
        with _presenting(api_key):
            yield config
        return
    if config.vllm.launch:
        if not config.vllm.model:
            # The torch trainer's own model (resolve_model prepared it): the servers must
            # start from the weights the trainer starts from.
            model = str(config.model.directory().resolve())
            config = msgspec.structs.replace(
                config, vllm=msgspec.structs.replace(config.vllm, model=model)
            )
        vllm_fleet = config.vllm.fleet(
            run.servers_dir,
            run.servers_file,
            served_model_name=http.model,
            api_key=api_key,
            log=log,
        )
        with vllm_fleet:
            urls = vllm_fleet.start()
            # Read after the start: adopted servers keep the key they were started with.
            with _presenting(vllm_fleet.api_key):
                yield msgspec.structs.replace(
                    config, http=msgspec.structs.replace(http, servers=tuple(urls))
                )
        return
    # Launched servers get the configured key (so an operator can restart one by hand),
    # else a random one of this job's.
    generation = config.generation
    # With interrupt a call must be able to stop between two tokens: the launched servers
    # spend its latency token by token (a thinking call's as long as before) instead of
    # all before the first.
    interrupt = generation.on_weight_update == "interrupt"
    fleet = LocalServerFleet(
        run.root,
        http.launch_servers,
        seed=config.job.seed,
        call_latency_s=0.0 if interrupt else generation.call_latency_s,
        token_latency_s=generation.call_latency_s / config.task.reasoning_tokens
        if interrupt
        else 0.0,
        model=http.model,
        api_key=api_key,
        api_key_env=http.api_key_env or None,
    )
    with fleet, _presenting(fleet.api_key):
        urls = fleet.start()
        yield msgspec.structs.replace(
            config, http=msgspec.structs.replace(http, servers=tuple(urls))
        )
