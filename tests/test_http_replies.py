"""Untrusted replies (``_http``): a body capped as it is decoded, a version parsed safely.

Issue 24 item 15: a 980-byte gzip reply made the job allocate 512 MiB, because httpx
inflates each network chunk whole before any cap can look at it (model calls, probes and
weight pushes alike). Item 14: a server's ``"²"`` passed ``str.isdigit()`` and stopped
the run in ``int()``.
"""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery._http import parse_version, read_capped

MIB = 2**20


def _gzip_of_zeros(size: int) -> bytes:
    """gzip of ``size`` zero bytes, made a MiB at a time (the whole never exists)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = bytes(MIB)
    parts = [packer.compress(block) for _ in range(size // MIB)]
    return b"".join([*parts, packer.flush()])


def _read(
    content: bytes, cap: int, headers: dict[str, str | bytes] | None = None
) -> tuple[bytes | httpx.DecodingError | None, int]:
    """``read_capped`` of a reply with ``content`` and ``headers`` (or the decoding error
    it raised), and the peak of memory traced while it ran."""

    async def chunks() -> AsyncIterator[bytes]:
        # Streamed as from a socket (a reply of bytes is read whole when it is made).
        for start in range(0, len(content), 64 * 1024):
            yield content[start : start + 64 * 1024]

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=chunks(), headers=headers or {})

    async def scenario() -> bytes | httpx.DecodingError | None:
        async with (
            httpx.AsyncClient(transport=httpx.MockTransport(reply)) as client,
            client.stream("GET", "http://server/health") as response,
        ):
            try:
                return await read_capped(response, cap)
            except httpx.DecodingError as error:
                return error

    tracemalloc.start()
    try:
        result = asyncio.run(scenario())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, peak


def test_a_gzip_bomb_is_refused_at_the_cap_without_inflating_it() -> None:
    bomb = _gzip_of_zeros(64 * MIB)  # about 64 KiB on the wire
    result, peak = _read(bomb, MIB, {"content-encoding": "gzip"})
    assert result is None
    # Inflated at most to the cap (plus the encoded body and the client's own needs).
    assert peak < 4 * MIB, f"{peak / MIB:.1f} MiB traced"


def test_a_doubly_gzipped_bomb_is_refused_without_inflating_it() -> None:
    """The issue's shape (980 bytes of gzip over gzip inflated to 512 MiB), at 128 MiB."""
    bomb = gzip.compress(_gzip_of_zeros(128 * MIB), 9)
    assert len(bomb) < 2048
    outcome, peak = _read(bomb, 4 * MIB, {"content-encoding": "gzip, gzip"})
    assert isinstance(outcome, httpx.DecodingError)
    assert peak < 4 * MIB, f"{peak / MIB:.1f} MiB traced"


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        ("gzip", lambda data: gzip.compress(data)),
        ("x-gzip", lambda data: gzip.compress(data)),
        ("deflate", lambda data: zlib.compress(data)),
        ("identity", lambda data: data),
        ("", lambda data: data),
    ],
)
def test_an_encoded_reply_within_the_cap_is_read_whole(
    encoding: str, pack: Callable[[bytes], bytes]
) -> None:
    body = b'{"weight_version": "7"}' * 1000
    headers: dict[str, str | bytes] = {"content-encoding": encoding} if encoding else {}
    assert _read(pack(body), len(body), headers)[0] == body
    assert _read(pack(body), len(body) - 1, headers)[0] is None


@pytest.mark.parametrize(
    ("headers", "content"),
    [
        ({"content-encoding": "br"}, b"\x0b\x02\x80{}\x03"),
        ({"content-encoding": "zstd"}, b"(\xb5/\xfd"),
        ({"content-encoding": "gzip"}, b"not gzip at all"),
        ({"content-encoding": "deflate"}, b"\x00\x01\x02"),
    ],
)
def test_an_encoding_never_asked_for_or_broken_is_a_decoding_error(
    headers: dict[str, str | bytes], content: bytes
) -> None:
    assert isinstance(_read(content, MIB, headers)[0], httpx.DecodingError)


def test_a_declared_length_past_the_cap_is_refused_before_the_body() -> None:
    assert _read(b"x" * 10, 5)[0] is None
    # A length no cap could reach, in digits int() would refuse or spend time on.
    for declared in ("9" * 40, "²", "٣"):
        reply = _read(b"{}", MIB, {"content-length": declared.encode()})[0]
        assert reply in (None, b"{}")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("7", 7),
        ("step-7", 7),
        (7, 7),
        (0, 0),
        (2**63 - 1, 2**63 - 1),
        ("9223372036854775807", 2**63 - 1),
        # Not a version of ours: None, never an exception.
        ("²", None),
        ("step-²", None),
        ("٣", None),
        ("7²", None),
        ("9223372036854775808", None),
        ("1" * 5000, None),
        (2**63, None),
        (-1, None),
        ("-1", None),
        (" 7", None),
        ("1_000", None),
        ("", None),
        (True, None),
        (None, None),
        (7.0, None),
        ("loading", None),
    ],
)
def test_a_version_is_an_ascii_number_within_64_bits(value: object, expected: int | None) -> None:
    assert parse_version(value) == expected


@given(st.one_of(st.text(), st.integers(), st.none(), st.booleans(), st.floats()))
def test_any_version_field_parses_or_names_no_version(value: object) -> None:
    version = parse_version(value)
    assert version is None or 0 <= version < 2**63
