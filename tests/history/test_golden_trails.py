"""Golden trails: a real run's journal the checker passes, and one hand-broken copy per
invariant it must reject (``tests/fixtures/history/make_golden.py`` made them).

They pin the history format as users' run directories hold it: a change to a record that
makes an old trail unreadable, or an invariant the checker stops enforcing, fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout_recovery.history._trail_check import check_trail
from rollout_recovery.history._trail_reader import read_records
from rollout_recovery.history.records import Restored, StepTrained

FIXTURES = Path(__file__).parents[1] / "fixtures" / "history"
GOOD = FIXTURES / "good" / "events.jsonl"
#: The controller's golden journal (``tests/control/test_golden_replay.py``): faults,
#: cohorts, two kills whose restores cross each other's window, ``reuse = "none"``, a drain.
TRANSITIONS = FIXTURES.parent / "transitions" / "events.jsonl"
EXPECTED: dict[str, str] = json.loads((FIXTURES / "broken" / "EXPECTED.json").read_text())


def test_the_good_trail_passes_complete() -> None:
    report = check_trail(GOOD)
    assert report.ok, report.violations
    assert report.complete
    assert report.counts["rows_trained"] == 4 * 2 * 2


def test_the_good_trail_holds_a_restore_that_rolled_training_back() -> None:
    records = [record for _, record in read_records(GOOD)]
    (restore,) = [r for r in records if isinstance(r, Restored)]
    assert restore.rolled_back_steps, "the golden trail must exercise a rollback"
    steps = [r.step for r in records if isinstance(r, StepTrained)]
    assert len(steps) > len(set(steps)), "a rolled-back step is trained again"


def test_the_controllers_golden_journal_passes_the_auditors_own_model() -> None:
    """The auditor re-derives the run from the records without the controller's
    transitions: on a journal the controller wrote, the two must agree."""
    report = check_trail(TRANSITIONS)
    assert report.ok, report.violations
    assert not report.complete  # drained after its third step of five
    assert report.counts["restores"] == 2
    assert report.counts["restored_seals_discarded"] > 0


def test_every_invariant_has_a_broken_trail() -> None:
    on_disk = {p.name for p in (FIXTURES / "broken").glob("*.jsonl")}
    assert on_disk == set(EXPECTED)
    assert len(EXPECTED) >= 10


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_broken_trail_is_rejected_naming_what_broke(name: str) -> None:
    report = check_trail(FIXTURES / "broken" / name)
    matching = [v for v in report.violations if EXPECTED[name] in v]
    assert matching, report.violations
    assert any(name in v for v in matching), f"the violation must cite {name}: {matching}"
