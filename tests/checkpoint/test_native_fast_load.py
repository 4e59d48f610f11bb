"""load_sidecar's native fast path: the same ledger as the dict path, and just as strict.

``load_sidecar`` decodes a native payload straight into the ledger's storage Structs and
skips ``from_state_dict``. These tests pin that the shortcut changes nothing observable.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rollout_recovery import (
    RecoveryGranularity,
    RewardChecks,
    RewardLogContext,
    RolloutRecoveryLedger,
    build_rollout_recovery_state,
)
from rollout_recovery.checkpoint import load_sidecar, write_sidecar
from rollout_recovery.checkpoint._native import FORMAT_NAME, FORMAT_VERSION, MAGIC, NativeEnvelope
from rollout_recovery.errors import InvalidStateError


class _Cut:
    def require_live(self) -> None:
        return None


CUT = _Cut()


def _ledger() -> RolloutRecoveryLedger:
    ledger = RolloutRecoveryLedger()
    for index, granularity in enumerate(
        (RecoveryGranularity.SIBLING, RecoveryGranularity.PROMPT_GROUP, RecoveryGranularity.SIBLING)
    ):
        group_id = f"g{index}"
        ledger.reserve_group(
            CUT,
            prompt_id=str(index),
            prompt_payload={"idx": index, "task_name": "math"},
            expected_generations=3,
            target_step=index,
            start_weight_version=1,
            recovery_granularity=granularity,
            group_id=group_id,
        )
        ledger.mark_group_dispatched(CUT, group_id)
    record = ledger.get_group("g0")
    for sibling in (0, 1):
        gate = record.gate_rollout_id(sibling)
        ledger.mark_sibling_sealed(
            CUT,
            "g0",
            generation_index=sibling,
            gate_rollout_id=gate,
            receipt={"rollout_id": gate, "manifest": [{"staging_key": f"{gate}/c0"}]},
            reward=2,  # an int: the ledger stores float(reward)
            mask_sample=False,
            reward_checks=RewardChecks(
                duplicated_reasoning=False, empty_final_answer=True, low_effort=False
            ),
            reward_log_context=RewardLogContext(agent_name="a", full_result_json='{"x": 1}'),
        )
    ledger.abandon_unsealed(CUT, "g2")
    ledger.prepare_incomplete_retry(CUT, "g2")
    return ledger


def _sidecar(ledger: RolloutRecoveryLedger) -> dict[str, Any]:
    return build_rollout_recovery_state(
        ledger, batch_shortfall={3: 1}, sampler_stamps_target_steps=True
    )


def test_native_load_equals_the_dict_path(tmp_path: Path) -> None:
    original = _ledger()
    state = _sidecar(original)
    write_sidecar(tmp_path / "s", state, format="native")
    loaded = load_sidecar(tmp_path / "s")
    via_dict = RolloutRecoveryLedger.from_state_dict(loaded.parsed.ledger_state)
    for ledger in (loaded.ledger, via_dict):
        for group in ledger.groups():
            ledger.bind_runtime_prompt(
                CUT, group.group_id, {"idx": int(group.prompt_id), "task_name": "math"}
            )
    assert loaded.ledger.state_dict() == via_dict.state_dict() == original.state_dict()
    assert loaded.state == state
    # Records built from fast-loaded storage carry the public types, not storage Structs.
    attempt = loaded.ledger.get_group("g0").siblings[0].current_attempt
    assert type(attempt.reward_checks) is RewardChecks
    assert type(attempt.reward_log_context) is RewardLogContext
    assert type(loaded.ledger.get_group("g0").prompt_ref).__name__ == "PromptRef"


def _native_bytes(state: dict[str, Any]) -> bytes:
    """A well-formed native file around any payload, bypassing the writer's checks."""
    payload = msgspec.msgpack.encode(state)
    envelope = NativeEnvelope(
        format=FORMAT_NAME,
        format_version=FORMAT_VERSION,
        writer_version="test",
        checksum="sha256:" + hashlib.sha256(payload).hexdigest(),
        payload=payload,
    )
    return MAGIC + msgspec.msgpack.encode(envelope)


@pytest.mark.parametrize(
    ("where", "mutate"),
    [
        ("prompt_ref", lambda s: s["groups"][0]["prompt_ref"].update(extra=1)),
        (
            "reward_checks",
            lambda s: s["groups"][0]["siblings"][0]["attempts"][0]["reward_checks"].update(x=1),
        ),
        (
            "reward_log_context",
            lambda s: s["groups"][0]["siblings"][0]["attempts"][0]["reward_log_context"].update(
                x=1
            ),
        ),
    ],
)
def test_native_load_refuses_unknown_keys_in_nested_records(
    tmp_path: Path, where: str, mutate: Any
) -> None:
    state = _sidecar(_ledger())
    mutate(state)
    (tmp_path / "s").write_bytes(_native_bytes(state))
    with pytest.raises(InvalidStateError) as caught:
        load_sidecar(tmp_path / "s")
    assert caught.value.path is not None and where in caught.value.path


def test_native_load_runs_the_value_checks(tmp_path: Path) -> None:
    state = _sidecar(_ledger())
    attempt = state["groups"][0]["siblings"][0]["attempts"][0]
    attempt["staging_keys"] = ["someone-else/c0"]
    (tmp_path / "s").write_bytes(_native_bytes(state))
    with pytest.raises(InvalidStateError, match="sealed receipt staging manifest mismatch"):
        load_sidecar(tmp_path / "s")
    state = _sidecar(_ledger())
    state["groups"][0]["siblings"][0]["attempts"][0]["reward_log_context"]["full_result_json"] = (
        "[1, 2]"
    )
    (tmp_path / "s").write_bytes(_native_bytes(state))
    with pytest.raises(InvalidStateError, match="must encode an object"):
        load_sidecar(tmp_path / "s")
