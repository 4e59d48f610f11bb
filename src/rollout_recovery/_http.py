"""Reading untrusted HTTP replies: a capped body, a server's weight version.

Shared by the rollout package's clients (model calls, probes, weight pushes) and the vLLM
weight sync, which read the same servers' replies.

A body is capped as it is *decoded*, not after: httpx inflates a compressed body one
network chunk at a time, all of it at once, so a 980-byte gzip reply became 512 MiB before
any cap could look at it. :func:`read_capped` reads the raw bytes and inflates them itself,
never asking zlib for more than the cap leaves room for.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import httpx

__all__ = ["ACCEPTED_ENCODINGS", "WEIGHT_VERSION_HEADER", "parse_version", "read_capped"]

#: The header ``rollout-recovery serve`` names the weight version of every generation
#: answer in (vLLM's ``/v1`` bodies have no field for it); clients check it.
WEIGHT_VERSION_HEADER = "X-Weight-Version"

#: What a client of ours asks servers for (``Accept-Encoding``): the encodings
#: :func:`read_capped` can inflate under a cap. Anything else in a reply is refused.
ACCEPTED_ENCODINGS = "gzip, deflate"

# A version is one of the job's: a non-negative int within 64 bits (19 digits at most, so
# a server's string of a million digits is refused before int() spends time on it).
_VERSION_MAX = 2**63 - 1
_VERSION_DIGITS = len(str(_VERSION_MAX))
# More than 18 digits of Content-Length is past any cap.
_LENGTH_DIGITS = 18

_INFLATERS: dict[str, Callable[[], zlib._Decompress]] = {
    "gzip": lambda: zlib.decompressobj(zlib.MAX_WBITS | 16),
    "x-gzip": lambda: zlib.decompressobj(zlib.MAX_WBITS | 16),
    "deflate": lambda: zlib.decompressobj(zlib.MAX_WBITS),  # RFC 9110: the zlib format
}


def _is_ascii_number(text: str) -> bool:
    # str.isdigit() alone takes "²" and "٣", which int() refuses or reads as a digit.
    return text.isascii() and text.isdigit()


def _inflater(response: httpx.Response) -> zlib._Decompress | None:
    """The inflater the reply's ``Content-Encoding`` needs (None: not compressed);
    ``httpx.DecodingError`` for an encoding we never asked for, or more than one."""
    names = [
        name.strip().lower()
        for name in response.headers.get_list("content-encoding", split_commas=True)
    ]
    names = [name for name in names if name not in ("", "identity")]
    if not names:
        return None
    make = _INFLATERS.get(names[0]) if len(names) == 1 else None
    if make is None:
        shown = ", ".join(names)[:80]
        raise httpx.DecodingError(
            f"the reply is encoded as {shown!r}; only one of {ACCEPTED_ENCODINGS} is read",
            request=response.request,
        )
    return make()


def _inflate(inflater: zlib._Decompress, data: bytes, room: int, *, final: bool) -> bytes:
    """``data`` inflated, at most ``room`` bytes of it: more than the caller can take is
    already a refusal, so nothing past it is ever made. Output short of ``room`` means
    every input byte was used (zlib stops early only for want of room)."""
    try:
        out = inflater.decompress(data, room) if data else b""
        if final and len(out) < room:
            out += inflater.flush()
    except zlib.error as error:
        raise httpx.DecodingError(f"the reply's encoding is broken: {error}") from None
    return out


async def read_capped(response: httpx.Response, cap: int) -> bytes | None:
    """The body of a streamed ``response``, or None as soon as its declared length or the
    bytes decoded pass ``cap``; the caller's closing of the stream then drops the
    connection without reading the rest.

    A compressed body is inflated here, at most ``cap + 1`` bytes of it; an encoding other
    than one of :data:`ACCEPTED_ENCODINGS`, or a broken one, raises ``httpx.DecodingError``
    (as httpx's own decoders do).
    """
    if response.is_stream_consumed:
        # Read whole when it was made (an in-memory reply, e.g. ``httpx.MockTransport``'s
        # of bytes); a reply from a socket never is.
        return None if len(response.content) > cap else response.content
    inflater = _inflater(response)
    declared = response.headers.get("content-length", "")
    # A declared length is of the encoded body: more than the cap is too much either way
    # (inflating never shrinks what a server chose to send).
    if _is_ascii_number(declared) and (len(declared) > _LENGTH_DIGITS or int(declared) > cap):
        return None
    body = bytearray()
    async for chunk in response.aiter_raw():
        if inflater is not None:
            chunk = _inflate(inflater, chunk, cap + 1 - len(body), final=False)
        body += chunk
        if len(body) > cap:
            return None
    if inflater is not None:
        body += _inflate(inflater, b"", cap + 1 - len(body), final=True)
        if len(body) > cap:
            return None
    return bytes(body)


def parse_version(value: object) -> int | None:
    """A version as servers render it (``7``, ``"7"``, ``"step-7"``) as our int, else None.

    Only ASCII digits, and only what a version of ours can be (0 to 2**63 - 1): a server's
    ``"²"``, ``"-1"`` or a thousand digits names no version, never an exception.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= _VERSION_MAX else None
    if isinstance(value, str):
        digits = value.removeprefix("step-")
        if _is_ascii_number(digits) and len(digits) <= _VERSION_DIGITS:
            number = int(digits)
            return number if number <= _VERSION_MAX else None
    return None
