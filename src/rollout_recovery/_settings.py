"""The machinery of the one config tree: sections, bounds, TOML in and out, identity.

Each component owns a frozen section Struct next to its code (``control`` the ``[job]``
section, ``rollout`` the ``[http]`` one, ...); the run config is the tree of them. This
module knows nothing of any section: it converts plain data into a tree strictly (every
refusal names its field path, ``$.faults.hang_rate``), writes a tree back as TOML, and
tells the job's *identity* from its *operational* settings.

Identity is what changes the training (group size, dataset, seed, rewards, policy): a run
directory belongs to one identity, and a checkpoint of another is refused. Operational
settings (server addresses, timeouts, checkpoint cadence, how many steps to run) may change
when a run resumes; a field says so by carrying :data:`OPERATIONAL` in its annotation::

    attempt_deadline_s: Annotated[PositiveFloat, OPERATIONAL] = 2.0

An identity field added after runs existed carries :data:`IDENTITY_WHEN_SET`: at its
default it is left out of the identity fingerprint, so the runs started before it keep
theirs (and resume); set to anything else it counts like any identity field.

Every integer is bounded by the 64-bit range the checkpoint formats can hold, and every
float must be finite, so a value that validates can always be written to a checkpoint.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta

from ._bounds import INT64_MAX
from ._messages import split_validation_path
from .errors import ConfigError, InvalidArgumentTypeError

__all__ = [
    "IDENTITY_WHEN_SET",
    "OPERATIONAL",
    "NonNegativeFloat",
    "NonNegativeInt",
    "PositiveFloat",
    "PositiveInt",
    "Rate",
    "Section",
    "config_differences",
    "config_from_builtins",
    "config_to_builtins",
    "config_to_toml",
    "identity_fingerprint",
    "read_toml",
]

#: Marks a field as operational: it may change when a run resumes.
OPERATIONAL = Meta(extra={"operational": True})
#: Marks an identity field added later: fingerprinted only when it is not at its default.
IDENTITY_WHEN_SET = Meta(extra={"identity_when_set": True})

# Every int is bounded by INT64_MAX: a larger value passes a lower bound but dies later
# with OverflowError in a checkpoint encoder, after the run directory was claimed.
PositiveInt = Annotated[int, Meta(ge=1, le=INT64_MAX)]
NonNegativeInt = Annotated[int, Meta(ge=0, le=INT64_MAX)]
PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegativeFloat = Annotated[float, Meta(ge=0)]
Rate = Annotated[float, Meta(ge=0, le=1)]

TreeT = TypeVar("TreeT", bound="Section")


class Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every config section: immutable, keyword-only, unknown keys refused."""


def read_toml(path: Path) -> dict[str, Any]:
    """Parse the TOML file at ``path``; every failure is a :class:`ConfigError` naming it."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{path}: cannot read the config file: {reason}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the config file is not UTF-8: {exc.reason}") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line L, column C)".
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def config_from_builtins(data: object, tree: type[TreeT]) -> TreeT:
    """Strictly convert plain data (parsed TOML, a checkpoint's copy) to ``tree``.

    An int is accepted where a float is expected (TOML's ``1`` for ``1.0``); a bool never
    counts as a number; floats must be finite; ints stay inside the 64-bit range.
    """
    try:
        config = msgspec.convert(data, tree)
    except msgspec.ValidationError as exc:
        message, field_path = split_validation_path(str(exc))
        choices = _choices_at(tree, field_path) if message.startswith("Invalid enum") else None
        if choices:
            # msgspec names the bad value only: say what the field takes.
            message += f"; expected one of {', '.join(map(repr, choices))}"
        raise ConfigError(message, path=field_path or "$") from exc
    for field_path, value in _leaves(config):
        # `inf` passes a lower bound (a latency of inf seconds would hang the run forever);
        # NaN is already refused by every bound.
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"Expected a finite `float`, got {value!r}", path=field_path)
    return config


_PATH_PART = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def _choices_at(tree: type[Section], path: str | None) -> list[object] | None:
    """The values a ``Literal`` or enum field at ``path`` (``$.a.b[1]``) takes, if it is
    one; None for any other type or a path this walk does not follow."""
    kind: msgspec.inspect.Type = msgspec.inspect.type_info(tree)
    for field_name, index in _PATH_PART.findall((path or "$")[1:]):
        while isinstance(kind, msgspec.inspect.Metadata):
            kind = kind.type
        if field_name and isinstance(kind, msgspec.inspect.StructType):
            found = [f.type for f in kind.fields if f.name == field_name]
            if not found:
                return None
            kind = found[0]
        elif index and isinstance(kind, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
            kind = kind.item_type
        else:
            return None
    while isinstance(kind, msgspec.inspect.Metadata):
        kind = kind.type
    if isinstance(kind, msgspec.inspect.LiteralType):
        return list(kind.values)
    if isinstance(kind, msgspec.inspect.EnumType):
        return [member.value for member in kind.cls]
    return None


def _leaves(tree: Section, prefix: str = "$") -> Iterator[tuple[str, object]]:
    """``("$.section.field", value)`` for every leaf, in declaration order."""
    for name in tree.__struct_fields__:
        value = getattr(tree, name)
        if isinstance(value, Section):
            yield from _leaves(value, f"{prefix}.{name}")
        else:
            yield f"{prefix}.{name}", value


def _operational_paths(
    tree: type[Section], prefix: str = "$", inherited: bool = False, key: str = "operational"
) -> set[str]:
    """Leaf paths marked ``key`` (operational); a section marked so marks all its leaves."""
    found: set[str] = set()
    info = msgspec.inspect.type_info(tree)
    assert isinstance(info, msgspec.inspect.StructType)
    for field in info.fields:
        kind = field.type
        path = f"{prefix}.{field.name}"
        operational = inherited
        if isinstance(kind, msgspec.inspect.Metadata):
            operational = operational or bool((kind.extra or {}).get(key))
            kind = kind.type
        if isinstance(kind, msgspec.inspect.StructType) and issubclass(kind.cls, Section):
            found |= _operational_paths(kind.cls, path, operational, key)
        elif operational:
            found.add(path)
    return found


_OPERATIONAL_CACHE: dict[type[Section], frozenset[str]] = {}


def operational_paths(tree: type[Section]) -> frozenset[str]:
    """The field paths of ``tree`` marked :data:`OPERATIONAL`."""
    cached = _OPERATIONAL_CACHE.get(tree)
    if cached is None:
        cached = _OPERATIONAL_CACHE[tree] = frozenset(_operational_paths(tree))
    return cached


_UNSET: Any = object()
_WHEN_SET_CACHE: dict[type[Section], dict[str, object]] = {}


def _identity_when_set(tree: type[Section]) -> dict[str, object]:
    """The paths of ``tree`` marked :data:`IDENTITY_WHEN_SET`, each with its default."""
    cached = _WHEN_SET_CACHE.get(tree)
    if cached is None:
        marked = _operational_paths(tree, key="identity_when_set")
        defaults = dict(_leaves(tree()))
        cached = _WHEN_SET_CACHE[tree] = {path: defaults[path] for path in marked}
    return cached


def config_differences(a: Section, b: Section, *, which: str = "all") -> list[str]:
    """Field-level differences, in declaration order: ``["$.job.seed: 0 != 1", ...]``.

    ``which`` is ``"all"``, ``"identity"`` (fields that change the training) or
    ``"operational"`` (fields that may change on resume).
    """
    if type(a) is not type(b):
        raise InvalidArgumentTypeError(
            f"cannot compare a {type(a).__name__} with a {type(b).__name__}"
        )
    operational = operational_paths(type(a))
    found = []
    for (field_path, left), (_, right) in zip(_leaves(a), _leaves(b), strict=True):
        if left == right:
            continue
        is_operational = field_path in operational
        if which == "all" or (which == "operational") == is_operational:
            found.append(f"{field_path}: {left!r} != {right!r}")
    return found


def config_to_builtins(config: Section) -> dict[str, Any]:
    """The config as plain dicts of int, float, str and bool, for a checkpoint."""
    # Through JSON, so tuples come back as lists: plain data any codec round-trips.
    data = msgspec.json.decode(msgspec.json.encode(config))
    assert isinstance(data, dict)
    return data


def identity_fingerprint(config: Section) -> str:
    """sha256 (hex) of the config's identity fields, canonically encoded.

    Operational fields are left out, so a resume that only changes them is the same job.
    The config is normalized first (an int written into a float field counts as that
    float), so equal identities have equal fingerprints however they were built.
    """
    canonical = config_from_builtins(config_to_builtins(config), type(config))
    operational = operational_paths(type(config))
    when_set = _identity_when_set(type(config))
    identity = {
        path: value
        for path, value in _leaves(canonical)
        if path not in operational and when_set.get(path, _UNSET) != value
    }
    encoded = msgspec.json.encode(identity, order="sorted")
    return hashlib.sha256(encoded).hexdigest()


# ---------------------------------------------------------------------------------------
# Writing


def config_to_toml(config: Section) -> str:
    """The whole config as TOML, one ``[section]`` per Struct, every field written.

    Reading this text back gives an equal config.
    """
    return "\n".join(_toml_blocks(config, ""))


def _toml_blocks(section: Section, name: str) -> Iterator[str]:
    lines = [f"[{name}]"] if name else []
    nested: list[tuple[str, Section]] = []
    for field in section.__struct_fields__:
        value = getattr(section, field)
        if isinstance(value, Section):
            nested.append((f"{name}.{field}" if name else field, value))
        else:
            lines.append(f"{field} = {_toml_value(value)}")
    if lines:
        yield "\n".join(lines) + "\n"
    for child_name, child in nested:
        yield from _toml_blocks(child, child_name)


def _toml_value(value: object) -> str:
    # bool before int: bool is an int subclass.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        # repr is the shortest round-tripping form and always has a "." or an exponent
        # ("0.02", "1e-05", "1e+16"), all valid TOML floats, so it reads back as a float.
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise InvalidArgumentTypeError(f"cannot write a {type(value).__name__} as a TOML value")


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f"}
_TOML_ESCAPES["\r"] = "\\r"


def _toml_string(value: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out: list[str] = []
    for char in value:
        escaped = _TOML_ESCAPES.get(char)
        if escaped is not None:
            out.append(escaped)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
