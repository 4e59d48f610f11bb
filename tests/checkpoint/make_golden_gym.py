"""Regenerate the golden Gym-lineage sidecars in ``data/``: ``.pt`` with real torch.

NeMo-RL's Gym checkpoint line (PR #4085 and its stack) writes a schema-3
``rollout_recovery.pt`` whose attempts are named by a numeric ``attempt_index`` and gated
by the capture key ``<logical>`` (attempt 0) or ``<logical>-a<N>``; the fields and rules
are the ones listed in ``docs/nemo-rl-lineages.md``. :func:`gym_sidecar` builds such a
state by hand, field for field, as that line's ``build_rollout_recovery_state`` would
return it (no upstream code), and ``main`` saves it the way upstream does::

    . /work/venv/bin/activate        # torch 2.13.0, the CPU build
    python tests/checkpoint/make_golden_gym.py

Files (the expected dict is deterministic; torch's archive bytes are not, because it
stamps a random serialization id, so the tests compare the decoded dicts):

* ``gym_lineage_v3.pt``: ``torch.save(gym_sidecar(), path)``, archive folder
  ``gym_lineage_v3``;
* ``gym_lineage_v3_buffer.pt``: the same dict saved to an ``io.BytesIO`` (folder
  ``archive``), as upstream produces bytes it hashes;
* ``gym_lineage_v3.sidecar``: the same state in this package's native format, written by
  ``write_sidecar`` (deterministic apart from the writer version in its envelope).

This module imports torch and the package only inside ``main``: the tests import the
expected dict from it.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
GOLDEN_PT = "gym_lineage_v3.pt"
GOLDEN_PT_BUFFER = "gym_lineage_v3_buffer.pt"
GOLDEN_NATIVE = "gym_lineage_v3.sidecar"


def _uuid(n: int) -> bytes:
    # Fixed 16-byte attempt UUIDs (uuid4 bytes upstream), distinct per attempt.
    return bytes((n * 41 + i * 13 + 7) % 256 for i in range(16))


def capture_key(logical: str, attempt_index: int) -> str:
    """The Gym lineage's gate id, restated here on purpose (it is part of the format)."""
    return logical if attempt_index == 0 else f"{logical}-a{attempt_index}"


def _digest(n: int) -> str:
    return f"{n:02x}" * 32


def bare_attempt(index: int, attempt_uuid: bytes, status: str) -> dict[str, Any]:
    """An attempt with every field a seal fills still empty, in the lineage's key order."""
    return {
        "attempt_index": index,
        "attempt_uuid": attempt_uuid,
        "status": status,
        "receipt": None,
        "completion_receipt": None,
        "reward": None,
        "mask_sample": None,
        "staging_keys": [],
    }


def _attempt(
    logical: str, index: int, status: str, uuid_n: int, *, calls: int = 2, receipt: bool = True
) -> dict[str, Any]:
    attempt = bare_attempt(index, _uuid(uuid_n), status)
    if status != "sealed":
        return attempt
    key = capture_key(logical, index)
    staging = [f"{key}/call-{c}" for c in range(calls)] if receipt else []
    attempt.update(
        reward=0.5 + 0.25 * index,
        mask_sample=False,
        staging_keys=staging,
        receipt=(
            {
                "rollout_id": key,
                "manifest": [
                    {"staging_key": k, "model_call_id": f"call-{c}", "num_tokens": 100 + c}
                    for c, k in enumerate(staging)
                ],
                "terminal_model_call_id": f"call-{calls - 1}",
                "extra": {"turns": calls, "latency_s": 1.5},
            }
            if receipt
            else None
        ),
        completion_receipt={
            "rollout_id": logical,
            "attempt_index": index,
            "execution_generation": 1,
            "result_identity": f"result-{key}",
            "result_digest": _digest(uuid_n),
            "manifest_capture_key": key if receipt else None,
            "terminal_model_call_id": f"call-{calls - 1}" if receipt else None,
        },
    )
    return attempt


def _group(
    group_id: str,
    sibling_attempts: list[list[str]],
    *,
    first_uuid: int,
    status: str,
    phase: str = "admitted",
    granularity: str = "sibling",
    agent: str | None = "math_agent",
    target_step: int | None = 4,
    admission: str | None = None,
) -> dict[str, Any]:
    """One group; ``sibling_attempts[i]`` lists sibling i's attempt statuses, oldest first."""
    n = first_uuid
    siblings = []
    for g, statuses in enumerate(sibling_attempts):
        logical = f"{group_id}_g{g}"
        attempts = []
        for index, attempt_status in enumerate(statuses):
            attempts.append(_attempt(logical, index, attempt_status, n, calls=1 + (g + index) % 3))
            n += 1
        siblings.append({"generation_index": g, "attempts": attempts})
    return {
        "group_id": group_id,
        "admission_id": admission or f"adm-{group_id}",
        "prompt_id": f"{first_uuid}",
        "prompt_ref": {"sample_id": f"{first_uuid}", "task_name": "math"},
        "task_source": "nemo_gym",
        "resolved_agent_name": agent,
        "recovery_granularity": granularity,
        "expected_generations": len(sibling_attempts),
        "target_step": target_step,
        "start_weight_version": 3,
        "status": status,
        "phase": phase,
        "siblings": siblings,
    }


def gym_sidecar() -> dict[str, Any]:
    """A small Gym-lineage sidecar: retried siblings (attempt indices 0, 1, 2), a seal
    without a receipt, every group status a checkpoint holds, acknowledgements owed."""
    groups = [
        # Sibling 1 sealed on its second attempt (capture key ..._g1-a1); sibling 2 is on
        # its third, not dispatched yet.
        _group(
            "grp-0",
            [["sealed"], ["abandoned", "sealed"], ["abandoned", "abandoned", "reserved"]],
            first_uuid=1,
            status="generating",
            admission="adm-shared",
        ),
        # Prompt-group granularity: a failure restarted both siblings together.
        _group(
            "grp-1",
            [["abandoned", "sealed"], ["abandoned", "sealed"]],
            first_uuid=20,
            status="ready_to_finalize",
            granularity="prompt_group",
            admission="adm-shared",
        ),
        _group(
            "grp-2",
            [["reserved"], ["reserved"]],
            first_uuid=40,
            status="generating",
            phase="reserved",
            agent=None,
            target_step=None,
        ),
        _group(
            "grp-3",
            [["abandoned", "sealed"], ["dispatched"]],
            first_uuid=60,
            status="generating",
        ),
    ]
    # A seal whose capture failed: no receipt, no staging keys (a masked placeholder later).
    missing = groups[1]["siblings"][0]["attempts"][1]
    missing.update(
        receipt=None,
        staging_keys=[],
        completion_receipt={
            **missing["completion_receipt"],
            "manifest_capture_key": None,
            "terminal_model_call_id": None,
        },
    )
    return {
        "schema_version": 3,
        "groups": groups,
        "pending_completed_execution_acknowledgements": [
            {
                "rollout_id": "grp-9_g0",
                "attempt_index": 0,
                "agent_name": "math_agent",
                "execution_generation": 1,
                "result_identity": "result-grp-9_g0",
                "result_digest": _digest(90),
                "manifest_capture_key": "grp-9_g0",
                "terminal_model_call_id": "call-1",
            },
            {
                "rollout_id": "grp-9_g1",
                "attempt_index": 2,
                "agent_name": "math_agent",
                "execution_generation": 2,
                "result_identity": "result-grp-9_g1-a2",
                "result_digest": _digest(91),
                "manifest_capture_key": None,
                "terminal_model_call_id": None,
            },
        ],
        "batch_shortfall": {4: 1},
        "sampler_stamps_target_steps": True,
    }


def main() -> int:
    import torch

    from rollout_recovery.checkpoint import write_sidecar

    DATA.mkdir(exist_ok=True)
    print(f"torch {torch.__version__}")
    torch.save(gym_sidecar(), DATA / GOLDEN_PT)
    buffer = io.BytesIO()
    torch.save(gym_sidecar(), buffer)
    (DATA / GOLDEN_PT_BUFFER).write_bytes(buffer.getvalue())
    write_sidecar(DATA / GOLDEN_NATIVE, gym_sidecar(), format="native")
    for name in (GOLDEN_PT, GOLDEN_PT_BUFFER):
        # Sanity: real torch reads back what it wrote, weights-only as upstream loads it.
        assert torch.load(DATA / name, weights_only=True) == gym_sidecar(), name
    for name in (GOLDEN_PT, GOLDEN_PT_BUFFER, GOLDEN_NATIVE):
        print(f"{name}: {(DATA / name).stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
