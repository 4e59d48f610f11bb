"""The one thing the ledger and the stores need from the barrier: proof of a live section.

A bottom-level module, so the ledger and the data plane share it without importing each
other.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["MutationCut"]


class MutationCut(Protocol):
    """Any object whose ``require_live()`` raises once its barrier section has exited.

    The ledger is pure and imports nothing from the data plane; ``DataPlaneMutationCut``
    satisfies this protocol structurally, and so does a test double.
    """

    def require_live(self) -> None: ...
