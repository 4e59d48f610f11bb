"""What a canonical training row says about itself wherever it goes: :class:`RowFacts`.

One fact has two shapes on disk, and each shape is kept as it is: the row's metadata in
the data plane (``finalize.CanonicalRowMeta``: plain keys a data-plane backend stores as
is, read back by every restore) and the row as a training step used it in the journal
(``history.records.TrainedRow``, in ``step_trained``). Both are this Struct plus what only
that shape holds, so each shared field is declared once and means one thing.

A bottom module, not ``finalize``'s: the journal's schema (``history``, a room above) and
the finalizer both derive from it, and a facade export for one base class would cost a
name of the public surface.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["RowFacts"]


class RowFacts(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The facts of one canonical row that its stored metadata and the journal share."""

    group_id: str
    generation_index: int
    #: Gate id of the sealed attempt, ``"{group_id}_g{i}_a{hex}"``.
    rollout_id: str
    #: The receipt verified and the reward was finalized (False: a masked placeholder).
    valid: bool
    #: The final (shaped, then penalized) reward; 0.0 for a placeholder.
    reward: float
    #: The group's minimum version (what staleness accounting uses).
    weight_version: int
    #: ``[version, start, end]``: the weight version that generated the row's tokens
    #: ``[start, end)`` (row positions; carried tokens are in none). A call interrupted
    #: by new weights adds a span per version. Empty for a placeholder.
    weight_version_spans: list[tuple[int, int, int]] = []

    def facts(self) -> dict[str, Any]:
        """This row's ``RowFacts`` fields by name (a subclass's own left out): what the
        row's other shape is built from, so no field is copied by hand."""
        return {name: getattr(self, name) for name in RowFacts.__struct_fields__}
