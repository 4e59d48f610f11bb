"""Row validation and the compact stored form every backend shares.

A stored row is five byte strings: a tiny msgspec-encoded layout (format version, dtype and
shape of each array), the raw little-endian bytes of the three arrays, and the
msgspec-encoded metadata. Nothing is pickled, so reading a hostile row can fail but never
runs code. The memory backend keeps rows in this same form, which gives both backends the
same copy-on-put/copy-on-get and metadata round-trip semantics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec
import numpy as np

from .._bounds import MAX_PLAIN_DEPTH
from .._checks import check_key, check_keys_argument, check_partition, is_utf8_text
from .._cut import MutationCut
from ..errors import InvalidRowError, MissingRowError
from ._protocol import Row

__all__ = [
    "EncodedRow",
    "check_clear_arguments",
    "check_key",
    "check_keys_argument",
    "check_mutation",
    "check_partition",
    "check_stored",
    "decode_row",
    "encode_row",
    "rows_in_order",
]

_FORMAT_VERSION = 1
# Stored dtypes are fixed little-endian so a store file means the same on every host.
_FIELDS: tuple[tuple[str, np.dtype[Any]], ...] = (
    ("token_ids", np.dtype("<i4")),
    ("token_mask", np.dtype("<f4")),
    ("logprobs", np.dtype("<f4")),
)
_NATIVE = {
    "token_ids": np.dtype(np.int32),
    "token_mask": np.dtype(np.float32),
    "logprobs": np.dtype(np.float32),
}


class _ArrayLayout(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    dtype: str
    shape: tuple[int, ...]


class _RowLayout(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    version: int
    token_ids: _ArrayLayout
    token_mask: _ArrayLayout
    logprobs: _ArrayLayout


class _ExtensionInMetadata(Exception):
    pass


def _refuse_extension(code: int, data: memoryview) -> Any:
    # Extension types decode to objects that are not JSON-like metadata.
    raise _ExtensionInMetadata(f"MessagePack extension type {code} is not row metadata")


_layout_decoder = msgspec.msgpack.Decoder(_RowLayout, ext_hook=_refuse_extension)
_metadata_decoder = msgspec.msgpack.Decoder(dict[str, Any], ext_hook=_refuse_extension)
# Besides DecodeError, corrupt bytes can raise these from inside msgspec (a flipped byte in
# a string is a UnicodeDecodeError; hostile nesting a RecursionError).
_CORRUPT = (msgspec.DecodeError, ValueError, RecursionError, _ExtensionInMetadata)
_encoder = msgspec.msgpack.Encoder()


class EncodedRow(NamedTuple):
    """A row in stored form. Array fields may be memoryviews of the caller's arrays until
    :meth:`owned` copies them, so a backend that keeps them must call it."""

    layout: bytes
    token_ids: bytes | memoryview
    token_mask: bytes | memoryview
    logprobs: bytes | memoryview
    metadata: bytes

    def owned(self) -> EncodedRow:
        return EncodedRow(
            self.layout,
            bytes(self.token_ids),
            bytes(self.token_mask),
            bytes(self.logprobs),
            self.metadata,
        )


def check_clear_arguments(
    partition: str, keys: Iterable[str], cut: MutationCut | None
) -> list[str]:
    """A ``clear``'s arguments in every backend's order: the cut, the partition, the keys."""
    check_mutation(partition, cut)
    return check_keys_argument(keys, operation="clear")


def check_mutation(partition: str, cut: MutationCut | None) -> None:
    """The first checks of every mutation (put, clear), in every backend's order."""
    if cut is not None:
        cut.require_live()
    check_partition(partition)


def rows_in_order(
    partition: str, wanted: Sequence[str], found: Mapping[str, EncodedRow]
) -> list[Row]:
    """A ``get``'s result: decoded rows in ``wanted`` order, or one ``MissingRowError``
    naming every absent key once."""
    missing = [key for key in dict.fromkeys(wanted) if key not in found]
    if missing:
        raise MissingRowError(partition, missing)
    return [decode_row(key, found[key]) for key in wanted]


def _check_json_like(value: object, path: str, key: str, depth: int = 0) -> None:
    # Exact types on purpose: numpy scalars subclass float but are not JSON-like, and
    # accepting them would make the stored form depend on msgspec's extension handling.
    kind = type(value)
    if kind is str:
        if not is_utf8_text(value):  # type: ignore[arg-type]
            raise InvalidRowError(
                f"row {key!r}: {path} is a string with lone surrogates, which UTF-8 cannot carry",
                key=key,
                field=path,
            )
        return
    if value is None or kind in (int, float, bool):
        return
    if kind in (list, tuple, dict) and depth >= MAX_PLAIN_DEPTH:
        # The bound receipts have; it also turns a self-referencing value into this error.
        raise InvalidRowError(
            f"row {key!r}: {path} is nested deeper than {MAX_PLAIN_DEPTH} levels (or refers "
            "to itself)",
            key=key,
            field=path,
        )
    if isinstance(value, list | tuple) and kind in (list, tuple):
        for index, item in enumerate(value):
            _check_json_like(item, f"{path}[{index}]", key, depth + 1)
        return
    if isinstance(value, dict) and kind is dict:
        for name, item in value.items():
            if type(name) is not str or not is_utf8_text(name):
                raise InvalidRowError(
                    f"row {key!r}: {path} has a key {name!r} of type {type(name).__name__}; "
                    "metadata dict keys must be str (UTF-8 encodable)",
                    key=key,
                    field=path,
                )
            _check_json_like(item, f"{path}[{name!r}]", key, depth + 1)
        return
    raise InvalidRowError(
        f"row {key!r}: {path} is {value!r} of type {kind.__name__}; metadata holds only "
        "str, int, float, bool, None, lists and dicts of those",
        key=key,
        field=path,
    )


def _array_bytes(key: str, name: str, value: object, stored: np.dtype[Any]) -> memoryview:
    expected = _NATIVE[name]
    if not isinstance(value, np.ndarray):
        raise InvalidRowError(
            f"row {key!r}: {name} must be a numpy array of {expected}, got {type(value).__name__}",
            key=key,
            field=name,
        )
    if value.dtype != expected or value.ndim != 1:
        raise InvalidRowError(
            f"row {key!r}: {name} must be a 1-D {expected} array, got a {value.ndim}-D "
            f"{value.dtype} array",
            key=key,
            field=name,
        )
    # No copy on little-endian hosts with contiguous input; the backend copies when it
    # keeps the bytes (SQLite copies on bind, the memory store calls EncodedRow.owned()).
    flat = np.ascontiguousarray(value.astype(stored, copy=False))
    return flat.data.cast("B")


def encode_row(key: str, row: object) -> EncodedRow:
    """Validate ``row`` and return its stored form; raises :class:`InvalidRowError`."""
    if not isinstance(row, Row):
        raise InvalidRowError(f"row {key!r}: expected a Row, got {type(row).__name__}", key=key)
    buffers = [_array_bytes(key, name, getattr(row, name), stored) for name, stored in _FIELDS]
    metadata = row.metadata
    if not isinstance(metadata, Mapping):
        raise InvalidRowError(
            f"row {key!r}: metadata must be a dict, got {type(metadata).__name__}",
            key=key,
            field="metadata",
        )
    _check_json_like(dict(metadata), "metadata", key)
    try:
        metadata_bytes = _encoder.encode(dict(metadata))
    except (msgspec.EncodeError, OverflowError) as exc:
        # Ints beyond 64 bits are the one JSON-like value MessagePack cannot hold.
        raise InvalidRowError(
            f"row {key!r}: metadata cannot be encoded: {exc}", key=key, field="metadata"
        ) from None
    layout = _RowLayout(
        _FORMAT_VERSION,
        *(
            _ArrayLayout(stored.str, (len(buf) // stored.itemsize,))
            for buf, (_, stored) in zip(buffers, _FIELDS, strict=True)
        ),
    )
    return EncodedRow(_encoder.encode(layout), buffers[0], buffers[1], buffers[2], metadata_bytes)


def _stored_error(key: str, message: str, field: str | None = None) -> InvalidRowError:
    return InvalidRowError(f"stored row {key!r} is corrupt: {message}", key=key, field=field)


def _decode_layout(key: str, layout: bytes) -> _RowLayout:
    try:
        decoded = _layout_decoder.decode(layout)
    except _CORRUPT as exc:
        raise _stored_error(key, f"layout: {exc}", "layout") from None
    if decoded.version != _FORMAT_VERSION:
        raise _stored_error(
            key,
            f"layout version {decoded.version}, this reader knows {_FORMAT_VERSION}",
            "layout",
        )
    return decoded


def _check_arrays(key: str, layout: bytes, lengths: Sequence[int]) -> None:
    decoded = _decode_layout(key, layout)
    for (name, stored), size in zip(_FIELDS, lengths, strict=True):
        array_layout: _ArrayLayout = getattr(decoded, name)
        if array_layout.dtype != stored.str or len(array_layout.shape) != 1:
            raise _stored_error(
                key,
                f"{name} is declared {array_layout.dtype}{list(array_layout.shape)}, "
                f"expected 1-D {stored.str}",
                name,
            )
        if array_layout.shape[0] * stored.itemsize != size:
            raise _stored_error(
                key,
                f"{name} holds {size} bytes, its layout declares "
                f"{array_layout.shape[0]} x {stored.itemsize}",
                name,
            )


def _decode_metadata(key: str, metadata: bytes) -> dict[str, Any]:
    try:
        decoded = _metadata_decoder.decode(metadata)
    except _CORRUPT as exc:
        raise _stored_error(key, f"metadata: {exc}", "metadata") from None
    # msgspec decodes the timestamp extension to datetime without the ext hook; metadata
    # holds only JSON-like values, so a datetime here means corrupt or foreign bytes.
    if msgspec.to_builtins(decoded) != decoded:
        raise _stored_error(key, "metadata holds a MessagePack timestamp", "metadata")
    return decoded


def check_stored(key: str, layout: bytes, lengths: Sequence[int], metadata: bytes) -> None:
    """Check a stored row without materializing its arrays (used on restore).

    ``lengths`` are the byte lengths of the three array blobs.
    """
    _check_arrays(key, layout, lengths)
    _decode_metadata(key, metadata)


def decode_row(key: str, stored: EncodedRow) -> Row:
    """Rebuild a :class:`Row` with freshly allocated, writable arrays."""
    blobs = (stored.token_ids, stored.token_mask, stored.logprobs)
    _check_arrays(key, stored.layout, [len(blob) for blob in blobs])
    # astype() always copies here, so the caller owns writable native-order arrays.
    ids = np.frombuffer(stored.token_ids, dtype="<i4").astype(np.int32)
    mask = np.frombuffer(stored.token_mask, dtype="<f4").astype(np.float32)
    logprobs = np.frombuffer(stored.logprobs, dtype="<f4").astype(np.float32)
    return Row(
        token_ids=ids,
        token_mask=mask,
        logprobs=logprobs,
        metadata=_decode_metadata(key, stored.metadata),
    )
