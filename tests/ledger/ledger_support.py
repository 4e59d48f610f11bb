"""Shared test doubles and builders for the ledger tests (no test functions here).

Everything is written from the seed contract (NeMo-RL's schema-3 ledger): cut doubles,
prompt payloads, receipts whose manifests name ``{gate_id}/c{k}`` staging keys, and a
``snapshot`` that captures the whole observable ledger state in any status (including the
checkpoint-unsafe ones, where ``state_dict`` refuses to run).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from rollout_recovery import (
    PromptGroupRecoveryRecord,
    RecoveryGranularity,
    RewardChecks,
    RewardLogContext,
    RolloutRecoveryLedger,
    SiblingSealResult,
)

DEAD_CUT_MESSAGE = "data-plane mutation cut is no longer active"


class LiveCut:
    """A cut whose barrier section is still open."""

    def require_live(self) -> None:
        return None


class DeadCut:
    """A cut used after its barrier section exited."""

    def require_live(self) -> None:
        raise RuntimeError(DEAD_CUT_MESSAGE)


CUT = LiveCut()
DEAD = DeadCut()


def starts_with(text: str) -> str:
    """A ``pytest.raises(match=...)`` pattern that anchors the seed's text at the start."""
    return "^" + re.escape(text)


def payload(idx: Any = 7, task_name: Any = None, **extra: Any) -> dict[str, Any]:
    """A dataloader sample (``DatumSpec``-like) with the identity fields the ledger reads."""
    return {"idx": idx, "task_name": task_name, **extra}


def reserve(
    ledger: RolloutRecoveryLedger,
    idx: int = 7,
    *,
    n: int = 2,
    granularity: RecoveryGranularity = RecoveryGranularity.SIBLING,
    admitted: bool = True,
    target_step: int | None = 7,
    start_weight_version: int = 0,
    task_name: str | None = None,
    group_id: str | None = "g",
    admission_id: str | None = None,
    task_source: str | None = None,
    prompt_payload: Any = None,
    cut: Any = CUT,
) -> PromptGroupRecoveryRecord:
    return ledger.reserve_group(
        cut,
        prompt_id=str(idx),
        prompt_payload=payload(idx, task_name) if prompt_payload is None else prompt_payload,
        expected_generations=n,
        target_step=target_step,
        start_weight_version=start_weight_version,
        task_source=task_source,
        recovery_granularity=granularity,
        admitted=admitted,
        group_id=group_id,
        admission_id=admission_id,
    )


def gate_id(ledger: RolloutRecoveryLedger, group_id: str, index: int) -> str:
    return ledger.get_group(group_id).gate_rollout_id(index)


def make_receipt(gate: str, n_keys: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "rollout_id": gate,
        "manifest": [{"staging_key": f"{gate}/c{k}", "call": k} for k in range(n_keys)],
        **extra,
    }


def receipt_keys(gate: str, n_keys: int = 1) -> list[str]:
    return [f"{gate}/c{k}" for k in range(n_keys)]


CHECKS = RewardChecks(duplicated_reasoning=True, empty_final_answer=True, low_effort=True)
LOG_CONTEXT = RewardLogContext(agent_name="agent", full_result_json='{"ok": true}')


def seal(
    ledger: RolloutRecoveryLedger,
    group_id: str,
    index: int,
    *,
    n_keys: int = 1,
    missing_receipt: bool = False,
    reward: float = 1.0,
    mask_sample: bool = False,
    reward_checks: RewardChecks | None = None,
    reward_log_context: RewardLogContext | None = None,
    cut: Any = CUT,
) -> dict[str, Any] | None:
    """Seal sibling ``index`` of a SIBLING-granularity group with a well-formed receipt."""
    gate = gate_id(ledger, group_id, index)
    receipt = None if missing_receipt else make_receipt(gate, n_keys)
    ledger.mark_sibling_sealed(
        cut,
        group_id,
        generation_index=index,
        gate_rollout_id=gate,
        receipt=copy.deepcopy(receipt),
        reward=reward,
        mask_sample=mask_sample,
        reward_checks=reward_checks,
        reward_log_context=reward_log_context,
    )
    return receipt


def seal_results(
    ledger: RolloutRecoveryLedger,
    group_id: str,
    *,
    n_keys: int = 1,
    missing: frozenset[int] = frozenset(),
    reward: float = 1.0,
    mask_sample: bool = False,
) -> dict[int, SiblingSealResult]:
    record = ledger.get_group(group_id)
    results = {}
    for index in range(record.expected_generations):
        gate = record.gate_rollout_id(index)
        results[index] = SiblingSealResult(
            gate_rollout_id=gate,
            receipt=None if index in missing else make_receipt(gate, n_keys),
            reward=reward,
            mask_sample=mask_sample,
        )
    return results


def snapshot(ledger: RolloutRecoveryLedger) -> tuple[Any, ...]:
    """Everything observable about a ledger, in any status.

    ``groups()`` copies are compared field by field (siblings and attempts are dataclasses, so
    ``==`` compares every attempt's uuid, status, receipt, reward, mask, checks, context and
    staging keys); the runtime payload is compared by identity. ``state_dict()`` is included
    when it can be produced, else the refusal's type and message.
    """
    groups = tuple(
        (
            g.group_id,
            g.admission_id,
            g.prompt_id,
            g.prompt_ref,
            g.task_source,
            g.recovery_granularity,
            id(g.runtime_prompt_payload),
            g.expected_generations,
            g.target_step,
            g.start_weight_version,
            g.phase,
            g.status,
            copy.deepcopy(g.siblings),
        )
        for g in ledger.groups()
    )
    try:
        state: Any = ledger.state_dict()
    except (RuntimeError, ValueError, TypeError) as error:
        state = (type(error), str(error))
    return (len(ledger), groups, state, frozenset(ledger.expected_staging_keys()))


def current_statuses(ledger: RolloutRecoveryLedger, group_id: str) -> list[str]:
    return [s.current_attempt.status.value for s in ledger.get_group(group_id).siblings]


PRIMITIVES = (str, int, float, bool, bytes, type(None))


def assert_primitive_tree(value: Any, path: str = "$") -> None:
    """A checkpoint state holds only dict/list/str/int/float/bool/bytes/None (weights_only-safe)."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) in (str, int), f"{path}: key {key!r} is {type(key).__name__}"
            assert_primitive_tree(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert_primitive_tree(item, f"{path}[{i}]")
    else:
        assert type(value) in PRIMITIVES, f"{path}: {type(value).__name__} is not primitive"
