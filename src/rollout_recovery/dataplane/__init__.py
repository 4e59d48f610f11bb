"""Data plane: the checkpoint barrier and its cut, the partitioned row stores, the replay index.

A store implements :class:`DataPlane` (key -> :class:`Row` per partition);
:class:`MemoryDataPlane` and :class:`SqliteDataPlane` are the two backends, and a wrapper
around one validates its arguments with :func:`check_partition` and
:func:`check_keys_argument`, as the backends do. Row codecs are private.
"""

from ._barrier import (
    CHECKPOINT_MUTATION_KINDS,
    DataPlaneCheckpointBarrier,
    DataPlaneCheckpointBarrierTelemetry,
    DataPlaneMutationCut,
)
from ._codec import check_keys_argument, check_partition
from ._inventory import reconcile_staging
from ._memory import MemoryDataPlane
from ._protocol import DataPlane, Row
from ._replay import CANONICAL_PARTITION, ReplayGroup, ReplayIndex
from ._snapshot_tools import merge_snapshots, split_snapshot
from ._sqlite import SqliteDataPlane

__all__ = [
    "CANONICAL_PARTITION",
    "CHECKPOINT_MUTATION_KINDS",
    "DataPlane",
    "DataPlaneCheckpointBarrier",
    "DataPlaneCheckpointBarrierTelemetry",
    "DataPlaneMutationCut",
    "MemoryDataPlane",
    "ReplayGroup",
    "ReplayIndex",
    "Row",
    "SqliteDataPlane",
    "check_keys_argument",
    "check_partition",
    "merge_snapshots",
    "reconcile_staging",
    "split_snapshot",
]
