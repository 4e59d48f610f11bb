"""check_trail on hand-made histories: one good run, and one broken history per invariant.

Each broken history starts from the good one and changes one thing; the check must name
the ids involved and the ``events.jsonl:line`` where the history shows it.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import msgspec
from trail_builders import (
    N,
    abandoned,
    dropped,
    good_history,
    row,
    sealed,
    started,
    step,
    taken,
    write_trail,
)

from rollout_recovery.history._trail_check import TrailReport, check_trail
from rollout_recovery.history.records import HistoryRecord, StepTrained


def check(tmp_path: Path, records: list[HistoryRecord], *, complete: bool = True) -> TrailReport:
    return check_trail(write_trail(tmp_path / "run", records), complete=complete)


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


def line_of(records: list[HistoryRecord], record: HistoryRecord) -> int:
    return records.index(record) + 1


def replace_step(records: list[HistoryRecord], number: int, new: StepTrained) -> None:
    for position, record in enumerate(records):
        if isinstance(record, StepTrained) and record.step == number:
            records[position] = new
            return
    raise AssertionError(f"no step {number}")


# -- the good run ---------------------------------------------------------------------------


def test_a_good_run_passes_with_its_counts(tmp_path: Path) -> None:
    report = check(tmp_path, good_history())
    assert report.ok, report.violations
    assert report.group_size == N
    assert report.counts == {
        "steps_trained": 2,
        "groups_trained": 3,
        "rows_trained": 6,
        "valid_rows_trained": 6,
        "prompts_taken": 4,
        "prompts_dropped": 1,
        "seals": 7,
        "seals_trained": 6,
        "seals_abandoned": 1,
        "attempts_resumed": 0,
        "calls_resumed": 0,
    }


def test_blank_lines_are_ignored_and_do_not_shift_line_numbers(tmp_path: Path) -> None:
    records = good_history()
    path = write_trail(tmp_path / "run", records)
    with open(path, "ab") as handle:
        handle.write(b"\n")
    trail = write_trail(tmp_path / "run", [taken("g0", 0, position=9)])
    violation = violation_with(check_trail(trail), "g0 taken twice")
    assert f"events.jsonl:{len(records) + 2}" in violation


def test_a_history_without_a_run_started_record_is_not_a_run(tmp_path: Path) -> None:
    violation = only_violation(check(tmp_path, good_history()[1:]))
    assert "no run_started record" in violation


def framed(value: dict[str, object]) -> bytes:
    """A journal line with a valid checksum around any JSON object."""
    body = msgspec.json.encode(value)
    return b'{"crc":"%08x",%s\n' % (zlib.crc32(body), body[1:])


def test_a_line_that_is_not_a_record_is_the_one_violation(tmp_path: Path) -> None:
    path = write_trail(tmp_path / "run", good_history())
    with open(path, "ab") as handle:
        handle.write(framed({"event": "sibling_sealed", "group_id": "g9"}))
    write_trail(tmp_path / "run", [taken("g9", 4)])
    violation = only_violation(check_trail(path))
    assert f"events.jsonl:{len(good_history()) + 1}" in violation
    assert "not a history record" in violation


def test_an_unknown_record_type_is_refused(tmp_path: Path) -> None:
    path = write_trail(tmp_path / "run", good_history())
    with open(path, "ab") as handle:
        handle.write(framed({"event": "teleported", "group_id": "g0"}))
    write_trail(tmp_path / "run", [taken("g9", 4)])
    assert "not a history record" in only_violation(check_trail(path))


def test_an_altered_line_is_refused_with_its_line(tmp_path: Path) -> None:
    path = write_trail(tmp_path / "run", good_history())
    data = path.read_bytes().replace(b'"prompt_idx":1,', b'"prompt_idx":7,', 1)
    path.write_bytes(data)
    violation = only_violation(check_trail(path))
    assert "events.jsonl:3" in violation and "checksum" in violation


# -- one broken history per invariant ---------------------------------------------------------


def test_the_dataloader_positions_must_be_contiguous(tmp_path: Path) -> None:
    records = good_history()
    records[records.index(taken("g3", 3))] = taken("g3", 3, position=5)
    violation = violation_with(check(tmp_path, records), "positions are not contiguous")
    assert "missing [3, 4]" in violation


def test_a_group_trained_in_two_steps(tmp_path: Path) -> None:
    records = good_history()
    replace_step(
        records,
        1,
        step(
            1,
            [
                row("g3", 0, "r3a", prompt=3),
                row("g3", 1, "r3b", prompt=3),
                row("g0", 0, "r0a", prompt=0),
            ],
            groups=["g3"],
        ),
    )
    report = check(tmp_path, records)
    violation_with(report, "group g0 trained in steps [0, 1]")
    violation_with(report, "sibling ('g0', 0) trained twice")


def test_a_group_with_too_few_rows(tmp_path: Path) -> None:
    records = good_history()
    replace_step(records, 1, step(1, [row("g3", 0, "r3a", prompt=3)]))
    report = check(tmp_path, records)
    violation = violation_with(report, "group g3", "generation indices [0]")
    assert f"expected 0..{N - 1}" in violation


def test_a_group_with_too_many_rows(tmp_path: Path) -> None:
    records = good_history()
    replace_step(
        records,
        1,
        step(
            1,
            [
                row("g3", 0, "r3a", prompt=3),
                row("g3", 1, "r3b", prompt=3),
                row("g3", 2, "r3c", prompt=3),
            ],
        ),
    )
    violation_with(check(tmp_path, records), "group g3", "generation indices [0, 1, 2]")


def test_a_step_with_fewer_groups_than_it_expected(tmp_path: Path) -> None:
    records = good_history()
    records.remove(dropped("g2", 2))  # step 1 still expects g2: it trained one group short
    report = check(tmp_path, records)
    violation_with(report, "step 1 trained 1 groups, expected 2")


def test_steps_out_of_order(tmp_path: Path) -> None:
    records = good_history()
    replace_step(
        records, 1, step(2, [row("g3", 0, "r3a", prompt=3), row("g3", 1, "r3b", prompt=3)])
    )
    violation_with(check(tmp_path, records), "step 2 trained where step 1 was due")


def test_a_prompt_taken_but_neither_trained_nor_dropped(tmp_path: Path) -> None:
    records = [*good_history(), taken("g4", 4)]
    violation = only_violation(check(tmp_path, records))
    assert "prompt 4 (group g4" in violation
    assert f"events.jsonl:{len(records)}" in violation
    assert "neither trained nor dropped" in violation


def test_a_prompt_still_in_flight_is_accepted_when_the_run_is_incomplete(tmp_path: Path) -> None:
    records = [*good_history(), taken("g4", 4), sealed("g4", 0, "r4a")]
    assert check(tmp_path, records, complete=False).ok
    finished = check(tmp_path, records, complete=True)
    violation_with(finished, "group g4", "neither trained nor dropped")
    violation_with(finished, "sibling (g4, 0) sealed as r4a", "never trained")


def test_a_sealed_sibling_trained_as_another_rollout_without_an_abandon(tmp_path: Path) -> None:
    records = good_history()
    replace_step(
        records, 1, step(1, [row("g3", 0, "r3z", prompt=3), row("g3", 1, "r3b", prompt=3)])
    )
    violation = only_violation(check(tmp_path, records))
    seal_line = line_of(records, sealed("g3", 0, "r3a"))
    assert f"sibling (g3, 0) sealed as r3a (events.jsonl:{seal_line})" in violation
    assert "trained as r3z" in violation
    assert "no abandon, drop or discard" in violation


def test_the_same_is_accepted_with_an_abandon_after_the_seal(tmp_path: Path) -> None:
    records = good_history()
    replace_step(
        records, 1, step(1, [row("g3", 0, "r3z", prompt=3), row("g3", 1, "r3b", prompt=3)])
    )
    records.insert(records.index(sealed("g3", 1, "r3b")), abandoned("g3", (0, "r3a")))
    report = check(tmp_path, records)
    assert report.ok, report.violations
    assert report.counts["seals_abandoned"] == 2


def test_a_whole_group_abandon_after_the_seal_is_accepted(tmp_path: Path) -> None:
    records = good_history()
    replace_step(
        records, 1, step(1, [row("g3", 0, "r3z", prompt=3), row("g3", 1, "r3y", prompt=3)])
    )
    records.insert(
        records.index(sealed("g3", 1, "r3b")) + 1,
        abandoned("g3", (0, "r3a"), (1, "r3b"), whole=True),
    )
    assert check(tmp_path, records).ok


def test_an_abandon_before_the_seal_does_not_excuse_it(tmp_path: Path) -> None:
    records = good_history()
    replace_step(
        records, 1, step(1, [row("g3", 0, "r3z", prompt=3), row("g3", 1, "r3b", prompt=3)])
    )
    records.insert(records.index(sealed("g3", 0, "r3a")), abandoned("g3", (0, "r3a")))
    violation_with(check(tmp_path, records), "sibling (g3, 0) sealed as r3a", "trained as r3z")


def test_an_abandon_of_another_rollout_does_not_excuse_it(tmp_path: Path) -> None:
    records = good_history()
    replace_step(
        records, 1, step(1, [row("g3", 0, "r3z", prompt=3), row("g3", 1, "r3b", prompt=3)])
    )
    records.append(abandoned("g3", (0, "r3q")))
    only_violation(check(tmp_path, records))


def test_a_group_both_trained_and_dropped(tmp_path: Path) -> None:
    records = [*good_history(), dropped("g0", 0, target_step=5)]
    violation = violation_with(check(tmp_path, records), "group g0 both trained and dropped")
    assert f"events.jsonl:{len(records)}" in violation


def test_a_group_trained_but_never_taken(tmp_path: Path) -> None:
    records = [r for r in good_history() if r != taken("g1", 1)]
    records[records.index(taken("g2", 2))] = taken("g2", 2, position=1)
    records[records.index(taken("g3", 3))] = taken("g3", 3, position=2)
    report = check(tmp_path, records)
    violation_with(report, "group g1 trained but never taken")
    violation_with(report, "prompt 1 trained 1 times but taken 0")


def test_a_group_taken_twice(tmp_path: Path) -> None:
    records = [*good_history(), taken("g0", 0, position=4)]
    violation = violation_with(check(tmp_path, records), "g0 taken twice")
    assert f"events.jsonl:{len(records)}" in violation


def test_an_empty_run_passes(tmp_path: Path) -> None:
    report = check(tmp_path, [started()], complete=False)
    assert report.ok
    assert report.counts["groups_trained"] == 0


def test_a_torn_tail_is_not_part_of_the_history(tmp_path: Path) -> None:
    path = write_trail(tmp_path / "run", good_history())
    with open(path, "ab") as handle:
        handle.write(framed({"event": "prompt_taken"})[:30])  # a write a crash cut short
    assert check_trail(path).ok
