"""The generation backends a job can name: one table, read by everything that names one.

An entry (:class:`Backend`) says what a backend is: its name, the trainers and tasks it
serves (:class:`Pairing`, with the ``[http] weight_sync`` values that carry a trainer's
weights where it runs on servers), whether it generates through ``[http]`` servers,
whether it needs Ray (its actors stage into the Ray data shards), whether it can interrupt
a call at a weight update, and how it is built. The CLI's ``--backend`` choices, the
config's checks (``check_combination``, ``on_weight_update``, ``[vllm]``) and the
composition root (``job``) read :data:`BACKENDS`; nothing else names a backend, so adding
one touches its own module and its entry here (``docs/ARCHITECTURE.md``, "Where common
changes go", walks through it).

A backend runs what a trainer kind and a task kind build together: a :class:`Learner`
(the trainer, the prompts, the episodes), built by their :class:`Pairing`; a new task is
its learner function and its pairing in each backend that serves it.

The registry builds from the config the job has resolved (launched servers listed in
``[http] servers``, ``[vllm] weights_dir`` set); weights are typed ``Any`` here: the
config, not the types, picks the trainer and the backend, and the pairings are what keeps
them together (a user who plugs in their own components keeps the typed pairing of
``JobComponents``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..dataplane import DataPlane, Row
from ..errors import ConfigError
from ..policy import NumpyGRPOTrainer, PolicySnapshot, TaskSet, Trainer
from ..rollout import (
    DigitTask,
    EpisodeTask,
    GenerationBackend,
    HttpGenerationBackend,
    SimulatedAgentBackend,
)

if TYPE_CHECKING:  # the config tree holds the checks that read this table
    from ._config import RunConfig
    from ._controller import PromptDataset

__all__ = ["BACKENDS", "Backend", "BackendInputs", "Learner", "Pairing"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Learner:
    """What a trainer kind and a task kind build together: the trainer, the prompts the
    controller samples (``dataset``) and the episodes a backend runs on them.

    ``temperature`` is the sampling temperature the trainer's ratio assumes (its
    denominator is the sampler's logprob); ``sampler`` builds the trainer's own model
    sampled in process, for a trainer that has one (the torch trainer); ``samples`` what
    each step's metrics say about its completions (the LLM tasks' sample texts), called
    with the step and the canonical rows it trained (``Controller.samples``)."""

    trainer: Trainer[Any]
    dataset: PromptDataset
    episodes: EpisodeTask
    temperature: float = 1.0
    sampler: Callable[[], GenerationBackend[Any]] | None = None
    samples: Callable[[int, Sequence[Row]], Mapping[str, Any]] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendInputs:
    """What a backend is built from: the resolved config, the learner, the job's store and
    the key the servers want (the launched servers' own, or ``[http] api_key_env``'s)."""

    config: RunConfig
    learner: Learner
    data_plane: DataPlane
    api_key: str | None


@dataclass(frozen=True, slots=True)
class Pairing:
    """A trainer kind and a task kind a backend serves together, how they build their
    :class:`Learner`, and, where the backend generates through servers, the
    ``[http] weight_sync`` values that carry that trainer's weights to them (None: any)."""

    trainer: str
    task: str
    learner: Callable[[RunConfig], Learner]
    weight_syncs: tuple[str, ...] | None = None

    def syncing(self, *weight_syncs: str) -> Pairing:
        """This pairing on servers that take only ``weight_syncs``."""
        return dataclasses.replace(self, weight_syncs=weight_syncs)


def _never(config: RunConfig) -> bool:
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """One generation backend, as the rest of the job sees it.

    ``summary`` is its line in ``run --help``; ``pairs`` the trainers and tasks it serves;
    ``uses_servers(config)`` whether it generates through ``[http]`` servers (the job
    launches them when none are listed); ``needs_ray`` that it runs on Ray (the job's
    store is then ``[ray]``'s shards); ``interrupts`` that it honours
    ``on_weight_update = "interrupt"``.
    """

    name: str
    summary: str
    pairs: tuple[Pairing, ...]
    builder: Callable[[BackendInputs], GenerationBackend[Any]]
    uses_servers: Callable[[RunConfig], bool] = _never
    needs_ray: bool = False
    interrupts: bool = False

    def pairing(self, config: RunConfig) -> Pairing:
        """The pairing of ``config``'s trainer and task kinds (the run config refuses a
        config without one)."""
        trainer, task = config.trainer.kind, config.task.kind
        return next(p for p in self.pairs if (p.trainer, p.task) == (trainer, task))

    def build(
        self, config: RunConfig, *, data_plane: DataPlane, api_key: str | None
    ) -> tuple[Learner, GenerationBackend[Any]]:
        """The learner of ``config``'s pairing, and this backend running its episodes."""
        learner = self.pairing(config).learner(config)
        inputs = BackendInputs(
            config=config, learner=learner, data_plane=data_plane, api_key=api_key
        )
        return learner, self.builder(inputs)


# -- learners --------------------------------------------------------------------------


def _numpy_digits(config: RunConfig) -> Learner:
    """The numpy policy on the synthetic digit task."""
    dataset = TaskSet.from_config(config.task, seed=config.job.seed)
    trainer = NumpyGRPOTrainer(
        seed=config.job.seed,
        learning_rate=config.policy.learning_rate,
        clip_epsilon=config.policy.clip_epsilon,
        logprob_tolerance=config.trainer.logprob_tolerance,
    )
    return Learner(trainer=trainer, dataset=dataset, episodes=DigitTask(dataset, config.task))


def _torch(config: RunConfig) -> Learner:
    """The torch trainer on ``[model]`` (prepared by the job first) and ``[task]``: "emit
    token X", or the rows of a dataset scored by ``[reward] function``."""
    parts = config.trainer.torch_parts(
        config.model, config.task, seed=config.job.seed, reward=config.reward
    )
    samples = parts.step_samples(config.metrics.samples)
    return Learner(
        trainer=parts.trainer,
        dataset=parts.dataset,
        episodes=parts.episodes(),
        temperature=parts.trainer.temperature,
        sampler=parts.transformers_backend,
        samples=None if samples is None else samples.describe,
    )


#: The trainer and task kinds that learn together, each with how it builds its learner.
_NUMPY_DIGITS = Pairing("numpy", "digits", _numpy_digits)
_TORCH_EMIT_TOKEN = Pairing("torch", "emit_token", _torch)
_TORCH_DATASET = Pairing("torch", "dataset", _torch)


# -- builders --------------------------------------------------------------------------


def _simulated(inputs: BackendInputs) -> GenerationBackend[Any]:
    config = inputs.config
    return SimulatedAgentBackend(
        config.generation,
        faults=config.faults,
        episodes=inputs.learner.episodes,
        seed=config.job.seed,
        initial_weights=inputs.learner.trainer.weights(),
        data_plane=inputs.data_plane,
    )


def _http(inputs: BackendInputs) -> GenerationBackend[Any]:
    config, trainer = inputs.config, inputs.learner.trainer
    vllm = config.http.weight_sync == "vllm"
    if not vllm:
        _check_pushable(config, trainer)
    return HttpGenerationBackend(
        config.http,
        generation=config.generation,
        episodes=inputs.learner.episodes,
        vocab_size=trainer.vocab_size,
        # None: the sync [http] weight_sync names (the vLLM sync lives in its own room).
        weight_sync=_vllm_sync(config, trainer) if vllm else None,
        sync_timeout_s=config.vllm.sync_timeout_s if vllm else None,
        temperature=inputs.learner.temperature,
        api_key=inputs.api_key,
        initial_version=trainer.weight_version,
        initial_weights=trainer.weights(),
    )


def _check_pushable(config: RunConfig, trainer: Trainer[Any]) -> None:
    """Refuse a trainer whose weights the sync ``[http] weight_sync`` names cannot push:
    ``"policy"`` pushes the numpy policy (``PolicySnapshot``), the others take any."""
    if config.http.weight_sync == "policy" and not isinstance(trainer.weights(), PolicySnapshot):
        raise ConfigError(
            'weight_sync = "policy" pushes the numpy policy\'s weights (PolicySnapshot), '
            f"not {type(trainer.weights()).__name__}",
            path="$.http.weight_sync",
        )


def _vllm_sync(config: RunConfig, trainer: Trainer[Any]) -> Any:
    """The vLLM sync: writes the trainer's weights to ``[vllm] weights_dir`` (resolved by
    the job) for its servers to load; refused, naming the field, for weights it cannot
    write."""
    if not config.vllm.weights_dir:
        raise ConfigError(
            "[vllm] weights_dir is resolved by the job: build the components through run_job",
            path="$.vllm.weights_dir",
        )
    sync = config.vllm.weight_sync()
    keep_snapshots_in = getattr(trainer, "keep_snapshots_in", None)
    if callable(keep_snapshots_in):
        # The torch trainer's snapshot of each version becomes the file its servers load
        # (one pass over the weights, not a copy and then the file's write).
        keep_snapshots_in(sync)
    try:
        sync.check(trainer.weight_version, trainer.weights())
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f'weight_sync = "vllm" loads the trainer\'s weights into vLLM: {error}',
            path="$.http.weight_sync",
        ) from None
    return sync


def _ray(inputs: BackendInputs) -> GenerationBackend[Any]:
    config, trainer = inputs.config, inputs.learner.trainer
    return config.ray.generation_backend(
        data_plane=inputs.data_plane,
        seed=config.job.seed,
        episodes=inputs.learner.episodes,
        generation=config.generation,
        faults=config.faults,
        http=config.http,
        vocab_size=trainer.vocab_size,
        api_key=inputs.api_key,
        initial_weights=trainer.weights(),
    )


def _transformers(inputs: BackendInputs) -> GenerationBackend[Any]:
    sampler = inputs.learner.sampler
    if sampler is None:  # check_combination pairs this backend with the torch trainer only
        raise ConfigError(
            "the transformers backend samples the trainer's own model: this trainer has none",
            path="$.trainer.kind",
        )
    return sampler()


# What each backend samples from and runs. The simulated agents and the Ray workers generate
# from the numpy policy's snapshot; the HTTP backend runs the digit task and pushes the numpy
# policy to its servers, or runs "emit token X" on vLLM servers that load the torch
# trainer's weights (only the vLLM sync can: the others would leave the servers sampling the
# initial weights while the trainer moves on); the transformers backend samples the torch
# trainer's model in process, on "emit token X" or a dataset of the user's. Ray workers
# proxying to [http] servers push the numpy policy.
_NUMPY_SYNCS = ("policy", "version-tag", "none")
BACKENDS: Mapping[str, Backend] = {
    backend.name: backend
    for backend in (
        Backend(
            name="simulated",
            summary="simulated agents with injected [faults]",
            pairs=(_NUMPY_DIGITS,),
            builder=_simulated,
            interrupts=True,
        ),
        Backend(
            name="ray",
            summary="generation actors and data shards on Ray ([ray]; needs the [ray] extra)",
            pairs=(_NUMPY_DIGITS.syncing(*_NUMPY_SYNCS),),
            builder=_ray,
            uses_servers=lambda config: config.ray.worker == "http",
            needs_ray=True,
        ),
        Backend(
            name="http",
            summary="HTTP generation servers ([http] servers; none listed: the job starts "
            "[http] launch_servers local ones)",
            pairs=(_NUMPY_DIGITS.syncing(*_NUMPY_SYNCS), _TORCH_EMIT_TOKEN.syncing("vllm")),
            builder=_http,
            uses_servers=lambda config: True,
            interrupts=True,
        ),
        Backend(
            name="transformers",
            summary='the torch trainer\'s model sampled in process ([trainer] kind = "torch"; '
            "the [llm] extra)",
            pairs=(_TORCH_EMIT_TOKEN, _TORCH_DATASET),
            builder=_transformers,
        ),
    )
}

