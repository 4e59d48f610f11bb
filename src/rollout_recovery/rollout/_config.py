"""``[generation]``, ``[faults]`` and ``[http]``: where rollouts come from.

Everything here is operational (it may change when a run resumes: more workers, another
server address, a longer timeout) except the backend kind, the served model's name and
the logprob mode, which change what the trainer sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from msgspec import Meta

from .._settings import (
    OPERATIONAL,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Rate,
    Section,
)
from ..errors import ConfigError
from ..serve import PolicyServer
from ._server_url import server_url_problem
from ._weight_sync import WeightSyncName
from ._wire import DialectName

__all__ = [
    "INTERRUPT_WEIGHT_SYNCS",
    "FaultsConfig",
    "GenerationConfig",
    "HttpConfig",
]

#: The weight syncs that can load weights under calls in flight and let them continue.
INTERRUPT_WEIGHT_SYNCS = frozenset({"policy", "vllm"})

ServerUrl = Annotated[str, Meta(pattern=r"^https?://[^\s/]+(/\S*)?$")]
EnvVarName = Annotated[str, Meta(pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")]


class GenerationConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[generation]``: the generation backend and its workers."""

    #: The generation backend: "simulated" (in-process agents with injected [faults]),
    #: "http" (real generation servers, configured in [http]; [faults] is not injected
    #: there: the servers' own failures are the faults), "ray" (generation actors and data
    #: shards on a Ray cluster, configured in [ray]; the [ray] extra) or "transformers" (the
    #: torch trainer's own model sampled in process; the [llm] extra, [task] kind
    #: "emit_token"). The run config checks the name against its table of backends
    #: (``control``'s ``BACKENDS``), which says what each one serves.
    backend: str = "simulated"
    #: Simulated workers (the simulated backend only).
    workers: Annotated[PositiveInt, OPERATIONAL] = 4
    max_inflight_attempts: Annotated[PositiveInt, OPERATIONAL] = 64
    #: Median latency of one simulated model call (an episode makes thinking_calls + 1).
    call_latency_s: Annotated[NonNegativeFloat, OPERATIONAL] = 0.04
    latency_jitter: Annotated[NonNegativeFloat, OPERATIONAL] = 0.5
    attempt_deadline_s: Annotated[PositiveFloat, OPERATIONAL] = 2.0
    #: What a model call in flight does when the trainer pushes new weights. "continue":
    #: it finishes under the weights it started with (an HTTP server whose weight sync is
    #: exclusive, real vLLM, gets its push only once its calls have ended). "interrupt":
    #: it stops between two tokens, the new weights are loaded, and the rest of it is
    #: generated under them (vLLM's /pause?mode=keep, load, /resume): nothing waits and
    #: nothing is thrown away; each token keeps the version and the logprob of the
    #: weights that generated it (the call's extras "weight_version_spans"; its staged
    #: version is its last token's). The simulated and http backends; http needs
    #: [http] dialect = "vllm-generate" (per-token spans) and weight_sync = "policy" or
    #: "vllm".
    on_weight_update: Annotated[Literal["continue", "interrupt"], OPERATIONAL] = "continue"

    def check_weight_update_mode(
        self, http: HttpConfig, *, interrupting: Sequence[str], servers: bool
    ) -> None:
        """Refuse ``on_weight_update = "interrupt"`` where it cannot be honoured, naming the
        field that stands in the way: ``interrupting`` names the backends that can
        interrupt a call, ``servers`` says whether this one generates through ``[http]``
        servers (whose dialect and weight sync must then interrupt too)."""
        if self.on_weight_update != "interrupt":
            return
        if self.backend not in interrupting:
            names = " or ".join(f'"{name}"' for name in interrupting)
            raise ConfigError(
                f'on_weight_update = "interrupt" needs [generation] backend = {names}; the '
                f"{self.backend!r} backend finishes every call under the weights it started "
                "with",
                path="$.generation.on_weight_update",
            )
        if not servers:
            return
        if http.dialect != "vllm-generate":
            raise ConfigError(
                f'on_weight_update = "interrupt" needs dialect = "vllm-generate": only its '
                f"replies say which tokens came from which weights (per-token "
                f"weight_versions); {http.dialect!r} does not",
                path="$.http.dialect",
            )
        if http.weight_sync not in INTERRUPT_WEIGHT_SYNCS:
            raise ConfigError(
                f'on_weight_update = "interrupt" needs weight_sync = "policy" or "vllm" (they '
                f"pause a server's calls, load, and resume them); {http.weight_sync!r} does not "
                "load weights",
                path="$.http.weight_sync",
            )


class FaultsConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[faults]``: injected fault rates (each in [0, 1]) of the simulated backend."""

    attempt_failure_rate: Annotated[Rate, OPERATIONAL] = 0.03
    straggler_rate: Annotated[Rate, OPERATIONAL] = 0.05
    straggler_factor: Annotated[float, Meta(ge=1), OPERATIONAL] = 8.0
    hang_rate: Annotated[Rate, OPERATIONAL] = 0.01
    capture_failure_rate: Annotated[Rate, OPERATIONAL] = 0.01
    tamper_rate: Annotated[Rate, OPERATIONAL] = 0.01
    worker_crash_rate: Annotated[Rate, OPERATIONAL] = 0.002
    worker_restart_s: Annotated[NonNegativeFloat, OPERATIONAL] = 0.2

    @classmethod
    def only(cls, **faults: float) -> FaultsConfig:
        """No fault but the ones given (``only()``: a fault-free environment), for what
        runs without the job's ``[faults]``: a test, a benchmark, a Ray spec's default."""
        none = {name: 0.0 for name in cls.__struct_fields__ if name.endswith("_rate")}
        return cls(**{**none, "straggler_factor": 1.0, "worker_restart_s": 0.0, **faults})


class HttpConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[http]``: the HTTP backend's servers (used when ``generation.backend = "http"``)."""

    #: Base URLs of running OpenAI-compatible servers. Empty: the job starts
    #: ``launch_servers`` local ``rollout-recovery serve`` processes itself and stops them.
    #: No credentials in them (they are recorded with every call): see ``api_key_env``.
    servers: Annotated[tuple[ServerUrl, ...], OPERATIONAL] = ()
    #: The name of an environment variable holding the servers' API key, sent as
    #: ``Authorization: Bearer`` (never recorded); "" for none. Launched servers get a
    #: random key of their own unless this names one.
    api_key_env: Annotated[EnvVarName, OPERATIONAL] = ""
    launch_servers: Annotated[PositiveInt, OPERATIONAL] = 3
    dialect: Annotated[DialectName, OPERATIONAL] = "vllm-completions"
    #: How servers get new weights: "policy" pushes the numpy policy (rollout-recovery
    #: serve), "version-tag" only tags a vLLM dev-mode server, "none" leaves them alone.
    weight_sync: Annotated[WeightSyncName, OPERATIONAL] = "policy"
    model: Annotated[str, Meta(min_length=1)] = PolicyServer.DEFAULT_MODEL_NAME
    per_server_concurrency: Annotated[PositiveInt, OPERATIONAL] = 16
    request_timeout_s: Annotated[PositiveFloat, OPERATIONAL] = 10.0
    #: How often one call is resent to another server after an infra failure.
    call_redispatch_budget: Annotated[NonNegativeInt, OPERATIONAL] = 3
    redispatch_backoff_s: Annotated[NonNegativeFloat, OPERATIONAL] = 0.05
    probe_interval_s: Annotated[PositiveFloat, OPERATIONAL] = 0.5
    probe_timeout_s: Annotated[PositiveFloat, OPERATIONAL] = 1.0
    #: Consecutive failed calls or probes after which a server counts as dead.
    dead_after_failures: Annotated[PositiveInt, OPERATIONAL] = 3
    #: How long a call waits for any healthy server before its attempt fails.
    no_server_wait_s: Annotated[PositiveFloat, OPERATIONAL] = 30.0
    #: A total deadline on one weight push to one server (the vLLM sync has its own,
    #: ``[vllm] sync_timeout_s``: a load takes longer).
    sync_timeout_s: Annotated[PositiveFloat, OPERATIONAL] = 10.0
    #: How long a server taken out for bad replies is left alone before a probe may
    #: bring it back.
    bad_data_quarantine_s: Annotated[PositiveFloat, OPERATIONAL] = 30.0
    logprob_mode: Literal["raw_logprobs", "processed_logprobs"] = "raw_logprobs"

    def check_server_urls(self) -> None:
        """Refuse a server URL that carries a secret (userinfo, a query, a fragment), and a
        server listed twice (its calls and health would be counted twice)."""
        seen: set[str] = set()
        for index, url in enumerate(self.servers):
            base = url.rstrip("/")
            if base in seen:
                raise ConfigError(
                    "a server is listed twice: list each server once",
                    path=f"$.http.servers[{index}]",
                )
            seen.add(base)
            problem = server_url_problem(url)
            if problem is not None:
                # The URL is not quoted back: it may hold the secret.
                raise ConfigError(
                    f"the server URL {problem}: URLs are recorded with every call (events, "
                    "metrics, every row), so a secret in one would be written out in clear "
                    "text. Give the URL without it, put the key in an environment variable "
                    "and name that variable in [http] api_key_env (sent as "
                    "Authorization: Bearer)",
                    path=f"$.http.servers[{index}]",
                )
