"""The data-plane seam: a partitioned row store behind one small protocol.

Controller-side mutations (canonical puts, clears) pass the caller's barrier cut; generation
workers stage rows without one, and the restore inventory pass reconciles what they left.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..ledger._cut import MutationCut

__all__ = ["DataPlane", "Row"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One stored row: token ids, a per-token mask, per-token logprobs and small metadata.

    ``metadata`` holds JSON-like values only (str keys; str, int, float, bool, None, lists
    and dicts of those), so every backend can persist it without pickling.
    """

    token_ids: npt.NDArray[np.int32]
    token_mask: npt.NDArray[np.float32]
    logprobs: npt.NDArray[np.float32]
    metadata: Mapping[str, Any] = field(default_factory=dict)


class DataPlane(Protocol):
    """A partitioned key -> :class:`Row` store.

    Semantics every backend keeps:
    - ``put`` makes the rows visible to every reader when it returns (and, for a durable
      backend, able to survive a SIGKILL of the process); putting an existing key replaces it.
    - ``get`` returns rows in the order of ``keys``; a missing key raises ``KeyError`` naming it.
    - ``clear`` removes keys; clearing a missing key is not an error (cleanup is idempotent).
    - ``keys`` lists a partition's keys in sorted order.
    - ``snapshot`` writes a self-contained copy to a new directory; ``restore`` replaces the
      store's whole content with a snapshot's.
    """

    def put(
        self, partition: str, rows: Mapping[str, Row], *, cut: MutationCut | None = None
    ) -> None: ...

    def get(self, partition: str, keys: Sequence[str]) -> list[Row]: ...

    def clear(
        self, partition: str, keys: Iterable[str], *, cut: MutationCut | None = None
    ) -> None: ...

    def keys(self, partition: str) -> list[str]: ...

    def snapshot(self, directory: Path) -> None: ...

    def restore(self, directory: Path) -> None: ...

    def close(self) -> None: ...
