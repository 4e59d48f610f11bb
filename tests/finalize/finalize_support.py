"""Shared builders for the finalizer tests (no test functions here).

A sealed group is built the way production builds one: a real ledger reserves and dispatches
the group, a real :class:`CaptureWriter` stages every model call of each sibling into a real
data plane under the attempt's gate id, :func:`assemble_receipt` makes the receipt, and the
ledger seals it. Tampering helpers then damage one sibling in one specific way.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.capture._digest import compute_call_digest
from rollout_recovery.capture._receipt import CaptureFailure, assemble_receipt
from rollout_recovery.capture._records import CallRecord
from rollout_recovery.dataplane import DataPlane, Row
from rollout_recovery.ledger import PromptGroupRecoveryRecord, RolloutRecoveryLedger
from rollout_recovery.rewards import RewardChecks, RewardLogContext


class LiveCut:
    """A cut whose barrier section is open (the ledger and stores only call require_live)."""

    def require_live(self) -> None:
        return None


CUT = LiveCut()

Kind = Literal[
    "sealed", "failed", "missing_row", "flipped_token", "reordered", "broken_parent", "poisoned"
]
KINDS: tuple[Kind, ...] = (
    "sealed",
    "failed",
    "missing_row",
    "flipped_token",
    "reordered",
    "broken_parent",
    "poisoned",
)
# The reason prefix each damaged kind must produce.
EXPECTED_REASON: dict[Kind, str] = {
    "failed": "missing_receipt",
    "missing_row": "missing_staging_row",
    "flipped_token": "digest_mismatch",
    "reordered": "rebuild_failed:manifest_order",
    "broken_parent": "rebuild_failed:missing_parent",
    "poisoned": "capture_poisoned",
}


@dataclass
class CallPlan:
    """One call of a linear chain: new prompt tokens carried in, then generated tokens."""

    carried: list[int]
    generated: list[int]
    logprobs: list[float]
    weight_version: int


@dataclass
class StagedSibling:
    rollout_id: str
    receipt: dict[str, Any] | None
    records: list[CallRecord]
    expected_tokens: list[int] = field(default_factory=list)
    expected_mask: list[float] = field(default_factory=list)
    expected_logprobs: list[float] = field(default_factory=list)
    prompt_len: int = 0


def default_plan(index: int, calls: int = 2, tokens: int = 3) -> list[CallPlan]:
    """A deterministic chain: ``calls`` calls, the first carrying a prompt."""
    base = 100 * (index + 1)
    return [
        CallPlan(
            carried=[base + 10 * c + t for t in range(tokens)],
            generated=[base + 10 * c + 5 + t for t in range(tokens)],
            logprobs=[-0.25 * (t + 1) for t in range(tokens)],
            weight_version=3 + c,
        )
        for c in range(calls)
    ]


def stage_chain(store: DataPlane, rollout_id: str, plan: Sequence[CallPlan]) -> StagedSibling:
    """Stage ``plan`` as a linear chain root -> ... -> terminal; return the receipt and an
    oracle of the linearization computed the naive way."""
    writer = CaptureWriter(store)
    records: list[CallRecord] = []
    tokens: list[int] = []
    mask: list[float] = []
    logprobs: list[float] = []
    for position, call in enumerate(plan):
        prompt = tokens + call.carried
        records.append(
            writer.stage_call(
                rollout_id=rollout_id,
                model_call_id=f"c{position}",
                parent=records[-1] if records else None,
                prompt_token_ids=prompt,
                generated_token_ids=call.generated,
                generated_logprobs=call.logprobs,
                weight_version=call.weight_version,
            )
        )
        tokens = prompt + call.generated
        mask += [0.0] * len(call.carried) + [1.0] * len(call.generated)
        logprobs += [0.0] * len(call.carried) + [float(np.float32(x)) for x in call.logprobs]
    terminal = records[-1].model_call_id
    receipt = assemble_receipt(rollout_id, records, terminal_model_call_id=terminal).to_dict()
    return StagedSibling(
        rollout_id=rollout_id,
        receipt=receipt,
        records=records,
        expected_tokens=tokens,
        expected_mask=mask,
        expected_logprobs=logprobs,
        prompt_len=len(plan[0].carried),
    )


def reserve_dispatched(
    ledger: RolloutRecoveryLedger,
    *,
    group_id: str = "grp",
    n: int = 4,
    target_step: int | None = 3,
    start_weight_version: int = 2,
) -> PromptGroupRecoveryRecord:
    ledger.reserve_group(
        CUT,
        prompt_id="7",
        prompt_payload={"idx": 7, "task_name": None},
        expected_generations=n,
        target_step=target_step,
        start_weight_version=start_weight_version,
        group_id=group_id,
    )
    ledger.mark_group_dispatched(CUT, group_id)
    return ledger.get_group(group_id)


def damage(store: DataPlane, sibling: StagedSibling, kind: Kind) -> None:
    """Damage ``sibling`` in place (its receipt and/or its staged rows) as ``kind`` says.

    Chains must have at least two calls for ``reordered`` and ``broken_parent``.
    """
    records = sibling.records
    keys = [r.staging_key for r in records]
    if kind == "sealed":
        return
    if kind == "failed":
        sibling.receipt = None
    elif kind == "poisoned":
        sibling.receipt = assemble_receipt(
            sibling.rollout_id,
            records,
            terminal_model_call_id=records[-1].model_call_id,
            failures=[CaptureFailure(model_call_id="cx", reason="worker_lost_ack")],
        ).to_dict()
    elif kind == "missing_row":
        store.clear(CaptureWriter.staging_partition, [keys[len(keys) // 2]])
    elif kind == "flipped_token":
        key = keys[-1]
        (row,) = store.get(CaptureWriter.staging_partition, [key])
        flipped = row.token_ids.copy()
        flipped[-1] ^= 1
        store.put(CaptureWriter.staging_partition, {key: replace(row, token_ids=flipped)})
    elif kind == "reordered":
        assert sibling.receipt is not None and len(records) >= 2
        receipt = copy.deepcopy(sibling.receipt)
        receipt["manifest"].reverse()
        sibling.receipt = receipt
    elif kind == "broken_parent":
        assert sibling.receipt is not None and len(records) >= 2
        sibling.receipt = _forge_parent(store, sibling.receipt, len(records) - 1, "ghost")
    else:  # pragma: no cover - exhaustive
        raise AssertionError(kind)


def _forge_parent(
    store: DataPlane, receipt: dict[str, Any], index: int, parent: str
) -> dict[str, Any]:
    """Re-point call ``index`` at ``parent`` in both its manifest entry and its staged row
    header, re-signed with a recomputed digest: only the lineage check can catch it."""
    forged = copy.deepcopy(receipt)
    entry = forged["manifest"][index]
    (row,) = store.get(CaptureWriter.staging_partition, [entry["staging_key"]])
    header = dict(row.metadata)
    entry["parent_call_id"] = header["parent_call_id"] = parent
    digest = compute_call_digest(
        rollout_id=forged["rollout_id"],
        model_call_id=entry["model_call_id"],
        parent_call_id=parent,
        mode=entry["mode"],
        prev_len=entry["prev_len"],
        delta_len=entry["delta_len"],
        cum_len=entry["cum_len"],
        weight_version=entry["weight_version"],
        token_ids=row.token_ids,
        token_mask=row.token_mask,
        logprobs=row.logprobs,
        extras_digest=entry["extras_digest"],
        chain_hash=entry["chain_hash"],
        cumulative_hash=entry["cumulative_hash"],
    )
    entry["digest"] = header["digest"] = digest
    store.put(
        CaptureWriter.staging_partition, {entry["staging_key"]: replace(row, metadata=header)}
    )
    return forged


@dataclass
class SealOptions:
    reward: float = 1.0
    mask_sample: bool = False
    checks: RewardChecks | None = None
    log_context: RewardLogContext | None = None


def build_group(
    ledger: RolloutRecoveryLedger,
    store: DataPlane,
    kinds: Sequence[Kind],
    *,
    group_id: str = "grp",
    plans: Sequence[Sequence[CallPlan]] | None = None,
    options: Sequence[SealOptions] | None = None,
    target_step: int | None = 3,
    start_weight_version: int = 2,
) -> list[StagedSibling]:
    """Reserve, dispatch, stage, damage and seal one group; it ends READY_TO_FINALIZE."""
    record = reserve_dispatched(
        ledger,
        group_id=group_id,
        n=len(kinds),
        target_step=target_step,
        start_weight_version=start_weight_version,
    )
    staged: list[StagedSibling] = []
    for index, kind in enumerate(kinds):
        plan = plans[index] if plans is not None else default_plan(index)
        sibling = stage_chain(store, record.gate_rollout_id(index), plan)
        damage(store, sibling, kind)
        option = options[index] if options is not None else SealOptions(reward=float(index))
        ledger.mark_sibling_sealed(
            CUT,
            group_id,
            generation_index=index,
            gate_rollout_id=sibling.rollout_id,
            receipt=sibling.receipt,
            reward=option.reward,
            mask_sample=option.mask_sample,
            reward_checks=option.checks,
            reward_log_context=option.log_context,
        )
        staged.append(sibling)
    return staged


def row_arrays(row: Row) -> tuple[list[int], list[float], list[float]]:
    return row.token_ids.tolist(), row.token_mask.tolist(), row.logprobs.tolist()
