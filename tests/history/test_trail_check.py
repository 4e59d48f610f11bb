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
    admitted,
    dropped,
    first_round,
    good_history,
    rid,
    round_of,
    row,
    sealed,
    started,
    step,
    taken,
    write_trail,
)

from rollout_recovery.history._trail_check import TrailReport, check_trail
from rollout_recovery.history.records import (
    HistoryRecord,
    PromptDropped,
    PromptTaken,
    RoundStarted,
    SiblingSealed,
    StepTrained,
)


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
        "steps_refused": 0,
        "valid_rows_refused": 0,
        "prompts_taken": 4,
        "prompts_dropped": 1,
        "seals": 7,
        "seals_trained": 6,
        "seals_abandoned": 1,
        "attempts_resumed": 0,
        "calls_resumed": 0,
        "restores": 0,
        "restored_seals_kept": 0,
        "restored_seals_discarded": 0,
        "replayed_records": 0,
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


def index_of(records: list[HistoryRecord], kind: type, group: str, *, nth: int = 0) -> int:
    """The position of the ``nth`` record of ``kind`` about ``group``."""
    found = [
        i
        for i, r in enumerate(records)
        if isinstance(r, kind) and getattr(r, "group_id", None) == group
    ]
    return found[nth]


def test_the_dataloader_positions_must_be_contiguous(tmp_path: Path) -> None:
    records = good_history()
    records[index_of(records, PromptTaken, "g3")] = msgspec.structs.replace(
        taken("g3", 3, version=1), position=5, batch=1
    )
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
                row("g3", 0, rid("g3", 0), prompt=3, version=1),
                row("g3", 1, rid("g3", 1), prompt=3, version=1),
                row("g0", 0, rid("g0", 0), prompt=0),
            ],
            groups=["g3"],
        ),
    )
    report = check(tmp_path, records)
    violation_with(report, "group g0 trained in steps [0, 1]")
    violation_with(report, "sibling ('g0', 0) trained twice")
    violation_with(report, "rows of group g0 were trained, but the group was trained")


def test_a_group_with_too_few_rows(tmp_path: Path) -> None:
    records = good_history()
    replace_step(records, 1, step(1, [row("g3", 0, rid("g3", 0), prompt=3, version=1)]))
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
                row("g3", 0, rid("g3", 0), prompt=3, version=1),
                row("g3", 1, rid("g3", 1), prompt=3, version=1),
                row("g3", 2, rid("g3", 2), prompt=3, version=1),
            ],
        ),
    )
    violation_with(check(tmp_path, records), "group g3", "generation indices [0, 1, 2]")


def test_a_step_with_fewer_groups_than_it_expected(tmp_path: Path) -> None:
    records = good_history()
    del records[index_of(records, PromptDropped, "g2")]  # step 1 still expects g2
    report = check(tmp_path, records)
    violation_with(report, "step 1 trained 1 groups, expected 2")


def test_steps_out_of_order(tmp_path: Path) -> None:
    records = good_history()
    last = max(i for i, r in enumerate(records) if isinstance(r, StepTrained))
    trained = records[last]
    assert isinstance(trained, StepTrained)
    records[last] = msgspec.structs.replace(trained, step=2)
    report = check(tmp_path, records)
    violation_with(report, "step 2 trained where step 1 was due")
    violation_with(report, "step 2 was trained while step 1 was due")


def test_a_prompt_taken_but_neither_trained_nor_dropped(tmp_path: Path) -> None:
    records = [*good_history(), taken("g4", 4, version=2)]
    violation = only_violation(check(tmp_path, records))
    assert "prompt 4 (group g4" in violation
    assert f"events.jsonl:{len(records)}" in violation
    assert "neither trained nor dropped" in violation


def test_a_prompt_still_in_flight_is_accepted_when_the_run_is_incomplete(tmp_path: Path) -> None:
    records = [
        *good_history(),
        taken("g4", 4, version=2),
        taken("g5", 5, version=2),
        admitted(2, "g4", "g5", version=2),
        first_round("g4", version=2),
        sealed("g4", 0, rid("g4", 0), version=2),
    ]
    assert check(tmp_path, records, complete=False).ok
    finished = check(tmp_path, records, complete=True)
    violation_with(finished, "group g4", "neither trained nor dropped")
    violation_with(finished, f"sibling (g4, 0) sealed as {rid('g4', 0)}", "never trained")


def test_a_sealed_sibling_trained_as_another_rollout(tmp_path: Path) -> None:
    records = good_history()
    other = rid("g3", 0, 9)
    replace_step(
        records,
        1,
        step(
            1,
            [
                row("g3", 0, other, prompt=3, version=1),
                row("g3", 1, rid("g3", 1), prompt=3, version=1),
            ],
        ),
    )
    report = check(tmp_path, records)
    seal_line = index_of(records, SiblingSealed, "g3") + 1
    violation = violation_with(report, "a lost seal")
    assert f"sibling (g3, 0) sealed as {rid('g3', 0)} (events.jsonl:{seal_line})" in violation
    assert f"trained as {other}" in violation
    violation_with(report, f"row (g3, 0) was trained as {other}", "the seal its group published")


def test_an_abandon_after_the_seal_excuses_nothing(tmp_path: Path) -> None:
    """A sealed attempt is never abandoned: an abandon after a seal is an altered journal,
    not a reason to train another rollout in its place."""
    records = good_history()
    other = rid("g3", 0, 9)
    replace_step(
        records,
        1,
        step(
            1,
            [
                row("g3", 0, other, prompt=3, version=1),
                row("g3", 1, rid("g3", 1), prompt=3, version=1),
            ],
        ),
    )
    records.insert(
        index_of(records, SiblingSealed, "g3", nth=1), abandoned("g3", (0, rid("g3", 0)))
    )
    report = check(tmp_path, records)
    violation_with(report, "group g3's abandon lists", "a sealed attempt is never abandoned")
    violation_with(report, f"sibling (g3, 0) sealed as {rid('g3', 0)}", "a lost seal")


def test_an_abandon_before_the_seal_does_not_excuse_it(tmp_path: Path) -> None:
    records = good_history()
    records.insert(index_of(records, SiblingSealed, "g3"), abandoned("g3", (0, rid("g3", 0))))
    report = check(tmp_path, records)
    violation_with(
        report, f"sibling (g3, 0) sealed as {rid('g3', 0)}", "no round dispatched what was sealed"
    )


def test_a_group_both_trained_and_dropped(tmp_path: Path) -> None:
    records = [*good_history(), dropped("g0", 0, target_step=0)]
    report = check(tmp_path, records)
    violation = violation_with(report, "group g0 both trained and dropped")
    assert f"events.jsonl:{len(records)}" in violation
    violation_with(report, "a drop names group g0, which is trained already")


def test_a_group_trained_but_never_taken(tmp_path: Path) -> None:
    records = good_history()
    del records[index_of(records, PromptTaken, "g1")]
    report = check(tmp_path, records)
    violation_with(report, "group g1 trained but never taken")
    violation_with(report, "prompt 1 trained 1 times but taken 0")


def test_a_group_taken_twice(tmp_path: Path) -> None:
    records = [*good_history(), taken("g0", 0, position=4, version=2)]
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


def test_a_second_round_gives_a_fresh_attempt_id(tmp_path: Path) -> None:
    records = good_history()
    index = index_of(records, RoundStarted, "g1", nth=1)
    records[index] = round_of("g1", 2, (1, rid("g1", 1)))  # the abandoned attempt's own id
    violation_with(check(tmp_path, records), f"attempt id {rid('g1', 1)} was given before")
