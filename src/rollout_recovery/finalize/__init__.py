"""Finalization: sealed receipts and staged rows -> exactly N canonical rows; GRPO advantages.

:func:`finalize_group` verifies and linearizes each sibling's receipt against its staged
rows, finalizes rewards (shape, then penalize) and builds the group's N canonical rows,
masked placeholders included; it only reads. :func:`publish_finalized_group` hands the
group from the ledger to the replay index inside the caller's ``group_commits`` cut (the
controller's ``group_published`` transition, live with the rows, in a replay without).
:func:`grpo_advantages` computes one group's advantages with placeholders masked out.
"""

from ._advantages import grpo_advantages
from ._group import finalize_group
from ._publish import publish_finalized_group
from ._rows import CanonicalRowMeta

__all__ = [
    "CanonicalRowMeta",
    "finalize_group",
    "grpo_advantages",
    "publish_finalized_group",
]
