"""Call extras: per-call engine material staged with a row, and their digest (§3.1, v1).

A backend records what the tokens alone do not say: the sampling parameters, which logprob
mode the engine reported (vLLM's ``raw_logprobs`` before temperature and top-p, or
``processed_logprobs`` after), the server that served the call, the server's own weight
version and its per-token weight-version spans. They live in the staged row's header and
their digest enters the call digest, so verification detects a changed extra as surely as a
changed token.

The digest is the contract's typed encoding: SHA-256 over the domain tag and the encoding
version byte, then ``N`` None, ``B`` bool, ``I`` signed 64-bit int, ``F`` finite double,
``S`` text, ``L`` list, ``D`` dict with keys sorted by their UTF-8 bytes. Tuples, bytes,
numpy scalars, NaN and infinity are refused, so an extra always survives a JSON or msgpack
round trip unchanged.
"""

from __future__ import annotations

import hashlib
import math
import struct
from typing import Any

from .._bounds import INT64_MAX, MAX_PLAIN_DEPTH, PLAIN_INT_MIN
from .._checks import is_utf8_text
from ..errors import InvalidStateError
from ._digest import _text, _u64

__all__ = ["EMPTY_EXTRAS_DIGEST", "compute_extras_digest"]

_EXTRAS_DOMAIN = b"nemo-gym-staging-extras-v1"
_ENCODING_VERSION = b"\x01"


def _encode(value: Any, path: str, depth: int) -> bytes:
    # Exact types on purpose: a numpy scalar or an int subclass would not round-trip as
    # the same typed value through the row codec.
    if value is None:
        return b"N"
    if type(value) is bool:
        return b"B" + (b"\x01" if value else b"\x00")
    if type(value) is int:
        if not PLAIN_INT_MIN <= value <= INT64_MAX:
            raise InvalidStateError("extras ints must fit in a signed 64-bit int", path=path)
        return b"I" + struct.pack(">q", value)
    if type(value) is float:
        if not math.isfinite(value):
            raise InvalidStateError("extras floats must be finite", path=path)
        return b"F" + struct.pack(">d", value)
    if type(value) is str:
        if not is_utf8_text(value):
            raise InvalidStateError("extras strings must be UTF-8 (no lone surrogates)", path=path)
        return b"S" + _text(value)
    if type(value) in (list, dict) and depth >= MAX_PLAIN_DEPTH:
        # The row metadata's bound (extras sit one level below its root); it also turns a
        # value that contains itself into this error instead of a RecursionError.
        raise InvalidStateError(
            f"extras are nested deeper than {MAX_PLAIN_DEPTH} levels (or contain themselves)",
            path=path,
        )
    if type(value) is list:
        items = b"".join(_encode(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
        return b"L" + _u64(len(value)) + items
    if type(value) is dict:
        for key in value:
            if type(key) is not str or not is_utf8_text(key):
                raise InvalidStateError(f"extras dict keys must be str, got {key!r}", path=path)
        keys = sorted(value, key=lambda k: k.encode("utf-8"))
        pairs = b"".join(_text(k) + _encode(value[k], f"{path}.{k}", depth + 1) for k in keys)
        return b"D" + _u64(len(keys)) + pairs
    raise InvalidStateError(
        f"extras values must be None, bool, int, float, str, list or dict, "
        f"got {type(value).__name__}",
        path=path,
    )


def compute_extras_digest(extras: Any) -> str:
    """The v1 extras digest of ``extras`` (``None`` for a call without extras)."""
    return hashlib.sha256(
        _EXTRAS_DOMAIN + _ENCODING_VERSION + _encode(extras, "$.extras", depth=1)
    ).hexdigest()


# The digest of "no extras", which every call without extras carries.
EMPTY_EXTRAS_DIGEST = compute_extras_digest(None)
