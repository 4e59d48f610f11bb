"""A refused choice lists the valid ones (issue 27 item 6): every ``Literal`` or enum field
of the run config, given a value it does not take, is refused naming the field and
every value it does take."""

from __future__ import annotations

from enum import Enum
from typing import Any

import msgspec.inspect as mi
import pytest
from run_fixtures import run_config_fields

from rollout_recovery.control import BACKENDS
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.errors import ConfigError


def _choice_fields() -> list[tuple[str, str, list[Any], bool]]:
    """``(section, field, values, in_a_list)`` of every choice field, one level deep."""
    found = []
    for section, field, leaf in run_config_fields():
        in_list = isinstance(leaf, mi.VarTupleType | mi.ListType)
        if in_list:
            leaf = leaf.item_type
        if isinstance(leaf, mi.LiteralType):
            found.append((section, field, list(leaf.values), in_list))
        elif isinstance(leaf, mi.EnumType) and issubclass(leaf.cls, Enum):
            found.append((section, field, [m.value for m in leaf.cls], in_list))
    return found


CHOICES = _choice_fields()


def test_the_walk_finds_the_choice_fields() -> None:
    names = {(section, field) for section, field, _, _ in CHOICES}
    assert {("checkpoint", "format"), ("task", "kind"), ("metrics", "sinks")} <= names
    assert ("recovery", "reuse") in names  # an enum, not a Literal


@pytest.mark.parametrize(
    ("section", "field", "values", "in_list"),
    CHOICES,
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_refused_choice_names_every_valid_value(
    section: str, field: str, values: list[Any], in_list: bool
) -> None:
    bad = "not-a-choice"
    with pytest.raises(ConfigError) as refused:
        config_from_builtins({section: {field: [bad] if in_list else bad}})
    message = str(refused.value)
    assert refused.value.path == f"$.{section}.{field}" + ("[0]" if in_list else "")
    assert f"Invalid enum value {bad!r}; expected one of " in message
    listed = message.rsplit("expected one of ", 1)[1]
    assert sorted(listed.split(", ")) == sorted(map(repr, values))


def test_a_refused_backend_names_every_registered_one() -> None:
    # [generation] backend is a name in the registry, not a Literal: refused the same way.
    with pytest.raises(ConfigError) as refused:
        config_from_builtins({"generation": {"backend": "not-a-backend"}})
    assert refused.value.path == "$.generation.backend"
    assert all(repr(name) in str(refused.value) for name in BACKENDS)
