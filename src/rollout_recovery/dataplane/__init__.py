"""Data plane: the checkpoint barrier and its cut, and the partitioned row stores."""

from ..errors import DataPlaneClosedError, InvalidRowError, MissingRowError
from ._barrier import (
    CHECKPOINT_MUTATION_KINDS,
    DataPlaneCheckpointBarrier,
    DataPlaneCheckpointBarrierTelemetry,
    DataPlaneMutationCut,
)
from ._inventory import reconcile_staging
from ._memory import MemoryDataPlane
from ._protocol import DataPlane, Row
from ._replay import CANONICAL_PARTITION, ReplayGroup, ReplayIndex
from ._sqlite import SNAPSHOT_FILE, SqliteDataPlane

__all__: list[str] = []
__all__ += [
    "CHECKPOINT_MUTATION_KINDS",
    "DataPlaneCheckpointBarrier",
    "DataPlaneCheckpointBarrierTelemetry",
    "DataPlaneMutationCut",
]

__all__ += [
    "CANONICAL_PARTITION",
    "SNAPSHOT_FILE",
    "DataPlane",
    "DataPlaneClosedError",
    "InvalidRowError",
    "MemoryDataPlane",
    "MissingRowError",
    "ReplayGroup",
    "ReplayIndex",
    "Row",
    "SqliteDataPlane",
    "reconcile_staging",
]
