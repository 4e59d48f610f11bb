"""Builders of history records for hand-made trails (the trail checker and golden tests).

Each builder makes the record a real run would append, with only the fields a test is
about as arguments; ``write_trail`` writes records through the real writer. The checker
holds every record to what the records before it established (a seal to the attempt a
round dispatched, a row to its seal, its prompt and its publish), so the builders derive
what a real run would from the same few facts: attempt ids name their sibling
(``rid``), a seal's tokens are generated under its weight version, a row states its
seal's reward and tokens, a step its rows' mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rollout_recovery.history import AuditTrail
from rollout_recovery.history._journal import frame_record
from rollout_recovery.history.records import (
    AbandonedAttempt,
    AttemptsAbandoned,
    BatchAdmitted,
    CheckpointCommitted,
    DropReason,
    FreshAttempt,
    GroupPublished,
    HistoryRecord,
    PromptDropped,
    PromptTaken,
    RoundStarted,
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
TOKENS = 10
REWARD = 0.5


def rid(group: str, index: int, attempt: int = 0) -> str:
    """The id of a sibling's attempt, named as the ledger names it."""
    return f"{group}_g{index}_a{attempt}"


def started(*, steps: int = 2, prompts_per_step: int = PROMPTS_PER_STEP) -> RunStarted:
    return RunStarted(
        pid=1,
        resumed_from=None,
        step=0,
        steps=steps,
        prompts_per_step=prompts_per_step,
        group_size=N,
    )


def taken(group: str, prompt: int, *, position: int | None = None, version: int = 0) -> PromptTaken:
    place = prompt if position is None else position
    return PromptTaken(
        group_id=group,
        prompt_idx=prompt,
        position=place,
        batch=place // PROMPTS_PER_STEP,
        weight_version=version,
        attempts=[rid(group, i) for i in range(N)],
    )


def admitted(batch: int, *groups: str, version: int = 0) -> BatchAdmitted:
    return BatchAdmitted(
        batch=batch, group_ids=list(groups), target_step=batch, weight_version=version
    )


def round_of(group: str, number: int, *attempts: tuple[int, str], version: int = 0) -> RoundStarted:
    return RoundStarted(
        group_id=group,
        round=number,
        dispatched=[FreshAttempt(index, rollout) for index, rollout in attempts],
        weight_version=version,
    )


def first_round(group: str, *, version: int = 0) -> RoundStarted:
    return round_of(group, 1, *((i, rid(group, i)) for i in range(N)), version=version)


def sealed(
    group: str, index: int, rollout: str, *, version: int = 0, tokens: int = TOKENS
) -> SiblingSealed:
    return SiblingSealed(
        group_id=group,
        seal=Seal(
            generation_index=index,
            rollout_id=rollout,
            receipt={"rollout_id": rollout},
            reward=REWARD,
            mask_sample=False,
            tokens=tokens,
            weight_versions=[version],
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


def published(group: str, target_step: int, *, version: int = 0) -> GroupPublished:
    return GroupPublished(
        group_id=group,
        target_step=target_step,
        row_keys=[f"{group}_g{i}" for i in range(N)],
        valid_rows=N,
        min_weight_version=version,
        max_weight_version=version,
        metrics={"finalize/reward_count": float(N), "finalize/reward_sum": REWARD * N},
    )


def row(
    group: str, index: int, rollout: str, *, prompt: int, version: int = 0, valid: bool = True
) -> TrainedRow:
    return TrainedRow(
        group_id=group,
        generation_index=index,
        prompt_idx=prompt,
        rollout_id=rollout,
        valid=valid,
        reward=REWARD if valid else 0.0,
        weight_version=version,
        weight_version_spans=[(version, 0, TOKENS)] if valid else [],
    )


def step(
    number: int, rows: Sequence[TrainedRow], groups: Sequence[str] | None = None
) -> StepTrained:
    group_ids = (
        list(groups) if groups is not None else list(dict.fromkeys(r.group_id for r in rows))
    )
    rewards = [r.reward for r in rows if r.valid]
    return StepTrained(
        step=number,
        weight_version=number + 1,
        group_ids=group_ids,
        rows=list(rows),
        valid_rows=len(rewards),
        mean_reward=sum(rewards) / len(rewards) if rewards else None,
    )


def with_checkpoints(records: Sequence[HistoryRecord], after: Sequence[int]) -> list[HistoryRecord]:
    """``records`` with a ``checkpoint_committed`` after each position in ``after``, each
    snapshotting the journal up to itself (its position its own byte offset, its step
    the steps trained before it), as a checkpoint with nothing appended meanwhile does."""
    out: list[HistoryRecord] = []
    offset = steps = 0
    for index, record in enumerate(records):
        out.append(record)
        offset += len(frame_record(record))
        steps += isinstance(record, StepTrained)
        if index in after:
            committed = CheckpointCommitted(step=steps, name=f"step_{steps:06d}", position=offset)
            out.append(committed)
            offset += len(frame_record(committed))
    return out


def good_history() -> list[HistoryRecord]:
    """Two steps of two prompts: g0, g1 train at step 0 (g1's sibling 1 on its second
    attempt); g3 at step 1; g2 is dropped (its sealed sibling excused by the drop). A
    checkpoint after each step."""
    records = _good_records()
    steps = [i for i, r in enumerate(records) if isinstance(r, StepTrained)]
    return with_checkpoints(records, steps)


def _good_records() -> list[HistoryRecord]:
    return [
        started(),
        taken("g0", 0),
        taken("g1", 1),
        admitted(0, "g0", "g1"),
        first_round("g0"),
        sealed("g0", 0, rid("g0", 0)),
        sealed("g0", 1, rid("g0", 1)),
        published("g0", 0),
        first_round("g1"),
        sealed("g1", 0, rid("g1", 0)),
        abandoned("g1", (1, rid("g1", 1))),  # never sealed, regenerated
        round_of("g1", 2, (1, rid("g1", 1, 1))),
        sealed("g1", 1, rid("g1", 1, 1)),
        published("g1", 0),
        step(
            0,
            [
                row("g0", 0, rid("g0", 0), prompt=0),
                row("g0", 1, rid("g0", 1), prompt=0),
                row("g1", 0, rid("g1", 0), prompt=1),
                row("g1", 1, rid("g1", 1, 1), prompt=1),
            ],
        ),
        taken("g2", 2, version=1),
        taken("g3", 3, version=1),
        admitted(1, "g2", "g3", version=1),
        first_round("g2", version=1),
        sealed("g2", 0, rid("g2", 0), version=1),
        abandoned("g2", (1, rid("g2", 1))),
        dropped("g2", 2),  # its seal is excused by the drop
        first_round("g3", version=1),
        sealed("g3", 0, rid("g3", 0), version=1),
        sealed("g3", 1, rid("g3", 1), version=1),
        published("g3", 1, version=1),
        step(
            1,
            [
                row("g3", 0, rid("g3", 0), prompt=3, version=1),
                row("g3", 1, rid("g3", 1), prompt=3, version=1),
            ],
        ),
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
