"""The run directory: one layout that names every file, the checkpoint store, the lock.

:class:`RunDirectory` is the only place a path inside a run is built. The
:class:`CheckpointStore` publishes checkpoint directories atomically (temporary
directory, fsync, ``COMMITTED`` manifest, rename, ``LATEST``, retention, fallback past
damaged ones). :func:`run_directory_lock` keeps a second job out of a live run.
"""

from ._checkpoint_store import CheckpointStore, LoadedCheckpoint, SkippedCheckpoint
from ._layout import RunDirectory

__all__ = ["CheckpointStore", "LoadedCheckpoint", "RunDirectory", "SkippedCheckpoint"]
