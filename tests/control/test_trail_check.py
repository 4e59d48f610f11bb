"""check_trail on hand-made trails: one good run, and one broken trail per invariant.

Each broken trail starts from the good one and changes one thing; the check must name the
ids involved and the ``file:line`` where the trail shows it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.control._trail_check import TrailReport, check_trail

N = 2  # generations per prompt


def taken(group: str, prompt: int) -> dict[str, Any]:
    return {"event": "prompt_taken", "group_id": group, "prompt_idx": prompt, "batch": 0}


def sealed(group: str, index: int, rollout: str, tokens: int = 10) -> dict[str, Any]:
    return {
        "event": "sibling_sealed",
        "group_id": group,
        "generation_index": index,
        "rollout_id": rollout,
        "tokens": tokens,
    }


def abandoned(group: str, index: int | None, rollout: str | None, **more: Any) -> dict[str, Any]:
    return {
        "event": "attempt_abandoned",
        "group_id": group,
        "generation_index": index,
        "rollout_id": rollout,
        "reason": "timeout",
        **more,
    }


def dropped(group: str, prompt: int, reason: str | None = "retries exhausted") -> dict[str, Any]:
    return {
        "event": "prompt_dropped",
        "group_id": group,
        "prompt_idx": prompt,
        "target_step": 1,
        "reason": reason,
    }


def trained(group: str, index: int, rollout: str, *, step: int, prompt: int) -> dict[str, Any]:
    return {
        "step": step,
        "group_id": group,
        "generation_index": index,
        "prompt_idx": prompt,
        "rollout_id": rollout,
        "valid": True,
        "reward": 0.5,
        "weight_version": step,
    }


def good_events() -> list[dict[str, Any]]:
    return [
        taken("g0", 0),
        taken("g1", 1),
        taken("g2", 2),
        sealed("g0", 0, "r0a"),
        sealed("g0", 1, "r0b"),
        {"event": "group_published", "group_id": "g0", "target_step": 0},
        {"event": "checkpoint_committed", "step": 1},
        sealed("g1", 0, "r1a"),
        abandoned("g1", 1, "r1x"),  # never sealed, regenerated
        sealed("g1", 1, "r1b"),
        sealed("g2", 0, "r2a"),
        dropped("g2", 2),  # its seal is excused by the drop
    ]


def good_rows() -> list[dict[str, Any]]:
    return [
        trained("g0", 0, "r0a", step=0, prompt=0),
        trained("g0", 1, "r0b", step=0, prompt=0),
        trained("g1", 1, "r1b", step=1, prompt=1),
        trained("g1", 0, "r1a", step=1, prompt=1),
    ]


def write_trail(run_dir: Path, events: list[dict[str, Any]], rows: list[dict[str, Any]]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run_dir / "trained_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def check(
    tmp_path: Path,
    events: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    *,
    complete: bool = True,
) -> TrailReport:
    return check_trail(write_trail(tmp_path / "run", events, rows), group_size=N, complete=complete)


def only_violation(report: TrailReport) -> str:
    assert not report.ok
    assert len(report.violations) == 1, report.violations
    return report.violations[0]


def violation_with(report: TrailReport, *needles: str) -> str:
    """The one violation that mentions every needle."""
    assert not report.ok
    matching = [v for v in report.violations if all(n in v for n in needles)]
    assert matching, (needles, report.violations)
    return matching[0]


# -- the good run ---------------------------------------------------------------------------


def test_a_good_run_passes_with_its_counts(tmp_path: Path) -> None:
    report = check(tmp_path, good_events(), good_rows())
    assert report.ok, report.violations
    assert report.counts == {
        "groups_trained": 2,
        "rows_trained": 4,
        "prompts_taken": 3,
        "prompts_dropped": 1,
        "seals": 5,
        "seals_trained": 4,
        "seals_abandoned": 1,
    }


def test_blank_lines_are_ignored_and_do_not_shift_line_numbers(tmp_path: Path) -> None:
    run = write_trail(tmp_path / "run", good_events(), good_rows())
    with open(run / "trained_rows.jsonl", "a") as handle:
        handle.write("\n")
        handle.write(json.dumps(trained("g0", 0, "r0a", step=0, prompt=0)) + "\n")
    violation = violation_with(check_trail(run, group_size=N), "trained twice")
    assert "trained_rows.jsonl:1" in violation
    assert "trained_rows.jsonl:6" in violation


def test_an_empty_trail_passes(tmp_path: Path) -> None:
    report = check(tmp_path, [], [])
    assert report.ok
    assert report.counts["groups_trained"] == 0


# -- one broken trail per invariant -----------------------------------------------------------


def test_a_group_trained_in_two_steps(tmp_path: Path) -> None:
    rows = good_rows()
    rows[1]["step"] = 1  # g0 index 1 trained a step later
    violation = only_violation(check(tmp_path, good_events(), rows))
    assert "group g0" in violation
    assert "steps [0, 1]" in violation
    assert "trained_rows.jsonl:[1, 2]" in violation


def test_a_group_with_too_few_rows(tmp_path: Path) -> None:
    rows = good_rows()
    del rows[3]  # g1 lost index 0
    events = good_events()
    report = check(tmp_path, events, rows)
    violation = violation_with(report, "group g1", "generation indices [1]")
    assert "expected 0..1" in violation
    assert "trained_rows.jsonl:[3]" in violation


def test_a_group_with_too_many_rows(tmp_path: Path) -> None:
    rows = [*good_rows(), trained("g0", 2, "r0c", step=0, prompt=0)]
    violation = only_violation(check(tmp_path, good_events(), rows))
    assert "group g0" in violation
    assert "generation indices [0, 1, 2]" in violation
    assert "trained_rows.jsonl:[1, 2, 5]" in violation


def test_a_duplicate_generation_index(tmp_path: Path) -> None:
    rows = good_rows()
    rows[1] = trained("g0", 0, "r0b", step=0, prompt=0)  # two rows for index 0, none for 1
    report = check(tmp_path, good_events(), rows)
    violation = violation_with(report, "group g0", "generation indices [0, 0]")
    assert "trained_rows.jsonl:[1, 2]" in violation
    twice = violation_with(report, "('g0', 0)", "trained twice")
    assert "trained_rows.jsonl:1" in twice
    assert "trained_rows.jsonl:2" in twice


def test_a_sibling_trained_twice(tmp_path: Path) -> None:
    rows = [*good_rows(), trained("g1", 0, "r1a", step=2, prompt=1)]
    report = check(tmp_path, good_events(), rows)
    violation_with(
        report, "sibling ('g1', 0) trained twice (trained_rows.jsonl:4, trained_rows.jsonl:5)"
    )


def test_a_prompt_taken_but_neither_trained_nor_dropped(tmp_path: Path) -> None:
    events = [*good_events(), taken("g3", 3)]
    violation = only_violation(check(tmp_path, events, good_rows()))
    assert "prompt 3" in violation
    assert "group g3" in violation
    assert "events.jsonl:13" in violation
    assert "neither trained nor dropped" in violation


def test_a_prompt_still_in_flight_is_accepted_when_the_run_is_incomplete(tmp_path: Path) -> None:
    events = [*good_events(), taken("g3", 3), sealed("g3", 0, "r3a")]
    report = check(tmp_path, events, good_rows(), complete=False)
    assert report.ok, report.violations
    # The same trail is a violation for a finished run: the prompt and its unused seal.
    finished = check(tmp_path, events, good_rows(), complete=True)
    violation_with(finished, "group g3", "neither trained nor dropped")
    violation_with(finished, "sibling (g3, 0) sealed as r3a", "events.jsonl:14", "never trained")


@pytest.mark.parametrize("reason", [None, ""])
def test_a_drop_without_a_reason(tmp_path: Path, reason: str | None) -> None:
    events = good_events()
    events[11] = dropped("g2", 2, reason=reason)
    violation = only_violation(check(tmp_path, events, good_rows()))
    assert "group g2" in violation
    assert "without a reason" in violation
    assert "events.jsonl:12" in violation


def test_a_drop_with_no_reason_field_at_all(tmp_path: Path) -> None:
    events = good_events()
    del events[11]["reason"]
    violation = only_violation(check(tmp_path, events, good_rows()))
    assert "group g2" in violation
    assert "events.jsonl:12" in violation


def test_a_sealed_sibling_trained_as_another_rollout_without_an_abandon(tmp_path: Path) -> None:
    rows = good_rows()
    rows[3] = trained("g1", 0, "r1z", step=1, prompt=1)  # regenerated, though sealed as r1a
    violation = only_violation(check(tmp_path, good_events(), rows))
    assert "sibling (g1, 0) sealed as r1a (events.jsonl:8)" in violation
    assert "trained as r1z (trained_rows.jsonl:4)" in violation
    assert "no abandon or drop event" in violation


def test_the_same_is_accepted_with_an_abandon_after_the_seal(tmp_path: Path) -> None:
    rows = good_rows()
    rows[3] = trained("g1", 0, "r1z", step=1, prompt=1)
    events = [*good_events(), abandoned("g1", 0, "r1a", reason="restart")]
    report = check(tmp_path, events, rows)
    assert report.ok, report.violations
    assert report.counts["seals_abandoned"] == 2
    assert report.counts["seals_trained"] == 3


def test_a_group_wide_abandon_after_the_seal_is_accepted(tmp_path: Path) -> None:
    rows = good_rows()
    rows[3] = trained("g1", 0, "r1z", step=1, prompt=1)
    events = [*good_events(), abandoned("g1", None, None, rollout_ids=["r1a", "r1b"])]
    assert check(tmp_path, events, rows).ok


def test_an_abandon_before_the_seal_does_not_excuse_it(tmp_path: Path) -> None:
    rows = good_rows()
    rows[3] = trained("g1", 0, "r1z", step=1, prompt=1)
    events = good_events()
    events.insert(7, abandoned("g1", 0, "r1a"))  # before the seal of r1a (now line 9)
    violation = only_violation(check(tmp_path, events, rows))
    assert "sibling (g1, 0) sealed as r1a (events.jsonl:9)" in violation


def test_an_abandon_of_another_rollout_does_not_excuse_it(tmp_path: Path) -> None:
    rows = good_rows()
    rows[3] = trained("g1", 0, "r1z", step=1, prompt=1)
    events = [*good_events(), abandoned("g1", 0, "r1q")]
    only_violation(check(tmp_path, events, rows))


def test_a_group_both_trained_and_dropped(tmp_path: Path) -> None:
    events = [*good_events(), dropped("g0", 0)]
    violation = only_violation(check(tmp_path, events, good_rows()))
    assert "group g0 both trained and dropped" in violation
    assert "events.jsonl:13" in violation


# -- the remaining checks ---------------------------------------------------------------------


def test_a_group_trained_but_never_taken(tmp_path: Path) -> None:
    events = [e for e in good_events() if e != taken("g1", 1)]
    report = check(tmp_path, events, good_rows())
    violation_with(report, "group g1 trained but never taken")
    violation_with(report, "prompt 1 trained 1 times but taken 0")


def test_a_group_taken_twice(tmp_path: Path) -> None:
    events = [*good_events(), taken("g0", 0)]
    violation = violation_with(check(tmp_path, events, good_rows()), "group g0 taken twice")
    assert "events.jsonl:13" in violation
