"""The project's exception hierarchy.

Every error the library raises on purpose derives from :class:`RolloutRecoveryError` *and*
from the builtin type the seed contract names (``ValueError``, ``TypeError`` or
``RuntimeError``), so code written against NeMo-RL's ledger keeps catching what it caught,
while callers that need to branch can catch a project class and read structured fields
instead of parsing message text.
"""

from __future__ import annotations

__all__ = [
    "BarrierNestingError",
    "CheckpointUnsafeError",
    "DeadCutError",
    "InvalidStateError",
    "InvalidStateTypeError",
    "InvalidTransitionError",
    "RolloutRecoveryError",
    "UnknownGroupError",
]


class RolloutRecoveryError(Exception):
    """Root of every error raised on purpose by ``rollout_recovery``."""


class InvalidTransitionError(RolloutRecoveryError, ValueError):
    """A ledger transition was refused; the ledger is unchanged.

    ``group_id`` names the group at fault when one is known.
    """

    def __init__(self, message: str, *, group_id: str | None = None) -> None:
        super().__init__(message)
        self.group_id = group_id


class UnknownGroupError(InvalidTransitionError):
    """The named group is not owned by the ledger."""


class InvalidStateError(RolloutRecoveryError, ValueError):
    """Persisted state (a state dict, a sidecar, a file) breaks the schema or an invariant.

    ``path`` locates the offending field, for example
    ``$.groups[3].siblings[0].attempts[1].status``, when it is known.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class InvalidStateTypeError(RolloutRecoveryError, TypeError):
    """Persisted state has the wrong container type where the seed raises ``TypeError``."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class DeadCutError(RolloutRecoveryError, RuntimeError):
    """A ``DataPlaneMutationCut`` was used after its barrier section exited."""


class BarrierNestingError(RolloutRecoveryError, RuntimeError):
    """A task tried to open a barrier section while it already holds one."""


class CheckpointUnsafeError(RolloutRecoveryError, RuntimeError):
    """The ledger holds groups whose publication outcome is ambiguous; nothing was saved."""

    def __init__(self, message: str, *, group_ids: list[str]) -> None:
        super().__init__(message)
        self.group_ids = group_ids
