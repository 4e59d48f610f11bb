"""The run config: the tree of every component's section, read from one TOML file.

Each component owns its section next to its code (``[http]`` in ``rollout``, ``[ray]`` in
``cluster``, ``[vllm]`` in ``vllm``, ``[task]`` and ``[policy]`` in ``policy``,
``[trainer]`` and ``[model]`` in ``llm``); the controller owns ``[job]``, ``[retry]``,
``[checkpoint]`` and ``[liveness]`` here, and the root that holds them all.
Every section is optional in the file and every field has a default, so an empty file (or
no file) is the default job. A refused value is reported with its field path
(``$.faults.hang_rate: Expected `float` >= 0.0``), an unknown key with the path of its
section. Which fields are the job's identity and which may change on resume is marked on
each field (``_settings.OPERATIONAL``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from .._reward_function import RewardConfig
from .._settings import (
    OPERATIONAL,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Section,
    read_toml,
)
from .._settings import config_differences as _differences
from .._settings import config_from_builtins as _from_builtins
from ..cluster import RayConfig
from ..errors import ConfigError
from ..history.records import ReusePolicy
from ..llm import ModelConfig, TrainerConfig
from ..metrics import MetricsConfig
from ..policy import PolicyConfig, TaskConfig
from ..rollout import (
    FaultsConfig,
    GenerationConfig,
    HttpConfig,
)
from ..vllm import VllmConfig
from ._backends import BACKENDS, Backend

__all__ = [
    "CheckpointConfig",
    "JobConfig",
    "LivenessConfig",
    "RecoveryConfig",
    "RetryConfig",
    "RunConfig",
    "backend_of",
    "check_combination",
    "config_differences",
    "config_from_builtins",
    "load_config",
]


class JobConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[job]``: the shape of the run."""

    #: How many steps to train; raising it on a finished or killed run continues it.
    steps: Annotated[PositiveInt, OPERATIONAL] = 100
    prompts_per_step: PositiveInt = 8
    generations_per_prompt: PositiveInt = 4
    #: How many steps ahead of training admission may run.
    staleness_window: NonNegativeInt = 2
    seed: NonNegativeInt = 0
    #: A step trains once it holds ceil(fraction * prompts_per_step) groups; the rest are
    #: dropped (shortfall). Fewer than that and the run fails.
    min_step_fraction: Annotated[float, Meta(gt=0, le=1), OPERATIONAL] = 0.5
    #: A run that trains this many steps in a row without one valid row (every row a
    #: masked placeholder: a broken server, a poisoned environment) stops and says so.
    max_steps_without_valid_rows: Annotated[PositiveInt, OPERATIONAL] = 5
    #: A file whose appearance drains the run (as SIGTERM does): relative to the run
    #: directory, or absolute. ``rollout-recovery stop DIR`` writes it; the job removes it
    #: when it acts on it (and, as stale, one present when the job starts).
    drain_file: Annotated[str, Meta(pattern=r"^[^\x00]{1,4096}$"), OPERATIONAL] = "DRAIN"
    #: How long a drain lets attempts in flight finish before abandoning them (reason
    #: ``drain``). Keep it below the scheduler's kill delay minus a checkpoint's time.
    drain_grace_s: Annotated[float, Meta(ge=0, le=3600), OPERATIONAL] = 20.0
    #: Keep a warm standby interpreter beside the job (Linux): one that has imported what
    #: the job imports (torch and transformers for the torch trainer) and waits, this many
    #: seconds after the job dies without a normal end (a kill -9, a crash), for a rerun
    #: of the same run directory to run in it instead of importing everything again. A
    #: normal end, a failure and ``rollout-recovery stop`` end it. 0: none.
    standby_within_s: Annotated[float, Meta(ge=0, le=86400), OPERATIONAL] = 0.0


class RetryConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[retry]``: how often a group is regenerated before its prompt is dropped."""

    max_rounds: Annotated[PositiveInt, OPERATIONAL] = 4
    backoff_s: Annotated[NonNegativeFloat, OPERATIONAL] = 0.01


class CheckpointConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[checkpoint]``: how often, how many kept, which sidecar format."""

    every_steps: Annotated[PositiveInt, OPERATIONAL] = 2
    keep: Annotated[PositiveInt, OPERATIONAL] = 3
    format: Annotated[Literal["native", "pt"], OPERATIONAL] = "native"
    barrier_timeout_s: Annotated[PositiveFloat, OPERATIONAL] = 30.0
    #: Write each checkpoint in the background while the next steps train: the step pays
    #: only the capture (the hold, and the trainer's state copied to memory). It costs one
    #: more copy of the trainer's state in memory: for the torch trainer, staging buffers
    #: for the AdamW moments held from the first checkpoint on (1.07 GB for SmolLM2-135M)
    #: and the weights snapshot of the captured version kept until the write has encoded
    #: it (0.54 GB, the one the weight push took); other trainers' copies only while a
    #: write is in flight (``docs/reliability.md``). False: the train pump waits for the
    #: whole write, as before. The default was chosen from
    #: ``benchmarks/bench_checkpoint_async.py`` (``docs/benchmarks.md``).
    background: Annotated[bool, OPERATIONAL] = True


class LivenessConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[liveness]``: bounded waits; past one the run fails naming what it waited for."""

    #: How long the train pump waits for the groups of one step.
    step_timeout_s: Annotated[PositiveFloat, OPERATIONAL] = 120.0
    #: How long one trainer step may take.
    train_step_timeout_s: Annotated[PositiveFloat, OPERATIONAL] = 60.0


class RecoveryConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[recovery]``: what a restore keeps of the work journaled after its snapshot, and
    what a lost attempt leaves its sibling's next attempt."""

    #: Seals made under weights the restore lost (training after the snapshot is rolled
    #: back): "all" keeps them (off-policy, corrected by their captured logprobs),
    #: "ancestors" keeps those generated only by versions the restored policy descends
    #: from, "none" regenerates everything sealed after the snapshot. The default, "all",
    #: was chosen from a measured comparison (``benchmarks/bench_reuse.py``, 5 kills
    #: under each policy, same seed): the same reward curves and final reward, and the
    #: only policy that regenerates no sealed work (``docs/reliability.md``, "The reuse
    #: policy, measured").
    #: Staged calls of lost attempts follow the same rule, call by call (a restore under
    #: "none" keeps none).
    reuse: Annotated[ReusePolicy, OPERATIONAL] = ReusePolicy.ALL
    #: "call": a lost attempt's staged calls are continued by its sibling's next attempt
    #: (after a worker death or a restart); only the calls in flight are generated again.
    #: "attempt": the next attempt starts over (the episode is generated again whole).
    resume: Annotated[Literal["call", "attempt"], OPERATIONAL] = "call"


class RunConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole job: one Struct per TOML section, each defaulted when absent."""

    job: JobConfig = msgspec.field(default_factory=JobConfig)
    task: TaskConfig = msgspec.field(default_factory=TaskConfig)
    reward: RewardConfig = msgspec.field(default_factory=RewardConfig)
    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    trainer: TrainerConfig = msgspec.field(default_factory=TrainerConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    generation: GenerationConfig = msgspec.field(default_factory=GenerationConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    vllm: VllmConfig = msgspec.field(default_factory=VllmConfig)
    ray: RayConfig = msgspec.field(default_factory=RayConfig)
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    faults: FaultsConfig = msgspec.field(default_factory=FaultsConfig)
    checkpoint: CheckpointConfig = msgspec.field(default_factory=CheckpointConfig)
    liveness: LivenessConfig = msgspec.field(default_factory=LivenessConfig)
    recovery: RecoveryConfig = msgspec.field(default_factory=RecoveryConfig)
    #: Where per-step metrics go besides metrics.jsonl; all operational (a resume may add
    #: or drop a sink).
    metrics: Annotated[MetricsConfig, OPERATIONAL] = msgspec.field(default_factory=MetricsConfig)

    def differences(self, other: RunConfig, *, which: str = "all") -> list[str]:
        """Field-level differences from ``other``: ``["$.job.seed: 0 != 1", ...]``;
        ``which`` is ``"identity"``, ``"operational"`` or ``"all"`` fields."""
        return _differences(self, other, which=which)


def load_config(
    path: Path | None, *, seed: int | None = None, backend: str | None = None
) -> RunConfig:
    """Read the job configuration from the TOML file at ``path`` (``None``: defaults).

    ``seed`` (the command line's ``--seed``) overrides ``job.seed`` and is validated like
    it; ``backend`` (``--backend``) overrides ``generation.backend`` the same way. Every
    refusal is a :class:`~rollout_recovery.errors.ConfigError`: a field error carries the
    field's path (``err.path == "$.faults.hang_rate"``), a file that cannot be read or
    parsed names the file (and, for a syntax error, the line and column).
    """
    data: dict[str, Any] = {} if path is None else read_toml(path)
    if path is not None:
        _relative_to(data, path.parent)
    for section, key, value in (("job", "seed", seed), ("generation", "backend", backend)):
        if value is not None:
            table = data.setdefault(section, {})
            # A non-table section is refused by the conversion below, with its path.
            if isinstance(table, dict):
                table[key] = value
    return config_from_builtins(data)


def _relative_to(data: dict[str, Any], base: Path) -> None:
    """Make the user's own files (``[task] path``, a file ``[reward] function``) relative
    to the config file's directory, so a config runs from any working directory."""
    task, reward = data.get("task"), data.get("reward")
    if isinstance(task, dict) and isinstance(task.get("path"), str) and task["path"]:
        task["path"] = _beside(base, task["path"])
    if isinstance(reward, dict) and isinstance(reward.get("function"), str):
        target, sep, name = reward["function"].rpartition(":")
        if sep and (target.endswith(".py") or "/" in target):
            reward["function"] = f"{_beside(base, target)}:{name}"


def _beside(base: Path, path: str) -> str:
    expanded = Path(path).expanduser()
    return str(expanded if expanded.is_absolute() else (base / expanded).resolve())


def config_from_builtins(data: object) -> RunConfig:
    """Strictly convert plain data (parsed TOML, a checkpoint's copy) to a ``RunConfig``."""
    config = _from_builtins(data, RunConfig)
    config.reward.check(config.task.kind)
    backend = backend_of(config)
    config.http.check_server_urls()
    config.generation.check_weight_update_mode(
        config.http,
        interrupting=[name for name, entry in BACKENDS.items() if entry.interrupts],
        servers=backend.uses_servers(config),
    )
    check_combination(config)
    config.vllm.check(
        config.http,
        servers=backend.uses_servers(config),
        trainer_model=config.trainer.kind == "torch",
    )
    return config


def backend_of(config: RunConfig) -> Backend:
    """The registry's entry of ``[generation] backend``; refused, naming the field and the
    backends there are, when there is none."""
    name = config.generation.backend
    backend = BACKENDS.get(name)
    if backend is None:
        raise ConfigError(
            f"Invalid enum value {name!r}: the backends are {_choices(BACKENDS)}",
            path="$.generation.backend",
        )
    return backend


def _choices(values: Iterable[str]) -> str:
    """``'a' or 'b'``: each value once, in the table's order."""
    return " or ".join(map(repr, dict.fromkeys(values)))


def check_combination(config: RunConfig) -> None:
    """Refuse a trainer, task or weight sync the generation backend cannot serve (its
    pairings in ``BACKENDS``), naming the field (the trainer's, then the task's, then
    ``[http] weight_sync``)."""
    backend = backend_of(config)
    trainer, task = config.trainer.kind, config.task.kind
    parts = backend.pairs
    with_trainer = [part for part in parts if part.trainer == trainer]
    if not with_trainer:
        serving = [
            name for name, entry in BACKENDS.items() if trainer in (p.trainer for p in entry.pairs)
        ]
        raise ConfigError(
            f"generation backend {backend.name!r} needs [trainer] kind = "
            f"{_choices(p.trainer for p in parts)}; trainer kind {trainer!r} works with "
            f"[generation] backend = {_choices(serving)}",
            path="$.trainer.kind",
        )
    fitting = [part for part in with_trainer if part.task == task]
    if not fitting:
        # Name the trainer only where the backend serves more than one.
        which = f" with trainer kind {trainer!r}" if len(parts) > 1 else ""
        serving = [
            name for name, entry in BACKENDS.items() if task in (p.task for p in entry.pairs)
        ]
        raise ConfigError(
            f"generation backend {backend.name!r}{which} needs [task] kind = "
            f"{_choices(p.task for p in with_trainer)}; task kind {task!r} works with "
            f"[generation] backend = {_choices(serving)}",
            path="$.task.kind",
        )
    syncs, sync = fitting[0].weight_syncs, config.http.weight_sync
    if syncs is None or sync in syncs or not backend.uses_servers(config):
        return
    if trainer == "torch":
        why = (
            "the torch trainer generates on HTTP servers only through vLLM servers that load "
            'its weights after every step: set [http] weight_sync = "vllm" (with [vllm] '
            "launch, or vLLM servers in [http] servers)"
        )
    else:
        why = (
            f'weight_sync = "vllm" loads a torch trainer\'s weights into vLLM; the {trainer} '
            f"trainer's servers take {_choices(syncs)}"
        )
    raise ConfigError(
        f"generation backend {backend.name!r} with trainer kind {trainer!r}: {why}, not "
        f"{sync!r}",
        path="$.http.weight_sync",
    )


def config_differences(a: RunConfig, b: RunConfig, *, which: str = "all") -> list[str]:
    """Field-level differences: ``["$.job.seed: 0 != 1", ...]`` (see ``_settings``)."""
    return _differences(a, b, which=which)
