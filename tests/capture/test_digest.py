"""Digests: the contract's encoding, and sensitivity to every input."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np
import pytest

from rollout_recovery.capture._digest import (
    compute_call_digest,
    compute_chain_hash,
    encode_token_ids,
    hash_token_ids,
)
from rollout_recovery.capture._extras import EMPTY_EXTRAS_DIGEST
from rollout_recovery.errors import InvalidStateError


def test_empty_extras_digest_matches_the_contract_value() -> None:
    # The contract quotes upstream's constant as ``a1edc33c…68b6``; matching it pins the
    # domain tag and the typed encoding of None.
    assert EMPTY_EXTRAS_DIGEST.startswith("a1edc33c")
    assert EMPTY_EXTRAS_DIGEST.endswith("68b6")


def test_token_encoding_is_a_u64_count_then_big_endian_u64_ids() -> None:
    assert encode_token_ids([1, 258]) == (
        (2).to_bytes(8, "big") + (1).to_bytes(8, "big") + (258).to_bytes(8, "big")
    )
    assert (
        hash_token_ids([])
        == hashlib.sha256(b"nemo-gym-staging-prefix-v2" + (0).to_bytes(8, "big")).hexdigest()
    )


def test_chain_hash_binds_the_parent() -> None:
    root = compute_chain_hash(None, [1, 2])
    assert compute_chain_hash(root, [3]) != compute_chain_hash(None, [3])
    assert compute_chain_hash(root, [3]) != compute_chain_hash(compute_chain_hash(None, [9]), [3])
    assert compute_chain_hash(root, [3]) == compute_chain_hash(root, np.array([3], np.int32))


BASE: dict[str, Any] = {
    "rollout_id": "r",
    "model_call_id": "c1",
    "parent_call_id": "c0",
    "mode": "token_in",
    "prev_len": 4,
    "delta_len": 3,
    "cum_len": 7,
    "weight_version": 2,
    "token_ids": [5, 6, 7],
    "token_mask": [0.0, 1.0, 1.0],
    "logprobs": [0.0, -0.5, -1.5],
    "extras_digest": EMPTY_EXTRAS_DIGEST,
    "chain_hash": "11" * 32,
    "cumulative_hash": "22" * 32,
}


def _reference_call_digest() -> str:
    """BASE encoded by hand, straight from the contract's §3.1 description."""

    def u64(v: int) -> bytes:
        return struct.pack(">Q", v)

    def text(v: str) -> bytes:
        return u64(len(v.encode())) + v.encode()

    def wrapped(encoded: bytes) -> bytes:
        return u64(len(encoded)) + encoded

    tokens = u64(3) + b"".join(struct.pack(">Q", t) for t in (5, 6, 7))
    mask = u64(3) + b"".join(struct.pack(">f", m) for m in (0.0, 1.0, 1.0))
    logprobs = u64(3) + b"".join(struct.pack(">f", x) for x in (0.0, -0.5, -1.5))
    payload = (
        b"nemo-gym-staging-call-v2"
        + bytes([2, 2, 1])
        + text("r")
        + text("c1")
        + b"\x01"
        + text("c0")
        + text("token_in")
        + u64(4)
        + u64(3)
        + u64(7)
        + u64(2)
        + wrapped(tokens)
        + wrapped(mask)
        + wrapped(logprobs)
        + bytes.fromhex(EMPTY_EXTRAS_DIGEST)
        + b"\x01"
        + bytes.fromhex("11" * 32)
        + b"\x01"
        + bytes.fromhex("22" * 32)
    )
    return hashlib.sha256(payload).hexdigest()


def test_call_digest_follows_the_contract_encoding() -> None:
    assert compute_call_digest(**BASE) == _reference_call_digest()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rollout_id", "r2"),
        ("model_call_id", "c2"),
        ("parent_call_id", None),
        ("parent_call_id", "c9"),
        ("mode", "text"),
        ("prev_len", 5),
        ("delta_len", 4),
        ("cum_len", 8),
        ("weight_version", 3),
        ("token_ids", [5, 6, 8]),
        ("token_ids", [5, 6]),
        ("token_mask", [0.0, 0.0, 1.0]),
        ("logprobs", [0.0, -0.5, -1.25]),
        ("logprobs", [-0.0, -0.5, -1.5]),  # float32 bit patterns, so -0.0 != 0.0
        ("extras_digest", "33" * 32),
        ("chain_hash", None),
        ("chain_hash", "12" * 32),
        ("cumulative_hash", None),
        ("cumulative_hash", "23" * 32),
    ],
)
def test_call_digest_changes_with_every_field(field: str, value: Any) -> None:
    assert compute_call_digest(**{**BASE, field: value}) != compute_call_digest(**BASE)


def test_list_boundaries_cannot_shift_between_sections() -> None:
    moved = {**BASE, "token_ids": [5, 6], "token_mask": [0.0, 1.0, 1.0, 1.0]}
    assert compute_call_digest(**moved) != compute_call_digest(**BASE)


def test_floats_are_hashed_as_float32() -> None:
    as_f64 = {**BASE, "logprobs": np.array([0.0, -0.5, -1.5], np.float64)}
    assert compute_call_digest(**as_f64) == compute_call_digest(**BASE)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("token_ids", [-1, 6, 7]),
        ("token_ids", [[5], [6], [7]]),
        ("logprobs", [0.0, float("nan"), -1.5]),
        ("logprobs", [0.0, 1e39, -1.5]),  # overflows float32
        ("prev_len", -1),
        ("weight_version", True),
        ("extras_digest", "XYZ"),
        ("chain_hash", "AB" * 32),
    ],
)
def test_call_digest_refuses_invalid_inputs(field: str, value: Any) -> None:
    with pytest.raises(InvalidStateError):
        compute_call_digest(**{**BASE, field: value})


def test_extras_digest_follows_the_typed_encoding_byte_for_byte() -> None:
    import hashlib
    import struct

    from rollout_recovery.capture._extras import compute_extras_digest

    def u64(n: int) -> bytes:
        return struct.pack(">Q", n)

    # Keys sorted by UTF-8 bytes: "B" < "a".
    expected = hashlib.sha256(
        b"nemo-gym-staging-extras-v1\x01"
        + b"D"
        + u64(2)
        + u64(1)
        + b"B"
        + b"L"
        + u64(3)
        + b"B\x01"
        + b"F"
        + struct.pack(">d", -0.5)
        + b"N"
        + u64(1)
        + b"a"
        + b"I"
        + struct.pack(">q", -3)
    ).hexdigest()
    assert compute_extras_digest({"a": -3, "B": [True, -0.5, None]}) == expected
    # Insertion order of keys does not matter; a changed value does.
    assert compute_extras_digest({"B": [True, -0.5, None], "a": -3}) == expected
    assert compute_extras_digest({"a": -3, "B": [True, -0.5, 0]}) != expected
