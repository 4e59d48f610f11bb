"""The run directory: one layout that names every file, the checkpoint store, the lock.

:class:`RunDirectory` is the only place a path inside a run is built. The
:class:`CheckpointStore` publishes checkpoint directories atomically (temporary
directory, fsync, ``COMMITTED`` manifest, rename, ``LATEST``, retention, fallback past
damaged ones). :func:`run_directory_lock` keeps a second job out of a live run.
"""

from ._checkpoint_store import CheckpointStore, LoadedCheckpoint, SkippedCheckpoint
from ._layout import CHECKPOINT_FILES, PRIVATE_FILE_MODE, RunDirectory
from ._lock import is_locked, lock_holder, run_directory_lock, wait_unlocked
from ._run_log import append_run_log, read_run_log

__all__ = [
    "CHECKPOINT_FILES",
    "PRIVATE_FILE_MODE",
    "CheckpointStore",
    "LoadedCheckpoint",
    "RunDirectory",
    "SkippedCheckpoint",
    "append_run_log",
    "is_locked",
    "lock_holder",
    "read_run_log",
    "run_directory_lock",
    "wait_unlocked",
]
