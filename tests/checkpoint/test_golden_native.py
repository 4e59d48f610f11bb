"""The golden native sidecar: format version 1 as written once, so it cannot drift.

``tests/data/golden_native_v1.sidecar`` was written by :func:`write_golden` (below) and is
committed. These tests read it with today's code and re-encode it with today's encoder: a
change to the envelope, the payload layout, field order, integer widths or the checksum
shows here as a byte difference, before a user's checkpoint fails to load.

Regenerate only on purpose, for a new format version (then keep the old file, since
format 1 must keep loading)::

    python tests/checkpoint/test_golden_native.py

It is never run by the tests. The file is built from a ledger driven through the public
API with attempt UUIDs drawn from a counter instead of ``uuid4``, so it is deterministic.
"""

from __future__ import annotations

import hashlib
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import msgspec
import pytest

import rollout_recovery
from rollout_recovery import (
    CaptureRewardSettings,
    FinalizedReward,
    RecoveryGranularity,
    RewardChecks,
    RewardLogContext,
    RolloutRecoveryLedger,
    SiblingSealResult,
    build_rollout_recovery_state,
)
from rollout_recovery.checkpoint import load_sidecar, write_sidecar
from rollout_recovery.checkpoint._native import encode_native_checkpoint
from rollout_recovery.errors import SidecarFormatError

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_native_v1.sidecar"
# The file as committed. If this changes, the golden was rewritten: format 1 files written
# before would no longer be pinned.
GOLDEN_SHA256 = "c6ae0ad1fd24e3bf117ee3b4c3f6a83ecacb76e0eb95e5f8c277cfb471f3f0e7"
# The format's own constants, restated here on purpose: they are part of format 1.
MAGIC = b"\x89RRSIDECAR\r\n\x1a\n"
ENVELOPE_FIELDS = ["format", "format_version", "writer_version", "checksum", "payload"]


# ---------------------------------------------------------------------------- generator


class _Cut:
    def require_live(self) -> None:
        return None


CUT = _Cut()


@contextmanager
def _counting_uuids() -> Iterator[None]:
    """Attempt UUIDs 00..01, 00..02, ... instead of random ones."""
    counter = iter(range(1, 1 << 16))
    with mock.patch.object(uuid, "uuid4", lambda: uuid.UUID(int=next(counter))):
        yield


def _receipt(gate: str, calls: int) -> dict[str, Any]:
    return {
        "rollout_id": gate,
        "manifest": [
            {"staging_key": f"{gate}/call-{c}", "num_tokens": 64 + c} for c in range(calls)
        ],
        "finish_reason": "stop",
        "extra": {"turns": 2, "latency_s": 1.5, "blob": b"\x00\xff", "none": None},
    }


def _reserve(
    ledger: RolloutRecoveryLedger,
    group_id: str,
    *,
    n: int,
    granularity: RecoveryGranularity,
    admitted: bool = True,
) -> str:
    index = int(group_id.rsplit("-", 1)[1])
    ledger.reserve_group(
        CUT,
        prompt_id=str(index),
        prompt_payload={"idx": index, "task_name": "math"},
        expected_generations=n,
        target_step=index if admitted else None,
        start_weight_version=index,
        task_source="golden" if index % 2 else None,
        recovery_granularity=granularity,
        admitted=admitted,
        group_id=group_id,
        admission_id=f"adm-{index}",
    )
    return group_id


def _seal(ledger: RolloutRecoveryLedger, group_id: str, index: int, *, receipt: bool) -> None:
    gate = ledger.get_group(group_id).gate_rollout_id(index)
    ledger.mark_sibling_sealed(
        CUT,
        group_id,
        generation_index=index,
        gate_rollout_id=gate,
        receipt=_receipt(gate, calls=1 + index) if receipt else None,
        reward=0.5 * index - 0.25,
        mask_sample=index == 2,
        reward_checks=RewardChecks(
            duplicated_reasoning=False, empty_final_answer=index == 1, low_effort=False
        ),
        reward_log_context=RewardLogContext(agent_name="golden", full_result_json='{"a": 1}'),
    )


def golden_ledger() -> RolloutRecoveryLedger:
    """Five groups, one per state a checkpoint holds, at both granularities."""
    sibling, whole = RecoveryGranularity.SIBLING, RecoveryGranularity.PROMPT_GROUP
    with _counting_uuids():
        ledger = RolloutRecoveryLedger()
        # Reserved by the sampler, not yet admitted.
        _reserve(ledger, "grp-0", n=2, granularity=sibling, admitted=False)
        # Admitted, not dispatched.
        _reserve(ledger, "grp-1", n=2, granularity=whole)
        # Dispatched: one sibling sealed with a receipt, one sealed without (a capture
        # failure), one abandoned and retried (history: abandoned, then reserved).
        gid = _reserve(ledger, "grp-2", n=3, granularity=sibling)
        ledger.mark_group_dispatched(CUT, gid)
        _seal(ledger, gid, 0, receipt=True)
        _seal(ledger, gid, 1, receipt=False)
        ledger.abandon_unsealed(CUT, gid)
        ledger.prepare_incomplete_retry(CUT, gid)
        # Every sibling sealed with a receipt: ready to finalize.
        gid = _reserve(ledger, "grp-3", n=3, granularity=sibling)
        ledger.mark_group_dispatched(CUT, gid)
        for index in range(3):
            _seal(ledger, gid, index, receipt=True)
        # Prompt-group granularity: the whole cohort abandoned and retried, then sealed
        # atomically on the second try.
        gid = _reserve(ledger, "grp-4", n=2, granularity=whole)
        ledger.mark_group_dispatched(CUT, gid)
        ledger.abandon_unsealed(CUT, gid)
        ledger.prepare_incomplete_retry(CUT, gid)
        ledger.mark_group_dispatched(CUT, gid)
        group = ledger.get_group(gid)
        ledger.mark_group_sealed(
            CUT,
            gid,
            {
                index: SiblingSealResult(
                    gate_rollout_id=group.gate_rollout_id(index),
                    receipt=_receipt(group.gate_rollout_id(index), calls=1),
                    reward=float(index),
                    mask_sample=False,
                )
                for index in range(2)
            },
        )
    return ledger


CONTROLLER: dict[str, Any] = {
    "batch_shortfall": {0: 1, 3: 2},
    "sampler_stamps_target_steps": True,
    "finalizer_metrics_by_group": {"done-9": {"reward_mean": 0.75, "len": 12.0}},
    "finalizer_rewards_by_group": {
        "done-9": [
            FinalizedReward(sample_id="done-9_g0", rollout_id="r0", reward=0.5),
            FinalizedReward(sample_id="done-9_g1", rollout_id="r1", reward=1.0),
        ]
    },
    "reward_settings": CaptureRewardSettings(
        enabled_penalties=("penalize_unwanted_tokens",), unwanted_tokens=(3, 7)
    ),
}


def golden_state() -> dict[str, Any]:
    return dict(build_rollout_recovery_state(golden_ledger(), **CONTROLLER))


def write_golden(path: Path = GOLDEN) -> str:
    """Write the golden file with today's encoder; returns the sha256 to pin above."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_sidecar(path, golden_state(), format="native")
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -------------------------------------------------------------------------------- tests


def _envelope(data: bytes) -> dict[str, Any]:
    """The envelope as a plain map, read without the library's decoder."""
    assert data.startswith(MAGIC)
    envelope: dict[str, Any] = msgspec.msgpack.decode(data[len(MAGIC) :])
    return envelope


def _as_written_today(golden: bytes) -> bytes:
    """The golden bytes with today's writer_version, the one field meant to change.

    The envelope records the library version that wrote the file; everything else in the
    file must be what today's encoder writes.
    """
    old = _envelope(golden)["writer_version"]
    key = msgspec.msgpack.encode("writer_version")
    before = key + msgspec.msgpack.encode(old)
    assert golden.count(before) == 1
    return golden.replace(before, key + msgspec.msgpack.encode(rollout_recovery.__version__))


@pytest.fixture(scope="module")
def golden() -> bytes:
    return GOLDEN.read_bytes()


def test_golden_file_is_the_committed_one(golden: bytes) -> None:
    assert hashlib.sha256(golden).hexdigest() == GOLDEN_SHA256


def test_golden_envelope_is_format_1(golden: bytes) -> None:
    envelope = _envelope(golden)
    assert list(envelope) == ENVELOPE_FIELDS
    assert envelope["format"] == "rollout-recovery-sidecar"
    assert envelope["format_version"] == 1
    assert envelope["writer_version"] == "0.1.0"
    payload = envelope["payload"]
    assert envelope["checksum"] == "sha256:" + hashlib.sha256(payload).hexdigest()
    assert list(msgspec.msgpack.decode(payload)) == [
        "schema_version",
        "groups",
        "batch_shortfall",
        "sampler_stamps_target_steps",
        "finalizer_metrics_by_group",
        "reward_settings",
        "finalizer_rewards_by_group",
    ]


def test_golden_loads_to_the_expected_state() -> None:
    loaded = load_sidecar(GOLDEN)
    assert loaded.format == "native"
    assert (loaded.format_version, loaded.writer_version) == (1, "0.1.0")
    state = loaded.state
    assert state["schema_version"] == 3
    groups = {group["group_id"]: group for group in state["groups"]}
    assert {
        gid: (g["phase"], g["status"], g["recovery_granularity"]) for gid, g in groups.items()
    } == {
        "grp-0": ("reserved", "generating", "sibling"),
        "grp-1": ("admitted", "generating", "prompt_group"),
        "grp-2": ("admitted", "generating", "sibling"),
        "grp-3": ("admitted", "ready_to_finalize", "sibling"),
        "grp-4": ("admitted", "ready_to_finalize", "prompt_group"),
    }
    histories = {
        gid: [[a["status"] for a in s["attempts"]] for s in g["siblings"]]
        for gid, g in groups.items()
    }
    assert histories["grp-2"] == [["sealed"], ["sealed"], ["abandoned", "reserved"]]
    assert histories["grp-4"] == [["abandoned", "sealed"], ["abandoned", "sealed"]]
    # Attempt UUIDs came from a counter, in the order the ledger minted them.
    first = groups["grp-0"]["siblings"][0]["attempts"][0]
    assert first["attempt_uuid"] == uuid.UUID(int=1).bytes
    sealed = groups["grp-2"]["siblings"][0]["attempts"][0]
    assert sealed["reward"] == -0.25
    assert sealed["staging_keys"] == [f"grp-2_g0_a{uuid.UUID(int=5).hex}/call-0"]
    assert sealed["receipt"]["extra"]["blob"] == b"\x00\xff"
    assert groups["grp-2"]["siblings"][1]["attempts"][0]["receipt"] is None
    assert len(loaded.ledger.expected_staging_keys()) == 1 + (1 + 2 + 3) + 2
    assert loaded.parsed.batch_shortfall == {0: 1, 3: 2}
    assert loaded.parsed.finalizer_metrics_by_group == {
        "done-9": {"reward_mean": 0.75, "len": 12.0}
    }
    assert loaded.parsed.reward_settings == CONTROLLER["reward_settings"]


def test_golden_is_what_todays_builder_and_encoder_write(golden: bytes, tmp_path: Path) -> None:
    # From the same ledger calls, today's code writes the same bytes.
    assert (
        write_golden(tmp_path / "again.sidecar")
        == hashlib.sha256(_as_written_today(golden)).hexdigest()
    )


def test_reencoding_the_loaded_golden_is_byte_identical(golden: bytes, tmp_path: Path) -> None:
    expected = _as_written_today(golden)
    loaded = load_sidecar(GOLDEN)
    # Through the state dict, as `rollout-recovery convert` and write_sidecar do...
    path = tmp_path / "reencoded.sidecar"
    write_sidecar(path, loaded.state, format="native")
    assert path.read_bytes() == expected
    # ...and straight from the restored ledger, as a checkpoint inside a cut does (after
    # the controller rebinds each group's prompt from the dataset).
    for group in loaded.ledger.groups():
        loaded.ledger.bind_runtime_prompt(
            CUT, group.group_id, {"idx": int(group.prompt_id), "task_name": "math"}
        )
    parsed = loaded.parsed
    assert (
        encode_native_checkpoint(
            loaded.ledger,
            batch_shortfall=parsed.batch_shortfall,
            sampler_stamps_target_steps=bool(parsed.sampler_stamps_target_steps),
            finalizer_metrics_by_group=parsed.finalizer_metrics_by_group,
            finalizer_rewards_by_group=parsed.finalizer_rewards_by_group,
            reward_settings=parsed.reward_settings,
        )
        == expected
    )


def test_as_written_today_changes_only_the_writer_version(golden: bytes) -> None:
    # The helper above must not hide a difference: swap in another version and back.
    envelope = _envelope(golden)
    key = msgspec.msgpack.encode("writer_version")
    swapped = golden.replace(
        key + msgspec.msgpack.encode(envelope["writer_version"]),
        key + msgspec.msgpack.encode("9.9.9-other"),
    )
    assert _envelope(swapped) == {**envelope, "writer_version": "9.9.9-other"}
    assert swapped != golden


def _corruption_offsets(golden: bytes) -> list[int]:
    """Every byte outside the payload (magic, envelope keys, versions, checksum) and 64
    spread over the payload, which the checksum covers uniformly.

    Flipping all eight bits makes every byte of the envelope's short ASCII strings invalid
    UTF-8. A gentler flip inside ``writer_version`` (``0.1.0`` -> ``1.1.0``) does load: that
    field is informational and outside the checksum.
    """
    payload = _envelope(golden)["payload"]
    start = golden.index(payload)
    end = start + len(payload)
    spread = range(start, end, max(1, len(payload) // 64))
    return sorted({*range(start), *spread, end - 1, *range(end, len(golden))})


def test_one_byte_corruptions_are_refused(golden: bytes, tmp_path: Path) -> None:
    path = tmp_path / "corrupt.sidecar"
    offsets = _corruption_offsets(golden)
    assert len(offsets) > 100
    accepted = []
    for offset in offsets:
        corrupt = bytearray(golden)
        corrupt[offset] ^= 0xFF
        path.write_bytes(corrupt)
        try:
            load_sidecar(path)
        except SidecarFormatError:
            continue
        accepted.append(offset)
    assert accepted == []


if __name__ == "__main__":
    digest = write_golden()
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes); pin GOLDEN_SHA256 = {digest!r}")
    sys.exit(0)
