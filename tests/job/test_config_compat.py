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
from rollout_recovery.control._config import config_from_builtins

FIXTURES = Path(__file__).parents[1] / "fixtures" / "config"
EXPECTED: dict[str, str] = json.loads((FIXTURES / "EXPECTED.json").read_text())[
    "identity_fingerprints"
]
#: What the format gained since: the one knob that could not be set before, the trainer's
#: logprob tolerance, issue 27's dataset task, reward function and sample completions, and
#: issue 28's background checkpoints, lease of launched vLLM servers and warm standby (at
#: their defaults, which leave the identity as it was: IDENTITY_WHEN_SET, or operational).
ADDED = (
    "no_actor_wait_s = 60.0\n",
    'path = ""\nprompt_field = "prompt"\nmessages_field = ""\nsplit = "train"\ndigest = ""\n'
    '\n[reward]\nfunction = ""\ntimeout_s = 30.0\n',
    "samples = 2\n",
    "logprob_tolerance = 0.2\n",
    "background = true\n",
    "adopt_within_s = 180.0\n",
    "standby_within_s = 0.0\n",
)


@pytest.mark.parametrize("backend", sorted(EXPECTED))
def test_a_printed_config_of_main_loads_as_the_same_job(backend: str) -> None:
    path = FIXTURES / f"{backend}.toml"
    config = load_config(path)
    assert config.generation.backend == backend
    assert identity_fingerprint(config) == EXPECTED[backend]
    # Written back, it is main's text but for the added field.
    printed = config_to_toml(config)
    for added in ADDED:
        assert added in printed
        printed = printed.replace(added, "")
    assert printed == path.read_text()


def test_a_field_added_later_counts_in_the_identity_once_it_is_set() -> None:
    # IDENTITY_WHEN_SET: at its default the field is left out (the fingerprints above);
    # any other value is the identity like any field.
    fingerprints = {
        identity_fingerprint(config_from_builtins(data))
        for data in ({}, {"task": {"prompt_field": "question"}}, {"task": {"prompt_field": "q"}})
    }
    assert len(fingerprints) == 3
