"""Finalization: sealed receipts and staged rows -> exactly N canonical rows; GRPO advantages.

Finalizing a group verifies and linearizes each sibling's receipt against its staged rows,
finalizes rewards (shape, then penalize) and builds the group's N canonical rows, masked
placeholders included; it only reads. :func:`publish_finalized_group` runs it inside the
caller's ``group_commits`` cut and hands ownership from the ledger to the replay index.
:func:`grpo_advantages` computes one group's advantages with placeholders masked out.
"""

from ._advantages import grpo_advantages
from ._publish import publish_finalized_group
from ._rows import CanonicalRowMeta

__all__ = [
    "CanonicalRowMeta",
    "grpo_advantages",
    "publish_finalized_group",
]
