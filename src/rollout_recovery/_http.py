"""Reading untrusted HTTP replies: a capped body, a server's weight version.

Shared by the rollout package's clients (model calls, probes, weight pushes) and the vLLM
weight sync, which read the same servers' replies.
"""

from __future__ import annotations

import httpx

__all__ = ["parse_version", "read_capped"]


async def read_capped(response: httpx.Response, cap: int) -> bytes | None:
    """The body of a streamed ``response``, or None as soon as its declared length or the
    bytes read pass ``cap`` (as decoded); the caller's closing of the stream then drops
    the connection without reading the rest."""
    declared = response.headers.get("content-length", "")
    # More than 18 digits is past any cap (and int() of it would cost for nothing).
    if declared.isdigit() and (len(declared) > 18 or int(declared) > cap):
        return None
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > cap:
            return None
    return bytes(body)


def parse_version(value: object) -> int | None:
    """A version as servers render it (``7``, ``"7"``, ``"step-7"``) as our int, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        digits = value.removeprefix("step-")
        if digits.isdigit():
            return int(digits)
    return None
