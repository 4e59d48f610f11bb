"""Data plane: the checkpoint barrier and its cut, the partitioned row stores, the replay index.

A store implements :class:`DataPlane` (key -> :class:`Row` per partition);
:class:`MemoryDataPlane` and :class:`SqliteDataPlane` are the two backends, and a wrapper
around one validates its arguments with ``rollout_recovery._checks``, as the backends do.
Row codecs are private.
"""

from ._barrier import DataPlaneCheckpointBarrier, DataPlaneMutationCut
from ._memory import MemoryDataPlane
from ._protocol import DataPlane, Row
from ._replay import ReplayIndex
from ._sqlite import SqliteDataPlane

__all__ = [
    "DataPlane",
    "DataPlaneCheckpointBarrier",
    "DataPlaneMutationCut",
    "MemoryDataPlane",
    "ReplayIndex",
    "Row",
    "SqliteDataPlane",
]
