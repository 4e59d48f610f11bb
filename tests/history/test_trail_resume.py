"""check_trail on resumed attempts: one good history, one broken history per rule.

A resumed attempt (``attempt_resumed``) was dispatched for its sibling by a round, and
continues calls of an earlier attempt of that same sibling, abandoned before it; a seal
uses at most the calls it was handed.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from trail_builders import abandoned, admitted, started, write_trail

from rollout_recovery.history._trail_check import TrailReport, check_trail
from rollout_recovery.history.records import (
    AbandonedAttempt,
    AttemptResumed,
    AttemptsAbandoned,
    FreshAttempt,
    HistoryRecord,
    PromptTaken,
    Restored,
    RoundStarted,
    Seal,
    SiblingSealed,
)
from rollout_recovery.rollout import FailureReason

LOST, FRESH, OTHER = "g5_g0_a1", "g5_g0_a2", "g5_g1_a1"


def resumed(**changes: object) -> AttemptResumed:
    record = AttemptResumed(
        group_id="g5",
        generation_index=0,
        rollout_id=FRESH,
        from_rollout_id=LOST,
        calls=[f"{LOST}/reason-1", f"{LOST}/reason-2"],
        tokens=8,
        weight_versions=[0, 0],
    )
    return msgspec.structs.replace(record, **changes)


def seal(
    inherited: int = 2,
    *,
    index: int = 0,
    rollout_id: str = FRESH,
    tokens: int = 14,
    reward: float = 1.0,
) -> SiblingSealed:
    return SiblingSealed(
        group_id="g5",
        seal=Seal(
            generation_index=index,
            rollout_id=rollout_id,
            receipt={"rollout_id": rollout_id},
            reward=reward,
            mask_sample=False,
            tokens=tokens,
            weight_versions=[0],
            inherited_calls=inherited,
            inherited_tokens=8 if inherited else 0,
        ),
    )


def history(
    *, resume: AttemptResumed | None = None, sealed: SiblingSealed | None = None
) -> list[HistoryRecord]:
    return [
        started(),
        PromptTaken(group_id="g5", prompt_idx=5, position=0, batch=0, attempts=[LOST, OTHER]),
        admitted(0, "g5"),
        RoundStarted(
            group_id="g5",
            round=1,
            dispatched=[FreshAttempt(0, LOST), FreshAttempt(1, OTHER)],
            weight_version=0,
        ),
        seal(0, index=1, rollout_id=OTHER, tokens=6, reward=0.0),
        abandoned("g5", (0, LOST)),
        RoundStarted(group_id="g5", round=2, dispatched=[FreshAttempt(0, FRESH)], weight_version=0),
        resume or resumed(),
        sealed or seal(),
    ]


def restored() -> Restored:
    """A restore of a snapshot taken at the journal's start (its records all replayed)."""
    return Restored(
        checkpoint="step_000000",
        step=0,
        snapshot_position=0,
        replayed_records=5,  # every record before it
        groups_in_ledger=1,
        sealed_siblings_kept=1,
        canonical_groups=0,
    )


def check(tmp_path: Path, records: list[HistoryRecord]) -> TrailReport:
    return check_trail(write_trail(tmp_path / "run", records), complete=False)


def violation(report: TrailReport, needle: str) -> str:
    assert not report.ok
    matching = [v for v in report.violations if needle in v]
    assert len(matching) == 1, report.violations
    return matching[0]


def test_a_resume_of_the_siblings_lost_attempt_passes_with_its_counts(tmp_path: Path) -> None:
    report = check(tmp_path, history())
    assert report.ok, report.violations
    assert report.counts["attempts_resumed"] == 1 and report.counts["calls_resumed"] == 2


def test_a_refused_resume_names_no_source_and_passes(tmp_path: Path) -> None:
    refused = resumed(
        from_rollout_id=None, calls=[], tokens=0, weight_versions=[], refused=[f"{LOST}: x"]
    )
    assert check(tmp_path, history(resume=refused, sealed=seal(inherited=0))).ok


def test_continuing_the_attempt_in_flight_itself_is_refused(tmp_path: Path) -> None:
    """Only an earlier attempt of the sibling is lost (abandoned, or cut off by a restore):
    the attempt in flight is not."""
    itself = resumed(from_rollout_id=FRESH, calls=[f"{FRESH}/reason-1"], weight_versions=[0])
    found = violation(
        check(tmp_path, history(resume=itself, sealed=seal(inherited=1))),
        "not an earlier attempt of that sibling",
    )
    assert f"{FRESH} of sibling ('g5', 0) continues {FRESH}" in found
    assert "events.jsonl:8" in found


def test_an_attempt_a_restore_cut_off_may_be_continued_without_an_abandon(
    tmp_path: Path,
) -> None:
    """A restore abandons whatever it finds unsealed, also attempts it records no abandon
    for (a group its reuse policy rewound to before their round)."""
    records = history()
    records[5:7] = [
        restored(),
        AttemptsAbandoned(
            group_id="g5",
            attempts=[
                AbandonedAttempt(0, LOST, FailureReason.RESTART),
            ],
        ),
        RoundStarted(group_id="g5", round=2, dispatched=[FreshAttempt(0, FRESH)], weight_version=0),
    ]
    report = check(tmp_path, records)
    assert report.ok, report.violations


def test_continuing_another_siblings_attempt_is_refused(tmp_path: Path) -> None:
    other = resumed(from_rollout_id=OTHER, calls=[f"{OTHER}/reason-1"], weight_versions=[0])
    found = violation(
        check(tmp_path, history(resume=other, sealed=seal(inherited=1))),
        "not an earlier attempt of that sibling",
    )
    assert OTHER in found


def test_a_resume_of_an_attempt_no_round_dispatched_is_refused(tmp_path: Path) -> None:
    ghost = resumed(rollout_id="g5_g0_a9")
    violation(check(tmp_path, history(resume=ghost)), "no round dispatched it")


def test_calls_of_another_attempt_are_refused(tmp_path: Path) -> None:
    foreign = resumed(calls=[f"{LOST}/reason-1", f"{OTHER}/reason-2"])
    found = violation(check(tmp_path, history(resume=foreign)), "continues calls")
    assert OTHER in found


def test_a_seal_that_used_more_calls_than_it_was_handed_is_refused(tmp_path: Path) -> None:
    found = violation(check(tmp_path, history(sealed=seal(inherited=3))), "inherited calls")
    assert "sealed with 3 inherited calls but was handed 2" in found
