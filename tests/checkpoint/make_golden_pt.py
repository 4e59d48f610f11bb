"""Regenerate the golden ``.pt`` files in ``data/`` with real torch.

How they were made (re-run to reproduce; the expected dicts are deterministic, the archive
bytes are not, because torch stamps a random serialization id)::

    . .venv/bin/activate
    pip install torch==2.13.0      # the CPU build; never an unpinned `torch` (multi-GB CUDA)
    python tests/checkpoint/make_golden_pt.py

Files:

* ``sidecar_v3.pt``: ``torch.save(sidecar_v3(), f)`` to a *path*, so the archive's top folder
  is the file stem ``sidecar_v3`` (torch's choice when saving to a path);
* ``sidecar_v3_buffer.pt``: the same dict saved to an ``io.BytesIO``, whose top folder is
  ``archive`` (how upstream produces the bytes it hashes);
* ``primitives_edge.pt``: ``edge_cases()``, values at the pickle encoding boundaries;
* ``malicious_os_system.pt``: a torch-layout archive whose ``data.pkl`` would call
  ``os.system("echo pwned > /tmp/rollout_recovery_pwned")`` if unpickled naively; readers
  must refuse it. Built by hand (torch cannot save such a thing), never loaded here.

This module imports torch only inside ``main``: the tests import the expected dicts from it.
"""

from __future__ import annotations

import io
import pickle
import sys
import zipfile
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
MALICIOUS_COMMAND = "echo pwned > /tmp/rollout_recovery_pwned"


def _uuid(n: int) -> bytes:
    # Fixed 16-byte attempt ids (uuid4 bytes in production) so the goldens are stable.
    return bytes((n * 37 + i * 11) % 256 for i in range(16))


def _attempt(
    n: int, status: str, gate: str, *, sealed: bool, reward: float | None
) -> dict[str, Any]:
    receipt: dict[str, Any] | None = None
    staging: list[str] = []
    if sealed:
        staging = [f"{gate}/call-{c}" for c in range(2)]
        receipt = {
            "rollout_id": gate,
            "manifest": [
                {"staging_key": key, "model_call_id": f"call-{c}", "num_tokens": 512 + c}
                for c, key in enumerate(staging)
            ],
            "finish_reason": "stop",
            "extra": {"turns": 2, "tool_calls": [], "latency_s": 3.25},
        }
    return {
        "attempt_uuid": _uuid(n),
        "status": status,
        "receipt": receipt,
        "reward": reward,
        "mask_sample": False,
        "reward_checks": (
            {"duplicated_reasoning": False, "empty_final_answer": False, "low_effort": True}
            if sealed
            else None
        ),
        "reward_log_context": (
            {"agent_name": "math_agent", "full_result_json": '{"answer": "42"}'} if sealed else None
        ),
        "staging_keys": staging,
    }


def _group(gid: str, target_step: int | None, *, first_uuid: int) -> dict[str, Any]:
    siblings = []
    for g in range(2):
        gate = f"{gid}_g{g}_a{_uuid(first_uuid + 2 * g + 1).hex()}"
        siblings.append(
            {
                "generation_index": g,
                "attempts": [
                    _attempt(first_uuid + 2 * g, "abandoned", gate, sealed=False, reward=None),
                    _attempt(first_uuid + 2 * g + 1, "sealed", gate, sealed=True, reward=0.75 * g),
                ],
            }
        )
    return {
        "group_id": gid,
        "admission_id": f"adm-{gid}",
        "prompt_id": f"prompt-{gid}",
        "prompt_ref": {"sample_id": 1234, "task_name": "math"},
        "task_source": "gym",
        "recovery_granularity": "prompt_group",
        "expected_generations": 2,
        "target_step": target_step,
        "start_weight_version": 41,
        "status": "admitted",
        "phase": "ready_to_finalize",
        "siblings": siblings,
    }


def sidecar_v3() -> dict[str, Any]:
    """A small realistic NeMo-RL recovery sidecar (schema 3)."""
    return {
        "schema_version": 3,
        "groups": [_group("g-0007", 7, first_uuid=1), _group("g-0008", None, first_uuid=10)],
        "batch_shortfall": {7: 1},
        "sampler_stamps_target_steps": True,
        "finalizer_metrics_by_group": {"g-0005": {"reward_mean": 0.5, "accuracy": 1.0}},
        "finalizer_rewards_by_group": {
            "g-0005": [
                {
                    "sample_id": "s-1",
                    "rollout_id": "g-0005_g0_a00",
                    "reward": 1.0,
                    "log_context": None,
                },
                {
                    "sample_id": "s-2",
                    "rollout_id": "g-0005_g1_a00",
                    "reward": 0.0,
                    "log_context": {"agent_name": "math_agent"},
                },
            ]
        },
        "reward_settings": {
            "version": 1,
            "penalties": {"penalize_low_effort": True, "token_ids": {"unwanted": [3, 17, 99]}},
            "effort": {"low_weight": 0.1, "low_penalty": -0.5, "low_ub": 64, "low_string": "..."},
        },
    }


def edge_cases() -> dict[str, Any]:
    """Values at the encoding boundaries of protocol 2 (int widths, bytes, text, floats)."""
    return {
        "ints": [
            0,
            1,
            255,
            256,
            65535,
            65536,
            -1,
            -(2**31),
            2**31 - 1,
            2**31,
            -(2**31) - 1,
            2**63,
            -(2**63),
            2**200,
        ],
        "floats": [0.0, -0.0, 1.5, 1e308, -1e-308, float("inf"), float("-inf")],
        "bytes": [b"\x00" * 16, bytes(range(256)), b"\xff"],
        "text": ["", "ascii", "h\u00e9llo", "\u2603 snow", "\U0001f600", "line\nbreak"],
        "flags": [True, False, None],
        "int_keys": {0: "zero", -5: "neg", 2**40: "big"},
        "nested": {"a": {"b": {"c": {"d": [[[[]]]]}}}},
        "empty": {"list": [], "dict": {}},
        "many": list(range(2500)),
    }


def golden_expectations() -> dict[str, dict[str, Any]]:
    """File name -> the dict torch saved into it."""
    return {
        "sidecar_v3.pt": sidecar_v3(),
        "sidecar_v3_buffer.pt": sidecar_v3(),
        "primitives_edge.pt": edge_cases(),
    }


def malicious_archive() -> bytes:
    """A torch-layout zip whose pickle calls ``os.system`` (``posix.system`` on Linux)."""
    # Hand-assembled protocol-2 opcodes: GLOBAL posix.system, (command,), REDUCE, STOP.
    command = MALICIOUS_COMMAND.encode()
    pkl = (
        pickle.PROTO
        + b"\x02"
        + pickle.GLOBAL
        + b"posix\nsystem\n"
        + pickle.BINUNICODE
        + len(command).to_bytes(4, "little")
        + command
        + pickle.TUPLE1
        + pickle.REDUCE
        + pickle.STOP
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, content in (
            ("data.pkl", pkl),
            (".format_version", b"1"),
            (".storage_alignment", b"64"),
            ("byteorder", b"little"),
            ("version", b"3\n"),
            (".data/serialization_id", b"0" * 40),
        ):
            info = zipfile.ZipInfo(f"archive/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            archive.writestr(info, content)
    return buffer.getvalue()


def main() -> int:
    import torch

    DATA.mkdir(exist_ok=True)
    print(f"torch {torch.__version__}")
    torch.save(sidecar_v3(), DATA / "sidecar_v3.pt")
    buffer = io.BytesIO()
    torch.save(sidecar_v3(), buffer)
    (DATA / "sidecar_v3_buffer.pt").write_bytes(buffer.getvalue())
    torch.save(edge_cases(), DATA / "primitives_edge.pt")
    (DATA / "malicious_os_system.pt").write_bytes(malicious_archive())
    for name, expected in golden_expectations().items():
        # Sanity: real torch reads back what it wrote.
        assert torch.load(DATA / name, weights_only=True) == expected, name
    for path in sorted(DATA.iterdir()):
        print(f"{path.name}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
