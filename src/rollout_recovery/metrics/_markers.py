"""How a marker (a restart, a checkpoint, a drop) becomes something a tool shows.

Every sink shows a marker the same two ways: a line of text (``restored at step 6:
checkpoint=step_000006, tokens_lost=402``) and scalars: ``markers/<kind>/count`` (how many
at that step) and ``markers/<kind>/<field>`` for each numeric field, so wasted tokens
(``markers/restored/tokens_lost``) and drops per step are charts.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._protocol import MarkerField

__all__ = ["PendingMarkers", "marker_scalars", "marker_text"]


def _numeric(value: MarkerField) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def marker_scalars(kind: str, fields: Mapping[str, MarkerField]) -> dict[str, float | int]:
    """``markers/<kind>/count`` = 1 and ``markers/<kind>/<field>`` for each numeric field.

    Never ``markers/<kind>`` itself: MLflow's file store keeps ``a/b`` as file ``b`` in
    directory ``a``, so no key may also be a section of another.
    """
    count_key = f"markers/{kind}/count"
    scalars: dict[str, float | int] = {}
    for name, value in fields.items():
        if _numeric(value):
            assert isinstance(value, int | float)
            scalars[f"markers/{kind}/{name}"] = value
    scalars[count_key] = 1  # a field named "count" is only in the text
    return scalars


def marker_text(step: int, kind: str, fields: Mapping[str, MarkerField]) -> str:
    shown = ", ".join(f"{name}={value}" for name, value in fields.items())
    return f"{kind} at step {step}" + (f": {shown}" if shown else "")


class PendingMarkers:
    """Markers waiting to be written into the next step's row (for W&B, whose rows are
    one per step and never go back).

    Several markers of one kind before the row add up in ``markers/<kind>/count``; their numeric
    fields keep the last value; ``markers/<kind>/step`` keeps the step the last one
    happened at, which may be earlier than the row's.
    """

    __slots__ = ("_counts", "_fields")

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._fields: dict[str, float | int] = {}

    def add(self, step: int, kind: str, fields: Mapping[str, MarkerField]) -> None:
        scalars = marker_scalars(kind, fields)
        count_key = f"markers/{kind}/count"
        self._counts[count_key] = self._counts.get(count_key, 0) + 1
        del scalars[count_key]
        self._fields.update(scalars)
        self._fields[f"markers/{kind}/step"] = step

    def __bool__(self) -> bool:
        return bool(self._counts)

    def drain(self) -> dict[str, float | int]:
        row: dict[str, float | int] = {**self._counts, **self._fields}
        self._counts.clear()
        self._fields.clear()
        return row
