"""Internal but importable: what the checkpoint codecs need from the ledger's storage.

Not a stable API and not re-exported anywhere. The native sidecar decodes file bytes
straight into the ledger's storage Structs (``GroupState`` and what it holds) and hands
them to ``RolloutRecoveryLedger.from_decoded_groups``; the storage-based encoder builds the
controller part of a sidecar through the same validation seam as the dict path. Sibling
packages import these names from here, never from the ledger's private modules.
"""

from __future__ import annotations

from ._constants import SIDECAR_STATE_FIELDS
from ._sidecar import build_controller_state, check_sampler_stamps_flag
from ._storage import (
    AttemptState,
    GroupState,
    PromptRefState,
    RewardChecksState,
    RewardLogContextState,
    SiblingState,
)

__all__ = [
    "SIDECAR_STATE_FIELDS",
    "AttemptState",
    "GroupState",
    "PromptRefState",
    "RewardChecksState",
    "RewardLogContextState",
    "SiblingState",
    "build_controller_state",
    "check_sampler_stamps_flag",
]
