"""A config written by an earlier release still loads, as the same job (issue 25, item 2).

``tests/fixtures/config`` holds what ``rollout-recovery run --print-config`` of main wrote
before issue 25 moved every component onto its own config section, one file per backend,
and the identity fingerprint main computed for each (the fingerprint every checkpoint of a
run directory carries: a changed one would refuse to resume every existing run).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout_recovery._settings import config_to_toml, identity_fingerprint
from rollout_recovery.control import load_config

FIXTURES = Path(__file__).parents[1] / "fixtures" / "config"
EXPECTED: dict[str, str] = json.loads((FIXTURES / "EXPECTED.json").read_text())[
    "identity_fingerprints"
]
#: What the format gained since: the one knob that could not be set before.
ADDED = "no_actor_wait_s = 60.0\n"


@pytest.mark.parametrize("backend", sorted(EXPECTED))
def test_a_printed_config_of_main_loads_as_the_same_job(backend: str) -> None:
    path = FIXTURES / f"{backend}.toml"
    config = load_config(path)
    assert config.generation.backend == backend
    assert identity_fingerprint(config) == EXPECTED[backend]
    # Written back, it is main's text but for the added field.
    printed = config_to_toml(config)
    assert ADDED in printed
    assert printed.replace(ADDED, "") == path.read_text()
