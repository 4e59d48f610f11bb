"""What a metric key, a step, a value and a marker may be; one grammar for every sink.

A key is ``/``-separated segments of letters, digits, ``_ - .`` and spaces, at most 250
characters: what MLflow accepts as a metric name (the strictest of the tools) and what
W&B and TensorBoard group into sections by the text before the first ``/``. A segment of
dots alone is refused: MLflow's file store would resolve it as a path. For the same
store no key of a call may also be a section of another (``a`` beside ``a/b``): it keeps
``a/b`` as file ``b`` in directory ``a``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ._protocol import MarkerField, Scalar

__all__ = [
    "MAX_KEY_LENGTH",
    "check_fields",
    "check_key",
    "check_kind",
    "check_step",
    "check_values",
    "flatten_scalars",
    "key_segment",
]

MAX_KEY_LENGTH: Final = 250
_SEGMENT = r"(?!\.+(?:/|$))[A-Za-z0-9_\-. ]+"
_KEY = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*\Z")
_ONE_SEGMENT = re.compile(rf"{_SEGMENT}\Z")
_OUTSIDE_SEGMENT = re.compile(r"[^A-Za-z0-9_\-. ]")
_MAX_STEP: Final = 2**63 - 1


def check_step(step: object, *, name: str = "step") -> int:
    if isinstance(step, bool) or not isinstance(step, int):
        raise InvalidArgumentTypeError(f"{name} must be an int, got {type(step).__name__}")
    if not 0 <= step <= _MAX_STEP:
        raise InvalidArgumentError(f"{name} must be in [0, 2**63 - 1], got {step}")
    return step


def check_key(key: object, *, where: str) -> str:
    if not isinstance(key, str):
        raise InvalidArgumentTypeError(
            f"a metric key must be a str, got {type(key).__name__}", path=where
        )
    if len(key) > MAX_KEY_LENGTH or not _KEY.match(key):
        raise InvalidArgumentError(
            f"metric key {key!r} is not '/'-separated segments of letters, digits, "
            f"'_', '-', '.' and spaces (at most {MAX_KEY_LENGTH} characters)",
            path=where,
        )
    return key


def check_values(values: object) -> dict[str, Scalar]:
    """A plain copy of one step's values, or the first bad key or value named."""
    if not isinstance(values, Mapping):
        raise InvalidArgumentTypeError(f"values must be a mapping, got {type(values).__name__}")
    checked: dict[str, Scalar] = {}
    for key, value in values.items():
        where = f"$[{key!r}]"
        check_key(key, where=where)
        if key == "step":
            raise InvalidArgumentError(
                "values must not hold 'step': the step is log_step's argument", path=where
            )
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise InvalidArgumentTypeError(
                f"a metric value must be an int, a float or None, got {type(value).__name__}",
                path=where,
            )
        checked[key] = value
    for key in checked:
        section = key.rpartition("/")[0]
        while section:
            if section in checked:
                raise InvalidArgumentError(
                    f"metric key {section!r} is also a section of {key!r}", path=f"$[{key!r}]"
                )
            section = section.rpartition("/")[0]
    return checked


def check_kind(kind: object) -> str:
    if not isinstance(kind, str):
        raise InvalidArgumentTypeError(f"a marker kind must be a str, got {type(kind).__name__}")
    if not _ONE_SEGMENT.match(kind) or len(kind) > 64:
        raise InvalidArgumentError(
            f"marker kind {kind!r} must be one key segment of at most 64 characters"
        )
    return kind


def check_fields(fields: object) -> dict[str, MarkerField]:
    if not isinstance(fields, Mapping):
        raise InvalidArgumentTypeError(f"fields must be a mapping, got {type(fields).__name__}")
    checked: dict[str, MarkerField] = {}
    for key, value in fields.items():
        where = f"$[{key!r}]"
        if not isinstance(key, str) or not _ONE_SEGMENT.match(key) or len(key) > 64:
            raise InvalidArgumentError(
                f"marker field name {key!r} must be one key segment of at most 64 characters",
                path=where,
            )
        if value is not None and not isinstance(value, str | int | float):
            raise InvalidArgumentTypeError(
                f"a marker field must be a str, int, float, bool or None, got "
                f"{type(value).__name__}",
                path=where,
            )
        checked[key] = value
    return checked


def key_segment(name: str) -> str:
    """``name`` as one valid key segment: other characters become ``_`` (a URL, a path)."""
    segment = _OUTSIDE_SEGMENT.sub("_", name) or "_"
    return "_" if set(segment) == {"."} else segment


def _plain(value: object) -> Scalar | str:
    # numpy scalars (a reward, a count) become their Python value; str is "not a number".
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, str | bytes):
        value = item()
    if isinstance(value, bool):
        return int(value)
    if value is None or isinstance(value, int | float):
        return value
    return ""


def flatten_scalars(record: Mapping[str, object]) -> dict[str, Scalar]:
    """The numbers of a nested record as flat ``a/b/c`` keys, for ``log_step``.

    Nested mappings become one key per leaf. A name that is a valid key already is kept
    (``train/loss``); any other is made one segment (a server's URL,
    ``http://127.0.0.1:8000``, becomes ``http___127.0.0.1_8000``). Bools become 0 and 1,
    numpy scalars their value, ``None`` stays ``None``; strings, lists and anything else
    are left out: they are not points on a chart. ``step`` at the top is left out too
    (it is ``log_step``'s argument), and so are keys past 250 characters and a key that
    collides with an earlier key or section (the first wins).
    """
    flat: dict[str, Scalar] = {}
    sections: set[str] = set()
    _flatten_into(flat, sections, record, "")
    return flat


def _sections_of(key: str) -> list[str]:
    parts = key.split("/")
    return ["/".join(parts[:end]) for end in range(1, len(parts))]


def _flatten_into(
    flat: dict[str, Scalar], sections: set[str], record: Mapping[str, object], prefix: str
) -> None:
    for name, value in record.items():
        if not prefix and name == "step":
            continue
        text = str(name)
        part = text if _KEY.match(text) else key_segment(text)
        key = f"{prefix}{part}"
        above = _sections_of(key)
        if key in flat or len(key) > MAX_KEY_LENGTH or any(s in flat for s in above):
            continue
        if isinstance(value, Mapping):
            sections.update(above)
            sections.add(key)
            _flatten_into(flat, sections, value, f"{key}/")
            continue
        plain = _plain(value)
        if isinstance(plain, str) or key in sections:
            continue
        sections.update(above)
        flat[key] = plain
