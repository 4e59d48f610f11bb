"""The job configuration: typed, frozen msgspec Structs read from one TOML file.

Every section is optional in the file and every field has a default, so an empty file (or
no file) is the default job. Decoding is one strict ``msgspec.convert`` of what
``tomllib`` parsed, so a refused value is reported with msgspec's message and its field
path (``$.faults.hang_rate: Expected `float` >= 0.0``), an unknown key with the path of
its section (``$.faults: Object contains unknown field `hang_rat```).

``config_to_toml`` writes the whole config back as TOML that ``load_config`` reads to an
equal config; a checkpoint stores ``config_to_builtins`` and a resume compares the job it
was started with against the stored one through ``config_differences``.
"""

from __future__ import annotations

import hashlib
import math
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from rollout_recovery.errors import ConfigError, InvalidArgumentTypeError, split_validation_path
from rollout_recovery.rollout import DialectName, WeightSyncName, server_url_problem
from rollout_recovery.serve import DEFAULT_MODEL_NAME

__all__ = [
    "CheckpointConfig",
    "FaultsConfig",
    "GenerationConfig",
    "HttpConfig",
    "JobConfig",
    "LivenessConfig",
    "PolicyConfig",
    "RayConfig",
    "RetryConfig",
    "RunConfig",
    "TaskConfig",
    "config_differences",
    "config_fingerprint",
    "config_from_builtins",
    "config_to_builtins",
    "config_to_toml",
    "load_config",
]

PositiveInt = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegativeFloat = Annotated[float, Meta(ge=0)]
Rate = Annotated[float, Meta(ge=0, le=1)]
ServerUrl = Annotated[str, Meta(pattern=r"^https?://[^\s/]+(/\S*)?$")]
EnvVarName = Annotated[str, Meta(pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")]


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every section: immutable, keyword-only, unknown keys refused."""


class JobConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[job]``: the shape of the run."""

    steps: PositiveInt = 100
    prompts_per_step: PositiveInt = 8
    generations_per_prompt: PositiveInt = 4
    # How many steps ahead of training admission may run.
    staleness_window: NonNegativeInt = 2
    seed: NonNegativeInt = 0
    # A step trains once it holds ceil(fraction * prompts_per_step) groups; the rest are
    # dropped (shortfall). Fewer than that and the run fails.
    min_step_fraction: Annotated[float, Meta(gt=0, le=1)] = 0.5


class TaskConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[task]``: the simulated prompt set."""

    dataset_size: PositiveInt = 4096
    # Every k-th prompt uses prompt_group granularity, the rest sibling granularity.
    prompt_group_every: PositiveInt = 4


class PolicyConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[policy]``: the toy policy's update rule."""

    learning_rate: PositiveFloat = 0.2
    clip_epsilon: PositiveFloat = 0.2


class GenerationConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[generation]``: the generation backend and its workers."""

    #: "simulated": in-process agents with injected [faults]; "http": real generation
    #: servers, configured in [http] ([faults] is not injected there: the servers' own
    #: failures are the faults); "ray": generation actors and data shards on a Ray
    #: cluster, configured in [ray] (needs the [ray] extra).
    backend: Literal["simulated", "http", "ray"] = "simulated"
    #: Simulated workers (the simulated backend only).
    workers: PositiveInt = 4
    max_inflight_attempts: PositiveInt = 64
    call_latency_s: NonNegativeFloat = 0.08
    latency_jitter: NonNegativeFloat = 0.5
    attempt_deadline_s: PositiveFloat = 2.0


class HttpConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[http]``: the HTTP backend's servers (used when ``generation.backend = "http"``)."""

    #: Base URLs of running OpenAI-compatible servers. Empty: the job starts
    #: ``launch_servers`` local ``rollout-recovery serve`` processes itself and stops them.
    #: No credentials in them (they are recorded with every call): see ``api_key_env``.
    servers: tuple[ServerUrl, ...] = ()
    #: The name of an environment variable holding the servers' API key, sent as
    #: ``Authorization: Bearer`` (never recorded); "" for none. Launched servers get a
    #: random key of their own unless this names one.
    api_key_env: EnvVarName = ""
    launch_servers: PositiveInt = 3
    dialect: DialectName = "vllm-completions"
    #: How servers get new weights: "policy" pushes the numpy policy (rollout-recovery
    #: serve), "version-tag" only tags a vLLM dev-mode server, "none" leaves them alone.
    weight_sync: WeightSyncName = "policy"
    model: Annotated[str, Meta(min_length=1)] = DEFAULT_MODEL_NAME
    per_server_concurrency: PositiveInt = 16
    request_timeout_s: PositiveFloat = 10.0
    #: How often one call is resent to another server after an infra failure.
    call_redispatch_budget: NonNegativeInt = 3
    redispatch_backoff_s: NonNegativeFloat = 0.05
    probe_interval_s: PositiveFloat = 0.5
    probe_timeout_s: PositiveFloat = 1.0
    #: Consecutive failed calls or probes after which a server counts as dead.
    dead_after_failures: PositiveInt = 3
    #: How long a call waits for any healthy server before its attempt fails.
    no_server_wait_s: PositiveFloat = 30.0
    logprob_mode: Literal["raw_logprobs", "processed_logprobs"] = "raw_logprobs"


class RayConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[ray]``: placement and liveness on Ray (used when ``generation.backend = "ray"``).

    Everything about where things run is here: actors per node, CPUs per actor, shards.
    """

    #: "" starts a local cluster with ``num_cpus``; "auto" or "ray://host:port" attaches.
    address: str = ""
    num_cpus: PositiveInt = 2
    #: What a generation actor runs: "simulated" (the numpy policy in the actor, the
    #: [faults] of the simulated environment) or "http" (a proxy to the [http] servers).
    worker: Literal["simulated", "http"] = "simulated"
    actors_per_node: PositiveInt = 2
    cpus_per_actor: PositiveFloat = 0.25
    per_actor_concurrency: PositiveInt = 32
    #: Data-plane shards, each a SQLite file in the run directory's shards/.
    data_shards: PositiveInt = 2
    cpus_per_shard: PositiveFloat = 0.25
    ping_interval_s: PositiveFloat = 1.0
    ping_timeout_s: PositiveFloat = 5.0
    actor_start_timeout_s: PositiveFloat = 60.0
    #: Dead actors replaced per run at most; then the run goes on with what is left and
    #: stops once nothing is.
    max_replacements: NonNegativeInt = 100


class RetryConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[retry]``: how often a group is regenerated before its prompt is dropped."""

    max_rounds: PositiveInt = 4
    backoff_s: NonNegativeFloat = 0.01


class FaultsConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[faults]``: injected fault rates (each in [0, 1]) of the simulated backend."""

    attempt_failure_rate: Rate = 0.03
    straggler_rate: Rate = 0.05
    straggler_factor: Annotated[float, Meta(ge=1)] = 8.0
    hang_rate: Rate = 0.01
    capture_failure_rate: Rate = 0.01
    tamper_rate: Rate = 0.01
    worker_crash_rate: Rate = 0.002
    worker_restart_s: NonNegativeFloat = 0.2


class CheckpointConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[checkpoint]``: how often, how many kept, which sidecar format."""

    every_steps: PositiveInt = 2
    keep: PositiveInt = 3
    format: Literal["native", "pt"] = "native"
    barrier_timeout_s: PositiveFloat = 30.0


class LivenessConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[liveness]``: bounded waits; past one the run fails naming what it waited for."""

    #: How long the train pump waits for the groups of one step.
    step_timeout_s: PositiveFloat = 120.0
    #: How long one trainer step may take.
    train_step_timeout_s: PositiveFloat = 60.0


class RunConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole job: one Struct per TOML section, each defaulted when absent."""

    job: JobConfig = msgspec.field(default_factory=JobConfig)
    task: TaskConfig = msgspec.field(default_factory=TaskConfig)
    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    generation: GenerationConfig = msgspec.field(default_factory=GenerationConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    ray: RayConfig = msgspec.field(default_factory=RayConfig)
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    faults: FaultsConfig = msgspec.field(default_factory=FaultsConfig)
    checkpoint: CheckpointConfig = msgspec.field(default_factory=CheckpointConfig)
    liveness: LivenessConfig = msgspec.field(default_factory=LivenessConfig)


# ---------------------------------------------------------------------------------------
# Loading


def load_config(
    path: Path | None, *, seed: int | None = None, backend: str | None = None
) -> RunConfig:
    """Read the job configuration from the TOML file at ``path`` (``None``: defaults).

    ``seed`` (the command line's ``--seed``) overrides ``job.seed`` and is validated like
    it; ``backend`` (``--backend``) overrides ``generation.backend`` the same way. Every
    refusal is a :class:`ConfigError`: a field error carries the field's path
    (``err.path == "$.faults.hang_rate"``), a file that cannot be read or parsed names the
    file (and, for a syntax error, the line and column).
    """
    data: dict[str, Any] = {} if path is None else _read_toml(path)
    if seed is not None:
        job = data.setdefault("job", {})
        # A non-table `job` is refused by the conversion below, with its path.
        if isinstance(job, dict):
            job["seed"] = seed
    if backend is not None:
        generation = data.setdefault("generation", {})
        if isinstance(generation, dict):
            generation["backend"] = backend
    return config_from_builtins(data)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{path}: cannot read the config file: {reason}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the config file is not UTF-8: {exc.reason}") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line L, column C)".
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def config_from_builtins(data: object) -> RunConfig:
    """Strictly convert plain data (parsed TOML, a checkpoint's copy) to a ``RunConfig``.

    An int is accepted where a float is expected (TOML's ``1`` for ``1.0``); a bool never
    counts as a number; floats must be finite.
    """
    try:
        config = msgspec.convert(data, RunConfig)
    except msgspec.ValidationError as exc:
        message, field_path = split_validation_path(str(exc))
        raise ConfigError(message, path=field_path or "$") from exc
    _check_finite(config)
    _check_server_urls(config)
    return config


def _check_server_urls(config: RunConfig) -> None:
    for index, url in enumerate(config.http.servers):
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


def _check_finite(config: RunConfig) -> None:
    # `inf` passes a lower bound (a latency of inf seconds would hang the run forever);
    # NaN is already refused by every bound, and every float field has one.
    for field_path, value in _leaves(config):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"Expected a finite `float`, got {value!r}", path=field_path)


def _sections(config: RunConfig) -> Iterator[tuple[str, _Section]]:
    for name in config.__struct_fields__:
        section = getattr(config, name)
        assert isinstance(section, _Section)
        yield name, section


def _leaves(config: RunConfig) -> Iterator[tuple[str, object]]:
    """``("$.section.field", value)`` for every field, in declaration order."""
    for section_name, section in _sections(config):
        for field in section.__struct_fields__:
            yield f"$.{section_name}.{field}", getattr(section, field)


# ---------------------------------------------------------------------------------------
# Writing and comparing


def config_to_toml(config: RunConfig) -> str:
    """The whole config as TOML, one ``[section]`` per Struct, every field written.

    ``load_config`` of this text gives back an equal config.
    """
    blocks: list[str] = []
    for section_name, section in _sections(config):
        lines = [f"[{section_name}]"]
        for field in section.__struct_fields__:
            lines.append(f"{field} = {_toml_value(getattr(section, field))}")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def _toml_value(value: object) -> str:
    # bool before int: bool is an int subclass.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        # repr is the shortest round-tripping form and always has a "." or an exponent
        # ("0.02", "1e-05", "1e+16"), all valid TOML floats, so it reads back as a float.
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise InvalidArgumentTypeError(f"cannot write a {type(value).__name__} as a TOML value")


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f"}
_TOML_ESCAPES["\r"] = "\\r"


def _toml_string(value: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out: list[str] = []
    for char in value:
        escaped = _TOML_ESCAPES.get(char)
        if escaped is not None:
            out.append(escaped)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def config_differences(a: RunConfig, b: RunConfig) -> list[str]:
    """Field-level differences, in declaration order: ``["$.job.seed: 0 != 1", ...]``."""
    return [
        f"{field_path}: {left!r} != {right!r}"
        for (field_path, left), (_, right) in zip(_leaves(a), _leaves(b), strict=True)
        if left != right
    ]


def config_to_builtins(config: RunConfig) -> dict[str, Any]:
    """The config as plain dicts of int, float, str and bool, for a checkpoint."""
    # Through JSON, so tuples come back as lists: plain data any codec round-trips.
    data = msgspec.json.decode(msgspec.json.encode(config))
    assert isinstance(data, dict)
    return data


def config_fingerprint(config: RunConfig) -> str:
    """sha256 (hex) of the config's canonical encoding: JSON with sorted keys.

    The config is normalized first (an int written into a float field counts as that
    float), so equal configs have equal fingerprints however they were built.
    """
    canonical = config_from_builtins(config_to_builtins(config))
    encoded = msgspec.json.encode(config_to_builtins(canonical), order="sorted")
    return hashlib.sha256(encoded).hexdigest()
