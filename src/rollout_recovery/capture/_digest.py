"""Digests of the token-capture contract (§3.1), SHA-256 over a fixed binary encoding.

Three hashes protect a staged call:

- the **call digest** covers every field of one staged delta (identity, parent link, mode,
  lengths, weight version, tokens, mask, logprobs, and the two hashes below), so any flipped
  byte in the row or its header is detected;
- the **chain hash** is ``H(parent chain hash, delta tokens)``: it binds a call to its whole
  ancestry's token content, so a child re-linked to another parent is detected even though
  verification never sees the parent's tokens and the child's at the same time;
- the **cumulative hash** is a hash of the call's full token sequence (prompt plus
  everything generated so far); the writer checks a new call's prompt prefix against its
  parent's cumulative hash, and the verifier checks it against the linearized row.

The encoding follows the contract byte for byte (domain tags, big-endian u64 lengths,
float32 bit patterns), so digests stay comparable with the upstream implementation; with
``chain_hash`` and ``cumulative_hash`` present it matches the newer published variant.
Floats are hashed as float32 because that is what the data plane stores: a digest
recomputed from a re-read row is then byte-exact.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .._bounds import UINT64_LIMIT
from ..errors import InvalidStateError

__all__ = [
    "DIGEST_VERSION",
    "EXTRAS_DIGEST_VERSION",
    "SCHEMA_VERSION",
    "compute_call_digest",
    "compute_chain_hash",
    "encode_token_ids",
    "hash_token_ids",
]

SCHEMA_VERSION = 2
DIGEST_VERSION = 2
EXTRAS_DIGEST_VERSION = 1

_CALL_DOMAIN = b"nemo-gym-staging-call-v2"
_PREFIX_DOMAIN = b"nemo-gym-staging-prefix-v2"
_CHAIN_DOMAIN = b"nemo-gym-staging-chain-v1"

TokenInput = Sequence[int] | npt.NDArray[np.integer]
FloatInput = Sequence[float] | npt.NDArray[np.floating]


def _u64(value: int) -> bytes:
    return struct.pack(">Q", value)


def _text(value: str) -> bytes:
    raw = value.encode("utf-8")
    return _u64(len(raw)) + raw


def _optional(encoded: bytes | None) -> bytes:
    return b"\x00" if encoded is None else b"\x01" + encoded


def _raw_digest(hex_digest: str, name: str) -> bytes:
    try:
        raw = bytes.fromhex(hex_digest)
    except ValueError:
        raw = b""
    if len(raw) != 32 or raw.hex() != hex_digest:
        raise InvalidStateError(f"{name} must be 64 lowercase hex characters", path=f"$.{name}")
    return raw


def encode_token_ids(token_ids: TokenInput) -> bytes:
    """u64 count, then one big-endian u64 per id; ids must be non-negative integers."""
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise InvalidStateError("token ids must be a 1-D sequence of integers", path="$.token_ids")
    if ids.size and int(ids.min()) < 0:
        raise InvalidStateError("token ids must be non-negative", path="$.token_ids")
    return _u64(int(ids.size)) + ids.astype(">u8").tobytes()


def _encode_floats(values: FloatInput, name: str) -> bytes:
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iuf"):
        raise InvalidStateError(f"{name} must be a 1-D sequence of numbers", path=f"$.{name}")
    with np.errstate(over="ignore"):  # an overflow becomes inf, refused just below
        as_f32 = array.astype(">f4")
    if not np.isfinite(as_f32).all():
        raise InvalidStateError(f"{name} must be finite in float32", path=f"$.{name}")
    return _u64(int(as_f32.size)) + as_f32.tobytes()


def hash_token_ids(token_ids: TokenInput) -> str:
    """The prefix hash of a whole token sequence (a call's ``cumulative_hash``)."""
    return hashlib.sha256(_PREFIX_DOMAIN + encode_token_ids(token_ids)).hexdigest()


def compute_chain_hash(parent_chain_hash: str | None, delta_token_ids: TokenInput) -> str:
    """Chain hash of a call: its parent's chain hash (none for a root) and its delta tokens."""
    parent = None if parent_chain_hash is None else _raw_digest(parent_chain_hash, "chain_hash")
    payload = _CHAIN_DOMAIN + _optional(parent) + encode_token_ids(delta_token_ids)
    return hashlib.sha256(payload).hexdigest()


def compute_call_digest(
    *,
    rollout_id: str,
    model_call_id: str,
    parent_call_id: str | None,
    mode: str,
    prev_len: int,
    delta_len: int,
    cum_len: int,
    weight_version: int,
    token_ids: TokenInput,
    token_mask: FloatInput,
    logprobs: FloatInput,
    extras_digest: str,
    chain_hash: str | None,
    cumulative_hash: str | None,
) -> str:
    """The call digest (v2) of one staged delta, as 64 lowercase hex characters."""
    for name, value in (
        ("prev_len", prev_len),
        ("delta_len", delta_len),
        ("cum_len", cum_len),
        ("weight_version", weight_version),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < UINT64_LIMIT:
            raise InvalidStateError(f"{name} must be an int in [0, 2**64)", path=f"$.{name}")
    hasher = hashlib.sha256(_CALL_DOMAIN)
    hasher.update(bytes((SCHEMA_VERSION, DIGEST_VERSION, EXTRAS_DIGEST_VERSION)))
    hasher.update(_text(rollout_id))
    hasher.update(_text(model_call_id))
    hasher.update(_optional(None if parent_call_id is None else _text(parent_call_id)))
    hasher.update(_text(mode))
    for value in (prev_len, delta_len, cum_len, weight_version):
        hasher.update(_u64(value))
    # Each list is wrapped in its byte length again, so list boundaries can never be shifted
    # between the token, mask and logprob sections without changing the digest.
    for encoded in (
        encode_token_ids(token_ids),
        _encode_floats(token_mask, "token_mask"),
        _encode_floats(logprobs, "logprobs"),
    ):
        hasher.update(_u64(len(encoded)) + encoded)
    hasher.update(_raw_digest(extras_digest, "extras_digest"))
    for name, anchor in (("chain_hash", chain_hash), ("cumulative_hash", cumulative_hash)):
        hasher.update(_optional(None if anchor is None else _raw_digest(anchor, name)))
    return hasher.hexdigest()
