"""``finalize_group``: one sealed prompt group -> exactly N canonical rows (upstream §2.8).

Reads only: it fetches staged rows, verifies and linearizes every sibling's receipt, and
finalizes rewards (shape, then penalize), but it writes nothing and touches no ledger. So
it can run before the group's publication is committed to, and a failure here leaves
nothing to undo. :func:`publish_finalized_group` does the writing.

Rollout-level problems never raise: each becomes a masked placeholder with a reason, and
the group still yields N rows. What does raise: a group record that is not finalizable
(wrong status, unsealed or misnumbered siblings; ``InvalidTransitionError``) and
infrastructure faults of the data plane other than a missing or undecodable row (a closed
store, an I/O error), which are not the rollout's fault and must not be masked as such.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

from ..capture import CaptureWriter, LinearizedRollout, Rejection, verify_receipts
from ..dataplane import DataPlane, Row
from ..errors import InvalidStateError, InvalidTransitionError
from ..ledger import (
    PromptGroupRecoveryRecord,
    PromptGroupStatus,
    RolloutAttemptRecord,
    RolloutAttemptStatus,
)
from ..rewards import (
    CaptureRewardOutcome,
    CaptureRewardSettings,
    FinalizedReward,
)
from ._metrics import REWARD_PROCESSING, capture_metrics
from ._result import FinalizedGroup
from ._rows import CanonicalRowMeta, canonical_row

__all__ = ["FINALIZABLE_STATUSES", "finalize_group"]

# READY_TO_FINALIZE is the normal input. FINALIZING is accepted too, for callers that follow
# upstream's order (mark the start, then compute); finalizing is side-effect free either way.
FINALIZABLE_STATUSES: frozenset[PromptGroupStatus] = frozenset(
    {PromptGroupStatus.READY_TO_FINALIZE, PromptGroupStatus.FINALIZING}
)


def finalize_group(
    *,
    group: PromptGroupRecoveryRecord,
    data_plane: DataPlane,
    settings: CaptureRewardSettings,
    staging_partition: str = CaptureWriter.staging_partition,
) -> FinalizedGroup:
    """Verify, linearize and reward every sibling of ``group``; return its N canonical rows.

    ``group`` is a ledger record (``ledger.get_group(gid)``) whose current attempts are all
    sealed; ``settings`` are the run's reward settings (the ones persisted with the
    checkpoint). Staged rows are read from ``staging_partition`` of ``data_plane``.
    """
    _require_finalizable(group)
    attempts = [sibling.current_attempt for sibling in group.siblings]
    gate_ids = [group.gate_rollout_id(index) for index in range(len(attempts))]
    verdicts = verify_receipts(
        [
            (attempt.receipt, attempt.staging_keys, gate_id)
            for attempt, gate_id in zip(attempts, gate_ids, strict=True)
        ],
        data_plane,
        partition=staging_partition,
    )

    # A sibling's final reward, or the reason it is a placeholder: the group's version span
    # (each row's ``weight_version``) comes from the valid rows, so it is known only once
    # every sibling is judged.
    finals: list[CaptureRewardOutcome | str] = [
        verdict.reason
        if isinstance(verdict, Rejection)
        else _final_reward(attempt, verdict, settings)
        for attempt, verdict in zip(attempts, verdicts, strict=True)
    ]
    valid = [
        verdict
        for verdict, final in zip(verdicts, finals, strict=True)
        if isinstance(verdict, LinearizedRollout) and not isinstance(final, str)
    ]
    min_version = min(
        (v.min_weight_version for v in valid if v.min_weight_version is not None),
        default=group.start_weight_version,
    )
    max_version = max(
        (v.max_weight_version for v in valid if v.max_weight_version is not None),
        default=group.start_weight_version,
    )

    metas: list[CanonicalRowMeta] = []
    rows: list[Row] = []
    reward_outcomes: list[CaptureRewardOutcome] = []
    observations: list[FinalizedReward] = []
    failure_buckets: list[str] = []
    rejections: list[Rejection] = []
    valid_manifests: list[Sequence[Mapping[str, Any]]] = []
    for index, (attempt, gate_id, verdict, final) in enumerate(
        zip(attempts, gate_ids, verdicts, finals, strict=True)
    ):
        sample_id = group.logical_rollout_id(index)
        # ``mask_sample`` is a bool on every sealed attempt (a ledger invariant); ``is True``
        # keeps a hand-built record with None from flagging anything.
        mask_sample = attempt.mask_sample is True
        if isinstance(verdict, Rejection):
            rejections.append(verdict)
            failure_buckets.append(verdict.code)
        elif isinstance(final, str):
            failure_buckets.append(REWARD_PROCESSING)
        accepted = verdict if not isinstance(final, str) else None
        assert accepted is None or isinstance(accepted, LinearizedRollout)
        meta = CanonicalRowMeta(
            group_id=group.group_id,
            generation_index=index,
            rollout_id=gate_id,
            valid=accepted is not None,
            reward=0.0 if isinstance(final, str) else final.reward,
            weight_version=min_version,
            weight_version_spans=[]
            if accepted is None
            else [(s.version, s.start, s.end) for s in accepted.token_version_spans],
            sample_id=sample_id,
            prompt_id=group.prompt_id,
            target_step=group.target_step,
            mask_sample=mask_sample,
            sample_mask=0.0 if accepted is None else 1.0,
            prompt_len=0 if accepted is None else accepted.prompt_len,
            min_weight_version=None if accepted is None else accepted.min_weight_version,
            max_weight_version=None if accepted is None else accepted.max_weight_version,
            reason=final if isinstance(final, str) else None,
        )
        metas.append(meta)
        rows.append(canonical_row(meta, accepted))
        if isinstance(final, str):
            continue
        reward_outcomes.append(final)
        observations.append(
            FinalizedReward(
                sample_id=sample_id,
                rollout_id=gate_id,
                reward=final.reward,
                log_context=attempt.reward_log_context,
            )
        )
        assert attempt.receipt is not None  # a verified rollout had a receipt
        valid_manifests.append(attempt.receipt["manifest"])

    metrics = settings.group_metrics(reward_outcomes)
    metrics.update(
        capture_metrics(
            total_rows=len(metas),
            failure_buckets=failure_buckets,
            valid_manifests=valid_manifests,
            rejections=rejections,
            mask_sample_count=sum(meta.mask_sample for meta in metas if meta.valid),
        )
    )
    return FinalizedGroup(
        group_id=group.group_id,
        target_step=group.target_step,
        metas=tuple(metas),
        row_keys=tuple(meta.sample_id for meta in metas),
        rows=tuple(rows),
        staging_keys=tuple(key for attempt in attempts for key in attempt.staging_keys),
        min_weight_version=min_version,
        max_weight_version=max_version,
        metrics=metrics,
        reward_observations=tuple(observations),
    )


def _require_finalizable(group: PromptGroupRecoveryRecord) -> None:
    gid = group.group_id
    if group.status not in FINALIZABLE_STATUSES:
        raise InvalidTransitionError(
            f"cannot finalize group {gid!r} from {group.status.value!r}", group_id=gid
        )
    if len(group.siblings) != group.expected_generations or group.expected_generations < 1:
        raise InvalidTransitionError(
            f"group {gid!r} has {len(group.siblings)} siblings, expected "
            f"{group.expected_generations}",
            group_id=gid,
        )
    for position, sibling in enumerate(group.siblings):
        if sibling.generation_index != position:
            raise InvalidTransitionError(
                f"group {gid!r}: sibling at position {position} has generation_index "
                f"{sibling.generation_index}",
                group_id=gid,
            )
        status = sibling.current_attempt.status
        if status is not RolloutAttemptStatus.SEALED:
            raise InvalidTransitionError(
                f"cannot finalize group {gid!r}: sibling {group.logical_rollout_id(position)!r} "
                f"current attempt is {status.value!r}, not sealed",
                group_id=gid,
            )


def _final_reward(
    attempt: RolloutAttemptRecord, rollout: LinearizedRollout, settings: CaptureRewardSettings
) -> CaptureRewardOutcome | str:
    """The row's reward outcome, or a ``reward_processing:...`` placeholder reason."""
    if attempt.reward is None:
        return f"{REWARD_PROCESSING}:missing_reward"
    try:
        outcome = settings.finalize_reward(
            attempt.reward,
            checks=attempt.reward_checks,
            # An int32 array does all the reward code asks of a sequence (len, slices,
            # iteration yielding ints that hash and compare like Python ints), without the
            # cost of a list copy of every token.
            token_ids=cast(Sequence[int], rollout.token_ids),
            link_spans=rollout.link_spans,
        )
    except InvalidStateError as exc:
        return f"{REWARD_PROCESSING}:{exc}"
    if not math.isfinite(outcome.reward):
        # An infinite raw reward (or shaping overflow) would poison the group's baseline and
        # every pooled statistic; it is a broken reward, not a very good one.
        return f"{REWARD_PROCESSING}:non_finite_reward"
    return outcome
