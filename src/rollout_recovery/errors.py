"""The project's exception hierarchy.

Every error the library raises on purpose derives from :class:`RolloutRecoveryError` *and*
from the builtin type the seed contract names (``ValueError``, ``TypeError`` or
``RuntimeError``), so code written against NeMo-RL's ledger keeps catching what it caught,
while callers that need to branch can catch a project class and read structured fields
instead of parsing message text.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "MAX_LISTED_KEYS",
    "BarrierNestingError",
    "BarrierTimeoutError",
    "CheckpointUnsafeError",
    "DataPlaneClosedError",
    "DeadCutError",
    "InvalidRowError",
    "InvalidStateError",
    "InvalidStateTypeError",
    "InvalidTransitionError",
    "MissingRowError",
    "RolloutRecoveryError",
    "StagingInventoryError",
    "UnknownGroupError",
    "UnknownMutationKindError",
    "format_keys",
    "split_validation_path",
]

# Messages list at most this many ids: enough to debug, bounded for a 10^5-key inventory.
MAX_LISTED_KEYS = 10


def split_validation_path(message: str) -> tuple[str, str | None]:
    """Split msgspec's ``"... - at `$.a[0].b`"`` into the message and its JSON path.

    The path is ``None`` when the message names none.
    """
    head, marker, tail = message.rpartition(" - at `")
    if not marker or not tail.endswith("`"):
        return message, None
    # A bad mapping key reads "- at `key` in `$.path`": the path is the mapping's.
    tail = tail.removeprefix("key` in `")
    if tail.startswith("$"):
        return head, tail[:-1]
    return message, None


def format_keys(keys: Sequence[str]) -> str:
    """``['a', 'b'] (total=2)``: the first few keys of a list, for error messages."""
    shown = sorted(keys)[:MAX_LISTED_KEYS]
    return f"{shown!r} (total={len(keys)})"


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


class UnknownMutationKindError(RolloutRecoveryError, ValueError):
    """``barrier.mutation(kind=...)`` named a kind outside ``CHECKPOINT_MUTATION_KINDS``."""


class MissingRowError(RolloutRecoveryError, KeyError):
    """A data-plane ``get`` named keys the partition does not hold; nothing was returned.

    ``partition`` and ``keys`` (every missing key, in request order) are structured fields.
    """

    def __init__(self, partition: str, keys: Sequence[str]) -> None:
        self.partition = partition
        self.keys = list(keys)
        super().__init__(
            f"data plane partition {partition!r} has no row for keys {format_keys(self.keys)}"
        )

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes.
        return str(self.args[0])


class InvalidRowError(RolloutRecoveryError, ValueError):
    """A row (on ``put``) or a stored row (on ``get`` / ``restore``) breaks the row format.

    ``key`` names the row and ``field`` the offending field (for example ``token_ids`` or
    ``metadata['calls'][2]``) when they are known.
    """

    def __init__(self, message: str, *, key: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.field = field


class DataPlaneClosedError(RolloutRecoveryError, RuntimeError):
    """A data-plane store was used after ``close()``."""


class StagingInventoryError(RolloutRecoveryError, RuntimeError):
    """The ledger owns staging rows the data plane does not hold: sealed work was lost.

    ``missing`` lists every missing staging key. Nothing was deleted.
    """

    def __init__(self, missing: Sequence[str]) -> None:
        self.missing = list(missing)
        super().__init__(
            "rollout-recovery ownership references staging rows missing from the data "
            f"plane: missing={format_keys(self.missing)}"
        )


class BarrierTimeoutError(RolloutRecoveryError, TimeoutError):
    """A barrier section could not be entered before its deadline; nothing was held.

    ``section`` is ``"mutation"`` or ``"checkpoint"``; ``kind`` the mutation kind (None for
    a checkpoint); ``timeout`` the deadline in seconds.
    """

    def __init__(self, *, section: str, kind: str | None, timeout: float) -> None:
        what = f"{section} section" + (f" of kind {kind!r}" if kind else "")
        super().__init__(
            f"could not enter the data-plane barrier's {what} within {timeout:g} s; "
            "nothing is held and the barrier is unchanged"
        )
        self.section = section
        self.kind = kind
        self.timeout = timeout
