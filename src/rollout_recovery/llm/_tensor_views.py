"""A safetensors file's tensors as views of its bytes: checked as safetensors checks, no copy.

Why: a resume loads the trainer's state from a checkpoint's bytes (SmolLM2-135M: 1.6 GB
of weights and AdamW moments). ``safetensors.torch.load`` copies every tensor out of
them into fresh memory, and the trainer then copies each once more (into its parameters;
the moments into memory AdamW may write), so every byte was copied twice and the kernel
mapped 1.6 GB of fresh pages for the first copy alone. A view costs nothing: the trainer's
own copy is the only one.

The views alias the bytes given: read them, never write them (the bytes are immutable),
and copy what must outlive them or be written. Whatever ``safetensors`` refuses is refused
here too (:class:`InvalidStateError`): a header that is not a JSON object of entries with
exactly ``dtype``, ``shape`` and ``data_offsets``, an unknown dtype, a size that does not fit
the shape, or data that does not cover the buffer exactly, entry after entry.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..errors import InvalidStateError

__all__ = ["tensor_views"]

# safetensors' dtype names, by what torch calls them.
_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
# The largest header safetensors reads (its own limit): a file claiming more is refused.
_MAX_HEADER_BYTES = 100_000_000
_ENTRY_KEYS = {"dtype", "shape", "data_offsets"}
_MAX_INT64 = 2**63 - 1


def tensor_views(data: bytes, *, where: str) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file ``data`` by name, each a view of ``data``.

    Raises :class:`InvalidStateError` naming ``where`` for anything but a whole, valid file.
    """

    def fail(problem: str) -> InvalidStateError:
        return InvalidStateError(f"unreadable {where}: {problem}", file=where)

    if len(data) < 8:
        raise fail(f"{len(data)} bytes, shorter than the 8-byte header length")
    header_bytes = int.from_bytes(data[:8], "little")
    if header_bytes > min(_MAX_HEADER_BYTES, len(data) - 8):
        raise fail(f"a header of {header_bytes} bytes in a file of {len(data)}")
    try:
        header = json.loads(data[8 : 8 + header_bytes].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise fail(f"the header is not JSON: {error}") from None
    if not isinstance(header, dict):
        raise fail("the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(value, str) for value in metadata.values()
    ):
        raise fail("__metadata__ must map names to strings")
    start = 8 + header_bytes
    entries = sorted(
        ((name, _entry(name, entry, fail)) for name, entry in header.items()),
        key=lambda item: item[1][2],
    )
    end = 0
    for name, (_, _, begin, stop) in entries:
        if begin != end:
            raise fail(f"{name!r} starts at byte {begin} of the data, expected {end}")
        end = stop
    if start + end != len(data):
        raise fail(f"the tensors end at byte {start + end} of {len(data)}")
    return {
        name: _view(data, dtype, shape, start + begin) for name, (dtype, shape, begin, _) in entries
    }


def _entry(
    name: str, entry: Any, fail: Callable[[str], InvalidStateError]
) -> tuple[torch.dtype, list[int], int, int]:
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        raise fail(f"{name!r} must have exactly {sorted(_ENTRY_KEYS)}")
    dtype = _DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise fail(f"{name!r} has an unknown dtype {entry['dtype']!r}")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(_natural(n) for n in shape):
        raise fail(f"{name!r} has a bad shape {shape!r}")
    if math.prod(max(n, 1) for n in shape) > _MAX_INT64:
        # torch's sizes and strides are int64: an empty tensor of such a shape would pass
        # the size check (0 bytes) and then fail in torch with a TypeError or
        # RuntimeError, which the checkpoint search does not pass over.
        raise fail(f"{name!r} has a shape {shape!r} beyond torch's 64-bit sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_natural, offsets))):
        raise fail(f"{name!r} has bad data_offsets {offsets!r}")
    begin, stop = offsets
    size = math.prod(shape) * dtype.itemsize
    if stop - begin != size:
        raise fail(f"{name!r} holds {stop - begin} bytes, its dtype and shape {size}")
    return dtype, shape, begin, stop


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _view(data: bytes, dtype: torch.dtype, shape: list[int], offset: int) -> torch.Tensor:
    count = math.prod(shape)
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    if offset % dtype.itemsize:
        # Unaligned (a header not padded as safetensors pads it): a copy, aligned.
        piece = bytearray(data[offset : offset + count * dtype.itemsize])
        return torch.frombuffer(piece, dtype=dtype).reshape(shape)
    with warnings.catch_warnings():
        # torch warns that the bytes are read-only: the caller's contract (see the module).
        warnings.simplefilter("ignore", UserWarning)
        view = torch.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return view.reshape(shape)
