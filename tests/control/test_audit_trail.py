"""AuditTrail: strict JSON lines, growing offsets, a truncation that summarizes the cut.

The crash test SIGKILLs a child interpreter that appends in a loop; it synchronizes on a
line the child prints after N appends, never on time.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_recovery.control._audit import (
    AUDIT_FILES,
    EVENTS,
    METRICS,
    TRAINED_ROWS,
    AuditTrail,
    CutOff,
    strict_json_line,
)
from rollout_recovery.errors import CheckpointDirectoryError


def strict_loads(line: bytes) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"non-standard JSON constant {token}")

    return json.loads(line, parse_constant=refuse)


def read_lines(path: Path) -> list[Any]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return [strict_loads(line) for line in data.splitlines()]


def contents(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in AUDIT_FILES}


@pytest.fixture
def trail(tmp_path: Path) -> Any:
    audit = AuditTrail(tmp_path)
    yield audit
    audit.close()


# -- lines ------------------------------------------------------------------------------------


def test_the_files_are_created_empty(tmp_path: Path, trail: AuditTrail) -> None:
    assert sorted(os.listdir(tmp_path)) == sorted(AUDIT_FILES)
    assert trail.offsets() == dict.fromkeys(AUDIT_FILES, 0)


def test_non_finite_floats_become_null_at_any_depth(tmp_path: Path, trail: AuditTrail) -> None:
    trail.event(
        "step",
        loss=math.nan,
        nested={"a": math.inf, "b": [1.5, -math.inf, (math.nan, 2)]},
    )
    trail.trained_row(reward=math.nan, group_id="g")
    trail.metrics({"mean_reward": -math.inf, "step": 3})
    assert read_lines(tmp_path / EVENTS) == [
        {"event": "step", "loss": None, "nested": {"a": None, "b": [1.5, None, [None, 2]]}}
    ]
    assert read_lines(tmp_path / TRAINED_ROWS) == [{"reward": None, "group_id": "g"}]
    assert read_lines(tmp_path / METRICS) == [{"mean_reward": None, "step": 3}]
    for name in AUDIT_FILES:
        assert b"NaN" not in (tmp_path / name).read_bytes()
        assert b"Infinity" not in (tmp_path / name).read_bytes()


JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


def finite_model(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_model(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite_model(item) for item in value]
    return value


@settings(max_examples=200, deadline=None)
@given(record=st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=5))
def test_strict_json_line_is_one_strict_line(record: dict[str, Any]) -> None:
    line = strict_json_line(record)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert strict_loads(line) == finite_model(record)


def test_offsets_grow_by_exactly_each_appended_line(trail: AuditTrail) -> None:
    before = trail.offsets()
    trail.event("prompt_taken", group_id="g0", prompt_idx=0)
    after_event = trail.offsets()
    assert after_event[EVENTS] - before[EVENTS] == len(
        strict_json_line({"event": "prompt_taken", "group_id": "g0", "prompt_idx": 0})
    )
    assert after_event[TRAINED_ROWS] == before[TRAINED_ROWS]
    assert after_event[METRICS] == before[METRICS]
    trail.trained_row(group_id="g0", generation_index=1)
    after_row = trail.offsets()
    assert after_row[TRAINED_ROWS] == len(
        strict_json_line({"group_id": "g0", "generation_index": 1})
    )
    assert after_row[EVENTS] == after_event[EVENTS]
    trail.metrics({"step": 0})
    assert trail.offsets()[METRICS] == len(b'{"step":0}\n')


def test_a_reopened_trail_appends_after_the_existing_lines(tmp_path: Path) -> None:
    first = AuditTrail(tmp_path)
    first.event("a")
    offsets = first.offsets()
    first.close()
    second = AuditTrail(tmp_path)
    try:
        assert second.offsets() == offsets
        second.event("b")
        assert [line["event"] for line in read_lines(tmp_path / EVENTS)] == ["a", "b"]
    finally:
        second.close()


# -- truncate_to ------------------------------------------------------------------------------


def fill_prefix(trail: AuditTrail) -> None:
    trail.event("prompt_taken", group_id="g0", prompt_idx=0)
    trail.event("sibling_sealed", group_id="g0", generation_index=0, rollout_id="r0", tokens=11)
    trail.trained_row(group_id="g0", generation_index=0, rollout_id="r0", step=0)
    trail.metrics({"step": 0})


def fill_tail(trail: AuditTrail) -> None:
    trail.event("prompt_taken", group_id="g1", prompt_idx=1)
    trail.event("sibling_sealed", group_id="g1", generation_index=0, rollout_id="r1", tokens=5)
    trail.event("sibling_sealed", group_id="g1", generation_index=1, rollout_id="r2", tokens=7)
    trail.event("sibling_sealed", group_id="g1", generation_index=2, rollout_id="r3", tokens=None)
    trail.event("attempt_abandoned", group_id="g1", rollout_id="r9", tokens=100)
    for index in range(4):
        trail.trained_row(group_id="g1", generation_index=index, step=1)
    trail.metrics({"step": 1})
    trail.metrics({"step": 2})


def test_truncate_to_cuts_back_and_summarizes_what_went(tmp_path: Path, trail: AuditTrail) -> None:
    fill_prefix(trail)
    offsets = trail.offsets()
    kept = contents(tmp_path)
    fill_tail(trail)
    cut_off = trail.truncate_to(offsets)
    assert cut_off == CutOff(events=5, trained_rows=4, seals_lost=3, tokens_lost=12)
    assert contents(tmp_path) == kept
    assert trail.offsets() == offsets
    # Appends continue right after the cut.
    trail.event("restored")
    assert [line["event"] for line in read_lines(tmp_path / EVENTS)] == [
        "prompt_taken",
        "sibling_sealed",
        "restored",
    ]


def test_truncate_to_the_current_lengths_cuts_nothing(tmp_path: Path, trail: AuditTrail) -> None:
    fill_prefix(trail)
    kept = contents(tmp_path)
    assert trail.truncate_to(trail.offsets()) == CutOff(0, 0, 0, 0)
    assert contents(tmp_path) == kept


def test_truncate_to_zero_empties_every_file(tmp_path: Path, trail: AuditTrail) -> None:
    fill_prefix(trail)
    cut_off = trail.truncate_to(dict.fromkeys(AUDIT_FILES, 0))
    assert cut_off == CutOff(events=2, trained_rows=1, seals_lost=1, tokens_lost=11)
    assert contents(tmp_path) == dict.fromkeys(AUDIT_FILES, b"")


@pytest.mark.parametrize("name", AUDIT_FILES)
def test_an_offset_beyond_the_file_is_refused(tmp_path: Path, trail: AuditTrail, name: str) -> None:
    fill_prefix(trail)
    offsets = trail.offsets()
    offsets[name] += 1
    with pytest.raises(CheckpointDirectoryError, match=name) as caught:
        trail.truncate_to(offsets)
    assert caught.value.directory == str(tmp_path)


def test_a_refused_truncation_changes_no_file(tmp_path: Path, trail: AuditTrail) -> None:
    """BUG: ``truncate_to`` truncates file by file and checks each offset only when it
    reaches it (src/rollout_recovery/control/_audit.py, the loop in ``truncate_to``). An
    offset beyond the end of ``metrics.jsonl`` is refused only after
    ``trained_rows.jsonl`` and ``events.jsonl`` have already been cut back and fsynced, so
    the refusal destroys trail lines and their CutOff summary is lost."""
    fill_prefix(trail)
    target = dict.fromkeys(AUDIT_FILES, 0)
    target[METRICS] = trail.offsets()[METRICS] + 1
    before = contents(tmp_path)
    with pytest.raises(CheckpointDirectoryError, match=METRICS):
        trail.truncate_to(target)
    assert contents(tmp_path) == before


@pytest.mark.parametrize(
    "offsets",
    [
        {TRAINED_ROWS: 0, EVENTS: 0},
        {TRAINED_ROWS: 0, EVENTS: 0, METRICS: 0, "other.jsonl": 0},
        {TRAINED_ROWS: 0, EVENTS: 0, "metrics.json": 0},
        {},
    ],
)
def test_a_wrong_key_set_is_refused_and_changes_nothing(
    tmp_path: Path, trail: AuditTrail, offsets: dict[str, int]
) -> None:
    fill_prefix(trail)
    before = contents(tmp_path)
    with pytest.raises(CheckpointDirectoryError, match="audit offsets name"):
        trail.truncate_to(offsets)
    assert contents(tmp_path) == before


# -- sealed_tokens ----------------------------------------------------------------------------


def test_sealed_tokens_sums_the_seals_of_the_given_rollouts(trail: AuditTrail) -> None:
    fill_prefix(trail)
    fill_tail(trail)
    assert trail.sealed_tokens({"r0", "r1", "r2", "r3"}) == 23
    assert trail.sealed_tokens({"r1"}) == 5
    assert trail.sealed_tokens({"r3"}) == 0  # tokens null counts as none
    assert trail.sealed_tokens({"r9"}) == 0  # not a seal
    assert trail.sealed_tokens(set()) == 0
    assert trail.sealed_tokens({"unknown"}) == 0


def test_sealed_tokens_no_longer_sees_seals_that_were_cut_off(trail: AuditTrail) -> None:
    fill_prefix(trail)
    offsets = trail.offsets()
    fill_tail(trail)
    trail.truncate_to(offsets)
    assert trail.sealed_tokens({"r0", "r1", "r2"}) == 11


# -- SIGKILL ----------------------------------------------------------------------------------

CHILD = """
import sys
from pathlib import Path
from rollout_recovery.control._audit import AuditTrail
directory, ready_after = Path(sys.argv[1]), int(sys.argv[2])
trail = AuditTrail(directory)
i = 0
while True:
    pad = "x" * (i * 37 % 900)
    trail.event("tick", i=i, pad=pad, loss=float("nan"))
    trail.trained_row(group_id=f"g{i}", generation_index=i % 4, pad=pad)
    trail.metrics({"step": i, "pad": pad})
    i += 1
    if i == ready_after:
        print("ready", flush=True)
"""


@pytest.mark.parametrize("ready_after", [1, 200, 2000])
def test_a_sigkill_mid_append_leaves_only_whole_lines(tmp_path: Path, ready_after: int) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), str(ready_after)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    counts = {}
    for name in AUDIT_FILES:
        lines = read_lines(tmp_path / name)  # whole lines only, every one strict JSON
        counts[name] = len(lines)
        assert len(lines) >= ready_after
    events = read_lines(tmp_path / EVENTS)
    assert [line["i"] for line in events] == list(range(len(events)))
    assert all(line["loss"] is None for line in events)
    # Appends go events, trained row, metrics: the kill stops them in that order.
    assert counts[EVENTS] >= counts[TRAINED_ROWS] >= counts[METRICS] >= counts[EVENTS] - 1
    # A resume reopens the files and carries on after the last whole line.
    trail = AuditTrail(tmp_path)
    try:
        trail.event("restored")
        assert read_lines(tmp_path / EVENTS)[-1] == {"event": "restored"}
    finally:
        trail.close()
