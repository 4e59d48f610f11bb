"""Internal but importable: what the checkpoint codecs need from the ledger's storage.

Not a stable API and not re-exported anywhere. The native sidecar decodes file bytes
straight into the ledger's storage Struct ``GroupState`` (its payload schema is derived
from it) and hands the groups to the ledger (``from_decoded_groups``, or
``load_decoded_groups`` under a cut); the storage-based encoder gets both parts of a
sidecar from ``checkpoint_parts``, the same validation seam as the dict path. Sibling
packages import these names from here, never from the ledger's private modules.
"""

from __future__ import annotations

from ._constants import SIDECAR_STATE_FIELDS
from ._sidecar import SidecarFields, checkpoint_parts
from ._storage import GroupState

__all__ = ["SIDECAR_STATE_FIELDS", "GroupState", "SidecarFields", "checkpoint_parts"]
