"""``[vllm]``: local vLLM servers the job starts, and how weights reach vLLM servers.

With ``launch = N`` the job starts N vLLM servers itself (each in its own process group,
gone when the job ends, or ``adopt_within_s`` after it dies unless a rerun adopts them)
from ``model``, the trainer's model directory, with the ``python`` of the venv vLLM is
installed in (vLLM pins its own torch, so it lives in a venv of its own).
``[http] weight_sync = "vllm"`` keeps them, or the vLLM servers listed in ``[http] servers``,
in sync with the trainer: after every step the new weights are written to ``weights_dir``
and loaded into every server without a restart.

Only ``dtype`` is part of the job's identity (a bf16 and an fp32 server sample different
logprobs); the rest may change when a run resumes.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta

from .._settings import (
    OPERATIONAL,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Section,
)
from ..errors import ConfigError
from ..rollout import HttpConfig
from ._fleet import VllmFleet
from ._guard import MAX_LEASE_S
from ._sync import VllmWeightSync, shared_memory_weights, weights_bytes

__all__ = ["VllmConfig", "VllmDtype", "check_launch_paths", "check_vllm_config"]

VllmDtype = Literal["bfloat16", "float16", "float32"]


class VllmConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[vllm]``: see the module docstring."""

    #: How many local vLLM servers the job starts and supervises (0: none). Needs
    #: generation.backend = "http", [http] weight_sync = "vllm" and no [http] servers.
    launch: Annotated[NonNegativeInt, OPERATIONAL] = 0
    #: The python of the venv vLLM is installed in.
    python: Annotated[str, OPERATIONAL] = ""
    #: The model directory the launched servers start from; "" with the torch trainer is
    #: its own (``[model]``), which is what the servers must serve.
    model: Annotated[str, OPERATIONAL] = ""
    #: The launched servers' dtype; weight files are written in it (rounded to nearest
    #: from the trainer's fp32). A bf16 server drops every update below half a bf16 step:
    #: with the torch trainer at a small learning rate it samples another policy than the
    #: trainer's, and the logprob check measures that distance, not noise (SmolLM2 at
    #: 1e-4: 0.11-0.22 nats, against 1e-5 in float32; docs/benchmarks.md). Use float32
    #: there.
    dtype: VllmDtype = "bfloat16"
    #: --max-model-len (0: the model's own).
    max_model_len: Annotated[NonNegativeInt, OPERATIONAL] = 0
    #: --max-num-seqs: sequences one server runs at once.
    max_num_seqs: Annotated[PositiveInt, OPERATIONAL] = 8
    #: GiB of KV cache per server (VLLM_CPU_KVCACHE_SPACE: vLLM's CPU default takes a
    #: large share of RAM per server).
    kv_cache_gib: Annotated[PositiveInt, OPERATIONAL] = 1
    #: More arguments for every launched server (e.g. ["--enforce-eager"]).
    extra_args: Annotated[tuple[str, ...], OPERATIONAL] = ()
    #: How long a launched server may take to answer /health (a cold start on 2 busy
    #: cores takes minutes).
    startup_timeout_s: Annotated[PositiveFloat, OPERATIONAL] = 900.0
    #: The total deadline of one weight push (write, pause, load, resume), not counting
    #: the wait for the server's calls in flight to end.
    sync_timeout_s: Annotated[PositiveFloat, OPERATIONAL] = 120.0
    #: How long a launched server outlives a job that died without a normal end (SIGKILL,
    #: a crash), waiting for the rerun on the same run directory to adopt it warm instead
    #: of cold-starting a new one; it ends by itself when no rerun adopts it in time.
    #: 0: the servers end with the job. A normal end, a failed run and
    #: ``rollout-recovery stop`` end them at once either way.
    #: At most a day (``MAX_LEASE_S``).
    adopt_within_s: Annotated[NonNegativeFloat, Meta(le=MAX_LEASE_S), OPERATIONAL] = 180.0
    #: Where the weight files the servers load are written ("": shared memory for
    #: launched servers, /dev/shm/rollout-recovery-UID/run-HASH, else DIR/servers/weights).
    #: Listed servers must be able to read it (the same machine or a shared filesystem).
    weights_dir: Annotated[str, OPERATIONAL] = ""

    def check(self, http: HttpConfig, *, servers: bool, trainer_model: bool = False) -> None:
        """Refuse this section with ``[http]`` if they cannot work together for a backend
        that does (``servers``) or does not generate through ``[http]`` servers (see
        :func:`check_vllm_config`)."""
        check_vllm_config(self, http, servers=servers, trainer_model=trainer_model)

    def weight_sync(self) -> VllmWeightSync:
        """The weight sync that writes the trainer's weights to ``weights_dir`` in
        ``dtype`` for the servers to load (``[http] weight_sync = "vllm"``)."""
        return VllmWeightSync(Path(self.weights_dir), dtype=self.dtype)

    def shared_memory_weights(
        self,
        run_directory: Path,
        *,
        enabled: bool = True,
        model: Path | None = None,
        log: Callable[[str], None] = lambda _: None,
        lock_file: Path | None = None,
    ) -> AbstractContextManager[Path | None]:
        """The run's weights directory in shared memory while the context lasts (None
        where there is none, when not ``enabled``, or, told to ``log``, where it has no
        room for two files of ``model`` in ``dtype``: the version a server loads and the
        superseded one it may still be loading; ``_sync.shared_memory_weights``, which
        also removes the directories of runs whose ``lock_file`` no job holds)."""
        if not enabled:
            return nullcontext()
        needs = 2 * weights_bytes(model, self.dtype) if model is not None else 0
        return shared_memory_weights(run_directory, needs=needs, log=log, lock_file=lock_file)

    def fleet(
        self,
        servers_dir: Path,
        servers_file: Path,
        *,
        served_model_name: str,
        api_key: str | None = None,
        log: Callable[[str], None] = lambda _: None,
    ) -> VllmFleet:
        """The ``launch`` servers of this section, started on enter and stopped on exit,
        their start-up progress told to ``log`` (see ``_fleet.VllmFleet``)."""
        return VllmFleet(
            servers_dir,
            servers_file,
            self,
            served_model_name=served_model_name,
            api_key=api_key,
            log=log,
        )

    def check_launch_paths(self, *, model: bool = True) -> None:
        """Refuse a python or model that is not there (see :func:`check_launch_paths`)."""
        check_launch_paths(self, model=model)


def check_vllm_config(
    vllm: VllmConfig, http: HttpConfig, *, servers: bool, trainer_model: bool = False
) -> None:
    """Refuse a combination of ``[vllm]`` and ``[http]`` that cannot work, naming the field
    to change (before anything is written). Like ``[http]``, ``[vllm]`` is ignored by a
    job whose backend generates without HTTP servers (``servers`` False; which weight
    syncs a backend's servers take is the backend's own pairing, checked by the run
    config). ``trainer_model``: the trainer has a model directory of its own, which an
    empty ``[vllm] model`` means."""
    if not servers:
        return
    if vllm.launch:
        if http.servers:
            raise ConfigError(
                "either list servers in [http] servers or launch them with [vllm] launch, not both",
                path="$.vllm.launch",
            )
        if http.weight_sync != "vllm":
            raise ConfigError(
                'launched vLLM servers are kept in sync by weight_sync = "vllm"',
                path="$.http.weight_sync",
            )
        for field in ("python", "model"):
            if field == "model" and trainer_model:
                continue
            if not getattr(vllm, field):
                raise ConfigError(
                    f"[vllm] launch needs {field} (the vLLM venv's python and the trainer's "
                    "model directory)",
                    path=f"$.vllm.{field}",
                )
    elif http.weight_sync == "vllm" and not http.servers:
        raise ConfigError(
            'weight_sync = "vllm" needs vLLM servers: list them in [http] servers or start '
            "them with [vllm] launch",
            path="$.http.weight_sync",
        )


def check_launch_paths(config: VllmConfig, *, model: bool = True) -> None:
    """Refuse a ``[vllm]`` python or model that is not there (a ``ConfigError`` naming
    the field), so a job can check before it writes anything. ``model=False`` checks the
    python only (the model is the trainer's, checked where it is prepared)."""
    python, directory = Path(config.python).expanduser(), Path(config.model).expanduser()
    if not python.is_file():
        raise ConfigError(f"no python at {python}", path="$.vllm.python")
    if model and not (directory / "config.json").is_file():
        raise ConfigError(f"{directory} holds no model (no config.json)", path="$.vllm.model")
