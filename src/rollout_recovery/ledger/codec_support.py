"""Internal but importable: what the checkpoint codecs need from the ledger's storage.

Not a stable API and not re-exported anywhere. The native sidecar decodes file bytes
straight into the ledger's storage Struct ``GroupState`` (its payload schema is derived
from it) and hands the groups to the ledger (``from_decoded_groups``, or
``load_decoded_groups`` under a cut); the storage-based encoder gets both parts of a
sidecar from ``checkpoint_parts``, the same validation seam as the dict path. The readers
of either lineage tell them apart with ``SidecarLineage`` and check a Gym-lineage state
with ``parse_gym_sidecar`` / ``gym_sidecar_problems`` (no ledger ever holds one). Sibling
packages import these names from here, never from the ledger's private modules.
"""

from __future__ import annotations

from ._constants import SIDECAR_STATE_FIELDS
from ._gym_state import GymSidecar, SchemaError, gym_sidecar_problems, parse_gym_sidecar
from ._lineage import SidecarLineage, lineage_mismatches
from ._sidecar import SidecarFields, checkpoint_parts
from ._storage import GroupState

__all__ = [
    "SIDECAR_STATE_FIELDS",
    "GroupState",
    "GymSidecar",
    "SchemaError",
    "SidecarFields",
    "SidecarLineage",
    "checkpoint_parts",
    "gym_sidecar_problems",
    "lineage_mismatches",
    "parse_gym_sidecar",
]
