"""Crash points: inert unless armed, armed exactly as the environment says, typos refused.

A firing point SIGKILLs its own process, so every test that lets one fire runs a child
interpreter and checks how it died; in-process tests only arm points they never reach, or
arm a count they never get to.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rollout_recovery._crashpoints import (
    CRASH_AT_ENV,
    CRASH_POINTS,
    armed_crash_point,
    crash_point,
    parse_crash_at,
    reset_crash_points_for_tests,
)
from rollout_recovery.errors import ConfigError, RolloutRecoveryError

# The child prints after each hit and flushes, so its stdout shows exactly which hits it
# survived.
CHILD = """
import sys
from rollout_recovery._crashpoints import crash_point
name, hits = sys.argv[1], int(sys.argv[2])
for hit in range(1, hits + 1):
    crash_point(name)
    print(f"survived {hit}", flush=True)
"""


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(CRASH_AT_ENV, raising=False)
    reset_crash_points_for_tests()
    yield
    reset_crash_points_for_tests()


def _run_child(crash_at: str | None, name: str, hits: int) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop(CRASH_AT_ENV, None)
    if crash_at is not None:
        env[CRASH_AT_ENV] = crash_at
    return subprocess.run(
        [sys.executable, "-c", CHILD, name, str(hits)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_registry_names_the_system_points() -> None:
    assert {
        "checkpoint.before_committed",
        "checkpoint.before_rename",
        "checkpoint.before_latest",
        "finalize.after_put",
        "capture.before_ack",
        "restore.mid",
        "train.before_clear",
        "journal.after_append",
        "journal.after_fsync",
        "journal.before_cut",
        "snapshot.in_hold",
        "checkpoint.captured",
        "snapshot.before_write",
        "replay.mid",
        "adopt.before_handover",
        "vllm.push_loaded",
        "standby.after_handover",
        "standby.before_fork",
        "standby.child_started",
    } == CRASH_POINTS


def test_unarmed_crash_point_is_a_no_op() -> None:
    assert armed_crash_point() is None
    for name in sorted(CRASH_POINTS):
        crash_point(name)  # would kill pytest if it fired


def test_unarmed_child_survives_every_hit() -> None:
    child = _run_child(None, "restore.mid", 3)
    assert child.returncode == 0, child.stderr
    assert child.stdout.splitlines() == ["survived 1", "survived 2", "survived 3"]
    assert child.stderr == ""


def test_armed_point_fires_on_first_hit_by_default() -> None:
    child = _run_child("finalize.after_put", "finalize.after_put", 3)
    assert child.returncode == -signal.SIGKILL
    assert child.stdout == ""
    assert child.stderr == "crash point finalize.after_put fired\n"


def test_count_fires_on_the_nth_hit() -> None:
    child = _run_child("train.before_clear:2", "train.before_clear", 3)
    assert child.returncode == -signal.SIGKILL
    assert child.stdout.splitlines() == ["survived 1"]
    assert child.stderr == "crash point train.before_clear fired\n"


def test_other_points_do_not_fire_or_count() -> None:
    child = _run_child("train.before_clear", "restore.mid", 2)
    assert child.returncode == 0, child.stderr
    assert child.stdout.splitlines() == ["survived 1", "survived 2"]


def test_armed_point_is_reported_and_cached_once_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CRASH_AT_ENV, "restore.mid:1000")
    assert armed_crash_point() == ("restore.mid", 1000)
    crash_point("restore.mid")  # hit 1 of 1000: counted, not fired
    monkeypatch.setenv(CRASH_AT_ENV, "capture.before_ack:7")
    assert armed_crash_point() == ("restore.mid", 1000)
    reset_crash_points_for_tests()
    assert armed_crash_point() == ("capture.before_ack", 7)


def test_unknown_armed_name_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CRASH_AT_ENV, "checkpoint.before_comitted")
    with pytest.raises(ConfigError) as caught:
        crash_point("restore.mid")
    message = str(caught.value)
    assert "'checkpoint.before_comitted'" in message
    assert CRASH_AT_ENV in message
    assert all(name in message for name in CRASH_POINTS)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, RolloutRecoveryError)
    # Not cached as "unarmed": the error comes back on every use.
    with pytest.raises(ConfigError):
        armed_crash_point()


def test_unknown_armed_name_stops_a_child_without_crashing_it() -> None:
    child = _run_child("nope", "restore.mid", 1)
    assert child.returncode == 1
    assert "unknown crash point 'nope'" in child.stderr
    assert child.stdout == ""


@pytest.mark.parametrize("value", ["restore.mid:0", "restore.mid:-1", "restore.mid:x", "a:b:c"])
def test_bad_values_are_refused(value: str) -> None:
    with pytest.raises(ConfigError):
        parse_crash_at(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", None),
        ("  ", None),
        ("restore.mid", ("restore.mid", 1)),
        (" restore.mid : 3 ", ("restore.mid", 3)),
    ],
)
def test_good_values_parse(value: str, expected: tuple[str, int] | None) -> None:
    assert parse_crash_at(value) == expected


def test_unregistered_call_site_name_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'checkpoint\.typo'"):
        crash_point("checkpoint.typo")
