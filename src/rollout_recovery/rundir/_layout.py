"""The run directory: every file of a run is named here, and only here.

::

    DIR/job.toml              the job's configuration: a directory belongs to one job
    DIR/.lock                 held (flock) by the one live job; names its pid
    DIR/run_log.jsonl         one line per start, resume or config change; never cut back
    DIR/dataplane.sqlite      the durable row store (staging and canonical rows)
    DIR/shards/shard-<i>.sqlite   the Ray backend's data shards instead
    DIR/checkpoints/          step_NNNNNN/ (see ``_checkpoint_store``)
    DIR/events.jsonl          the audit trail: typed history records (trained rows included)
    DIR/metrics.jsonl         one line per trained step
    DIR/reward.png            mean reward per step, restarts and checkpoints marked
    DIR/servers.json, servers/   local generation servers a job started
    DIR/DRAIN                 a drain request (``[job] drain_file``, the default name)

Files of a run hold prompts, rewards and server names: they are created readable by their
owner only (``_durable.PRIVATE_FILE_MODE``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ._lock import is_locked, lock_holder, run_directory_lock, wait_unlocked
from ._run_log import RunLogEntry, append_run_log, read_run_log

__all__ = ["CHECKPOINT_FILES", "CheckpointFiles", "RunDirectory"]


@dataclass(frozen=True, slots=True)
class CheckpointFiles:
    """The names of a checkpoint's files (besides the ledger sidecar, which ``checkpoint``
    names by format: ``rollout_recovery.sidecar`` or NeMo-RL's ``rollout_recovery.pt``)."""

    #: The replay index's state: which canonical groups exist and their row keys.
    replay_index: str = "replay_index.msgpack"
    #: The controller's state (``control.ControllerState``).
    controller_state: str = "controller_state.msgpack"
    #: The trainer's state (weights, optimizer, RNG), as plain arrays.
    trainer_state: str = "policy.npz"
    #: Or, for a trainer whose state is files (``policy.FileStateTrainer``: the torch
    #: trainer's safetensors and JSON), each of them under this prefix
    #: (``trainer.model.safetensors``), instead of ``trainer_state``.
    trainer_file_prefix: str = "trainer."

    def trainer_file(self, name: str) -> str:
        """The checkpoint's name for the trainer's state file ``name``."""
        return self.trainer_file_prefix + name

    def trainer_files(self, names: Iterable[str]) -> dict[str, str]:
        """The trainer's state files among a checkpoint's ``names``: checkpoint name ->
        the trainer's own name."""
        prefix = self.trainer_file_prefix
        return {name: name[len(prefix) :] for name in names if name.startswith(prefix)}


CHECKPOINT_FILES = CheckpointFiles()


@dataclass(frozen=True, slots=True)
class RunDirectory:
    """The paths of one run directory; constructing it touches nothing on disk."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def job_file(self) -> Path:
        return self.root / "job.toml"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def run_log(self) -> Path:
        return self.root / "run_log.jsonl"

    @property
    def data_plane_file(self) -> Path:
        return self.root / "dataplane.sqlite"

    @property
    def shards_dir(self) -> Path:
        return self.root / "shards"

    def shard_files(self) -> list[Path]:
        """The Ray backend's shard files that exist, in shard order."""
        return sorted(self.shards_dir.glob("shard-*.sqlite"))

    def data_plane_files(self) -> list[Path]:
        """Every durable row store file of the run: the embedded store or the shards."""
        embedded = [self.data_plane_file] if self.data_plane_file.is_file() else []
        return embedded + self.shard_files()

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def plot(self) -> Path:
        return self.root / "reward.png"

    @property
    def servers_file(self) -> Path:
        return self.root / "servers.json"

    @property
    def servers_dir(self) -> Path:
        return self.root / "servers"

    def resolve(self, configured: str | Path) -> Path:
        """A path from the job's configuration: absolute as given, else inside the run
        directory (``[job] drain_file``)."""
        return self.root / configured  # an absolute right-hand side replaces the root

    def trail_files(self) -> dict[str, Path]:
        """The audit trail's files by name, as checkpoints record their lengths."""
        return {path.name: path for path in (self.events, self.metrics)}

    # The lock and the run log act on this directory's files: they are its methods (the
    # code lives in ``_lock`` and ``_run_log``).

    def lock(self) -> AbstractContextManager[None]:
        """Hold the run's lock for the ``with`` block; refuse at once if another job holds
        it (:class:`~rollout_recovery.errors.RunDirectoryLockedError` naming its pid)."""
        return run_directory_lock(self)

    def lock_holder(self) -> int | None:
        """The pid a live job wrote into the lock file, or None if unknown."""
        return lock_holder(self)

    def is_locked(self) -> bool:
        """Whether a live job holds the lock (a read-only probe)."""
        return is_locked(self.lock_file)

    def wait_unlocked(self, *, timeout: float | None = None) -> bool:
        """Wait until no live job holds the lock; False if ``timeout`` seconds passed."""
        return wait_unlocked(self.lock_file, timeout=timeout)

    def append_run_log(
        self,
        event: Literal["start", "resume", "drain"],
        *,
        step: int,
        checkpoint: str | None = None,
        config_changes: list[str] | None = None,
        reason: str | None = None,
    ) -> None:
        """Append one line to ``run_log.jsonl`` (never cut back, unlike the history)."""
        append_run_log(
            self,
            event,
            step=step,
            checkpoint=checkpoint,
            config_changes=config_changes,
            reason=reason,
        )

    def read_run_log(self) -> Iterator[RunLogEntry]:
        """The run log's entries; ``InvalidStateError`` naming ``file:line`` for a damaged
        one."""
        return read_run_log(self)
