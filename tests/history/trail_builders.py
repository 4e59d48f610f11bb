"""Builders of history records for hand-made trails (the trail checker and golden tests).

Each builder makes the record a real run would append, with only the fields a test is
about as arguments; ``write_trail`` writes records through the real writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rollout_recovery.history import AuditTrail
from rollout_recovery.history.records import (
    AbandonedAttempt,
    AttemptsAbandoned,
    CheckpointCommitted,
    DropReason,
    GroupPublished,
    HistoryRecord,
    PromptDropped,
    PromptTaken,
    RunStarted,
    Seal,
    SiblingSealed,
    StepTrained,
    TrainedRow,
)
from rollout_recovery.rollout import FailureReason
from rollout_recovery.rundir import RunDirectory

N = 2  # generations per prompt
PROMPTS_PER_STEP = 2


def started(*, steps: int = 2, prompts_per_step: int = PROMPTS_PER_STEP) -> RunStarted:
    return RunStarted(
        pid=1,
        resumed_from=None,
        step=0,
        steps=steps,
        prompts_per_step=prompts_per_step,
        group_size=N,
    )


def taken(group: str, prompt: int, *, position: int | None = None) -> PromptTaken:
    return PromptTaken(
        group_id=group,
        prompt_idx=prompt,
        position=prompt if position is None else position,
        batch=prompt // PROMPTS_PER_STEP,
    )


def sealed(group: str, index: int, rollout: str, tokens: int = 10) -> SiblingSealed:
    return SiblingSealed(
        group_id=group,
        seal=Seal(
            generation_index=index,
            rollout_id=rollout,
            receipt={"rollout_id": rollout},
            reward=0.5,
            mask_sample=False,
            tokens=tokens,
        ),
    )


def abandoned(group: str, *attempts: tuple[int, str], whole: bool = False) -> AttemptsAbandoned:
    return AttemptsAbandoned(
        group_id=group,
        attempts=[
            AbandonedAttempt(index, rollout, FailureReason.ATTEMPT_FAILED)
            for index, rollout in attempts
        ],
        whole_group=whole,
    )


def dropped(group: str, prompt: int, *, target_step: int = 1) -> PromptDropped:
    return PromptDropped(
        group_id=group,
        prompt_idx=prompt,
        target_step=target_step,
        reason=DropReason.RETRY_BUDGET_EXHAUSTED,
        detail="retry budget exhausted after 4 rounds",
    )


def published(group: str, target_step: int) -> GroupPublished:
    return GroupPublished(
        group_id=group,
        target_step=target_step,
        row_keys=[f"{group}_g{i}" for i in range(N)],
        valid_rows=N,
        min_weight_version=0,
        max_weight_version=0,
    )


def row(group: str, index: int, rollout: str, *, prompt: int, valid: bool = True) -> TrainedRow:
    return TrainedRow(
        group_id=group,
        generation_index=index,
        prompt_idx=prompt,
        rollout_id=rollout,
        valid=valid,
        reward=0.5,
        weight_version=0,
    )


def step(
    number: int, rows: Sequence[TrainedRow], groups: Sequence[str] | None = None
) -> StepTrained:
    group_ids = list(groups) if groups is not None else sorted({r.group_id for r in rows})
    return StepTrained(
        step=number,
        weight_version=number + 1,
        group_ids=group_ids,
        rows=list(rows),
        valid_rows=sum(1 for r in rows if r.valid),
    )


def checkpoint(number: int) -> CheckpointCommitted:
    return CheckpointCommitted(step=number, name=f"step_{number:06d}", position=0)


def good_history() -> list[HistoryRecord]:
    """Two steps of two prompts: g0, g1 train at step 0; g3 at step 1; g2 is dropped."""
    return [
        started(),
        taken("g0", 0),
        taken("g1", 1),
        sealed("g0", 0, "r0a"),
        sealed("g0", 1, "r0b"),
        published("g0", 0),
        sealed("g1", 0, "r1a"),
        abandoned("g1", (1, "r1x")),  # never sealed, regenerated
        sealed("g1", 1, "r1b"),
        published("g1", 0),
        step(
            0,
            [
                row("g0", 0, "r0a", prompt=0),
                row("g0", 1, "r0b", prompt=0),
                row("g1", 1, "r1b", prompt=1),
                row("g1", 0, "r1a", prompt=1),
            ],
        ),
        checkpoint(1),
        taken("g2", 2),
        taken("g3", 3),
        sealed("g2", 0, "r2a"),
        dropped("g2", 2),  # its seal is excused by the drop
        sealed("g3", 0, "r3a"),
        sealed("g3", 1, "r3b"),
        published("g3", 1),
        step(1, [row("g3", 0, "r3a", prompt=3), row("g3", 1, "r3b", prompt=3)]),
        checkpoint(2),
    ]


def write_trail(directory: Path, records: Sequence[HistoryRecord]) -> Path:
    """Write ``records`` as ``directory/events.jsonl`` through the real writer."""
    directory.mkdir(parents=True, exist_ok=True)
    trail = AuditTrail(RunDirectory(directory))
    try:
        for record in records:
            trail.append(record)
    finally:
        trail.close()
    return directory / "events.jsonl"
