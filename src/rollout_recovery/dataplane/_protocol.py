"""The data-plane seam: a partitioned row store behind one small protocol.

Cut policy. Controller-side mutations (canonical puts, clears, restore) pass the caller's
barrier cut and every backend calls ``cut.require_live()`` before it changes anything.
Generation workers stage rows outside any barrier section and pass no cut; the restore
inventory pass reconciles what they left behind. The store itself never *requires* a cut,
because it cannot tell a worker's staging put from a controller's put; the owners of the
canonical partition (the replay index, the finalizer) require one of their callers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from .._cut import MutationCut
from ..errors import (
    DataPlaneClosedError,
    InvalidRowError,
    MissingRowError,
)

__all__ = [
    "DataPlane",
    "DataPlaneClosedError",
    "InvalidRowError",
    "MissingRowError",
    "Row",
]

# Error messages list at most this many keys, then the total, so that a partition-sized
# mismatch stays readable.


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One stored row: token ids, a per-token mask, per-token logprobs and small metadata.

    ``token_ids`` is 1-D int32, ``token_mask`` and ``logprobs`` are 1-D float32. The store
    does not check that the three lengths agree: a misaligned row written by a worker must
    reach the finalizer, which turns it into a placeholder with a reason.

    ``metadata`` holds JSON-like values only (str keys; str, int, float, bool, None, lists
    and dicts of those), so every backend can persist it without pickling. Tuples come back
    as lists.
    """

    token_ids: npt.NDArray[np.int32]
    token_mask: npt.NDArray[np.float32]
    logprobs: npt.NDArray[np.float32]
    metadata: Mapping[str, Any] = field(default_factory=dict)


class DataPlane(Protocol):
    """A partitioned key -> :class:`Row` store.

    Semantics every backend keeps:
    - ``put`` makes the rows visible to every reader when it returns (and, for a durable
      backend, able to survive a SIGKILL of the process); putting an existing key replaces
      it. A put is all or nothing: a refused or failed put stores none of its rows.
    - ``get`` returns rows in the order of ``keys`` as fresh arrays the caller may modify;
      a missing key raises :class:`MissingRowError` (a ``KeyError``) naming it.
    - ``clear`` removes keys; clearing a missing key is not an error (cleanup is idempotent).
    - ``keys`` lists a partition's keys in sorted order.
    - ``snapshot`` writes a self-contained copy to a new directory, atomically: the directory
      appears complete or not at all. ``restore`` replaces the store's whole content with a
      snapshot's; a refused restore changes nothing. Every backend reads every backend's
      snapshots.
    - A ``cut``, when given, is checked with ``require_live()`` before any state changes.
    """

    def put(
        self, partition: str, rows: Mapping[str, Row], *, cut: MutationCut | None = None
    ) -> None: ...

    def get(self, partition: str, keys: Sequence[str]) -> list[Row]: ...

    def clear(
        self, partition: str, keys: Iterable[str], *, cut: MutationCut | None = None
    ) -> None: ...

    def keys(self, partition: str) -> list[str]: ...

    def snapshot(self, directory: Path, *, cut: MutationCut | None = None) -> None: ...

    def restore(self, directory: Path, *, cut: MutationCut | None = None) -> None: ...

    def close(self) -> None: ...
