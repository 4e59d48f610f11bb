"""Read and write NeMo-RL's ``rollout_recovery.pt`` without importing torch.

Upstream saves the recovery sidecar with ``torch.save(state_dict)`` and reads it back with
``torch.load(..., weights_only=True)``. The sidecar is a tree of primitives (str, int, float,
bool, None, bytes, lists, dicts keyed by str or int), so the torch "zip" container reduces to:

* a ZIP archive whose members all sit under one top-level folder (its name varies: torch
  uses the file's stem when saving to a path and ``archive`` when saving to a buffer);
* ``<folder>/data.pkl``: a pickle, protocol 2, of the object tree;
* small text records: ``version``, ``byteorder``, ``.format_version``, ``.storage_alignment``
  and ``.data/serialization_id``; only tensors would add ``data/<n>`` storage members.

Reading never executes code from the file. ``data.pkl`` is first scanned opcode by opcode
against an allowlist (so no object-building or persistent-id opcode and no memo index that
would make the C unpickler allocate gigabytes can reach it), then unpickled by a subclass of
:class:`pickle.Unpickler` whose ``find_class`` admits only the two constructors protocol 2
uses for ``bytes`` (with their arguments checked) and whose ``persistent_load`` refuses every
tensor storage, and finally the result is walked to prove it is a bounded tree of primitives.

Writing emits the same container and a protocol-2 pickle opcode by opcode, restricted to
opcodes ``torch.load(weights_only=True)`` understands, and is deterministic: the same state
gives the same bytes, so the SHA-256 advertised in checkpoint metadata is reproducible.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import struct
import zipfile
from collections.abc import Callable
from typing import Any, Final, NoReturn

from .._bounds import MAX_PLAIN_DEPTH, RECEIPT_DEPTH_IN_SIDECAR
from .._checks import is_utf8_text
from .._durable import atomic_write_bytes
from .._gc import paused_gc
from ..errors import (
    InvalidArgumentError,
    InvalidStateError,
    InvalidStateTypeError,
    SidecarFormatError,
)
from ._regular_file import open_regular_file

__all__ = [
    "ADMITTED_GLOBALS",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_FILE_BYTES",
    "check_primitive_tree",
    "decode_torch_pt",
    "encode_torch_pt",
    "looks_like_torch_zip",
    "read_torch_pt",
    "write_torch_pt",
]

# A sidecar for tens of thousands of groups is tens of MB; a cap well above that keeps a
# hostile or corrupted file from making the reader hold gigabytes.
DEFAULT_MAX_FILE_BYTES: Final = 256 * 1024 * 1024
# A receipt sits 7 levels below the root (groups -> group -> siblings -> sibling -> attempts
# -> attempt) and may itself be MAX_PLAIN_DEPTH deep, the bound a seal and the native loader
# apply: this cap admits exactly those receipts, so every path has the same limit. It also
# keeps every later recursive consumer (==, msgspec, deepcopy) far from the interpreter's
# recursion limit, and turns a self-referencing pickle into an error.
DEFAULT_MAX_DEPTH: Final = MAX_PLAIN_DEPTH + RECEIPT_DEPTH_IN_SIDECAR
# torch writes six members for a tensor-free object; a generous cap bounds the work spent on
# a central directory before the file is refused.
_MAX_MEMBERS: Final = 1024
# A tree with no shared containers has at most one node per pickle byte; shared containers
# (memo references) can expand further, which is legitimate in moderation but is also how a
# few hundred bytes describe 2**60 nodes. This factor admits the former, refuses the latter.
_NODE_BUDGET_PER_BYTE: Final = 8
_NODE_BUDGET_FLOOR: Final = 4096

_ZIP_MAGIC: Final = b"PK\x03\x04"
_DEFAULT_ARCHIVE_NAME: Final = "archive"
# The records torch 2.x writes next to data.pkl, in its order, with its values (file format
# version 3, no storages, so alignment and byte order are inert but kept for fidelity).
_FORMAT_VERSION: Final = b"1"
_STORAGE_ALIGNMENT: Final = b"64"
_BYTEORDER: Final = b"little"
_VERSION: Final = b"3\n"
# Fixed timestamp: the archive bytes must be a pure function of the state.
_ZIP_EPOCH: Final = (1980, 1, 1, 0, 0, 0)

# The only globals a primitives-only protocol-2 pickle contains, both emitted for ``bytes``:
# ``_codecs.encode(text, "latin1")`` for non-empty bytes and ``bytes()`` (spelled with the
# Python 2 module name ``__builtin__`` because protocol 2 pickles with fix_imports) for b"".
ADMITTED_GLOBALS: Final = frozenset({"_codecs.encode", "__builtin__.bytes", "builtins.bytes"})


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class _PathError(Exception):
    """Internal: a problem found while walking, with the path assembled while unwinding.

    Building a path string per node would tax the happy path; prepending keys only when an
    error propagates costs nothing until something is wrong.
    """

    def __init__(self, message: str, *, as_type_error: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.as_type_error = as_type_error
        self.parts: list[str] = []

    def at(self, key: object) -> _PathError:
        self.parts.append(f".{key}" if type(key) is str and key.isidentifier() else f"[{key!r}]")
        return self

    def path(self) -> str:
        return "$" + "".join(reversed(self.parts))


def _fail(message: str) -> NoReturn:
    raise SidecarFormatError(f"rollout_recovery.pt: {message}")


# --------------------------------------------------------------------------------------------
# Detection
# --------------------------------------------------------------------------------------------


def looks_like_torch_zip(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` looks like a ``torch.save`` zip archive (never raises).

    True when the bytes start with a ZIP local-file header and the archive has a
    ``<folder>/data.pkl`` member under the folder of its first member, which is how torch's
    own reader finds the pickle. Judged on content only, so a file's name never matters.
    A True answer is a format guess, not validation: :func:`decode_torch_pt` still checks
    everything.
    """
    try:
        if bytes(memoryview(data)[:4]) != _ZIP_MAGIC:
            return False
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            if not infos:
                return False
            folder = infos[0].filename.partition("/")[0]
            return any(info.filename == f"{folder}/data.pkl" for info in infos)
    except Exception:  # any parse failure of untrusted bytes simply means "not this format"
        return False


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def read_torch_pt(
    path: str | os.PathLike[str],
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> dict[Any, Any]:
    """Read a ``torch.save``'d primitives-only dict from ``path`` without torch.

    Raises :class:`SidecarFormatError` (as ``load_sidecar`` and ``decode_sidecar`` do) for
    anything but such a file (including one larger than ``max_file_bytes``); ``OSError``
    when the file cannot be opened or read.
    """
    with open_regular_file(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > max_file_bytes:
            _fail(f"file is {size} bytes, over the {max_file_bytes}-byte limit")
        # Read one byte past the cap so a file that grows (or a device) is still bounded.
        data = handle.read(max_file_bytes + 1)
    return decode_torch_pt(data, max_file_bytes=max_file_bytes, max_depth=max_depth)


def decode_torch_pt(
    data: bytes | bytearray | memoryview,
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> dict[Any, Any]:
    """Decode the bytes of a ``torch.save``'d primitives-only dict without torch.

    The result is a fresh tree of ``dict`` (str or int keys), ``list``, ``str``, ``int``,
    ``float``, ``bool``, ``None`` and ``bytes``, equal to what
    ``torch.load(..., weights_only=True)`` returns for the same file. Raises
    :class:`InvalidStateError` for a malformed, truncated, oversized or hostile file, for a
    pickle global other than :data:`ADMITTED_GLOBALS` (naming it), for tensor storages, and
    for a tree deeper than ``max_depth`` or larger than its pickle justifies.
    """
    size = memoryview(data).nbytes
    if size > max_file_bytes:
        _fail(f"file is {size} bytes, over the {max_file_bytes}-byte limit")
    pickle_bytes = _extract_data_pkl(bytes(data))
    _scan_pickle(pickle_bytes)
    result = _unpickle(pickle_bytes)
    if type(result) is not dict:
        _fail(f"top-level object is {type(result).__name__}, expected dict")
    budget = _NODE_BUDGET_PER_BYTE * len(pickle_bytes) + _NODE_BUDGET_FLOOR
    try:
        _Walker(max_depth=max_depth, budget=budget).walk(result, 0)
    except _PathError as error:
        raise SidecarFormatError(
            f"rollout_recovery.pt: {error.message}", path=error.path()
        ) from None
    return result


def check_primitive_tree(tree: object, *, what: str, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    """Refuse ``tree`` unless it is a bounded tree of sidecar primitives, as this reader
    proves of every ``.pt``; for a tree another decoder built (an untyped MessagePack
    payload, which turns a timestamp into a ``datetime``). Raises
    :class:`InvalidStateError` whose ``path`` names the first offending value."""
    try:
        # A decoded tree shares no subtree, so the budget only bounds what exists anyway.
        _Walker(max_depth=max_depth, budget=1 << 62).walk(tree, 0)
    except _PathError as error:
        raise InvalidStateError(f"{what}: {error.message}", path=error.path()) from None


# Exceptions zipfile raises on malformed archives (found by the mutation fuzz tests).
_ZIP_ERRORS: Final = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    EOFError,
    OSError,
    ValueError,
    KeyError,
    IndexError,
    OverflowError,
    NotImplementedError,
    struct.error,
)


def _extract_data_pkl(data: bytes) -> bytes:
    """Validate the container and return the bytes of its ``data.pkl`` member."""
    if data[:4] != _ZIP_MAGIC:
        _fail("not a torch zip archive (no ZIP local-file header at offset 0)")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            if not infos:
                _fail("zip archive is empty")
            if len(infos) > _MAX_MEMBERS:
                _fail(f"zip archive has {len(infos)} members, over the limit of {_MAX_MEMBERS}")
            by_name: dict[str, zipfile.ZipInfo] = {}
            for info in infos:
                if info.filename in by_name:
                    # Which duplicate a reader picks is implementation-defined: refuse.
                    _fail(f"zip archive has member {info.filename!r} twice")
                by_name[info.filename] = info
            folder = infos[0].filename.partition("/")[0]
            for info in infos:
                if info.filename.startswith(f"{folder}/data/"):
                    _fail(
                        f"archive holds tensor storage {info.filename!r}; a recovery sidecar "
                        "holds primitives only"
                    )

            def member(name: str, *, limit: int) -> bytes | None:
                info = by_name.get(f"{folder}/{name}")
                if info is None:
                    return None
                # torch never compresses; a stored member cannot expand, so the declared
                # size is bounded by the file and there is no decompression bomb to defuse.
                if info.compress_type != zipfile.ZIP_STORED:
                    _fail(f"member {info.filename!r} is compressed; torch writes stored members")
                if info.flag_bits & 0x1:
                    _fail(f"member {info.filename!r} is encrypted")
                if info.file_size != info.compress_size or info.file_size > min(limit, len(data)):
                    _fail(f"member {info.filename!r} declares an impossible size")
                content = archive.read(info)  # checks the CRC-32
                if len(content) != info.file_size:
                    _fail(f"member {info.filename!r} is truncated")
                return content

            pickle_bytes = member("data.pkl", limit=len(data))
            if pickle_bytes is None:
                _fail(f"zip archive has no {folder}/data.pkl member")
            version = member("version", limit=64)
            if version is None:
                version = member(".data/version", limit=64)
            if version is None or not version.strip().isdigit():
                _fail("zip archive has no valid torch 'version' record")
            byteorder = member("byteorder", limit=64)
            if byteorder is not None and byteorder not in (b"little", b"big"):
                _fail(f"unknown byteorder record {byteorder[:16]!r}")
            return pickle_bytes
    except InvalidStateError:
        raise
    except _ZIP_ERRORS as error:
        raise SidecarFormatError(f"rollout_recovery.pt: malformed zip archive: {error}") from None


# Opcode argument shapes for the scanner. Each admitted opcode is one that protocol 2 emits
# for a tree of primitives *and* that torch's weights-only unpickler implements, so this
# reader accepts exactly the files upstream can read back, and nothing else.
_FIXED: Final = 0  # fixed-size argument of _ARG_SIZE[op] bytes
_LEN4: Final = 1  # 4-byte little-endian length, then that many bytes
_LEN1: Final = 2  # 1-byte length, then that many bytes
_LINES2: Final = 3  # two newline-terminated lines (GLOBAL module and name)
_PUT1: Final = 4  # 1-byte memo index to store into
_PUT4: Final = 5  # 4-byte memo index to store into
_PROTO: Final = 6
_STOP: Final = 7

_SCAN_TABLE: Final[dict[int, tuple[int, int]]] = {
    op[0]: shape
    for op, shape in {
        pickle.PROTO: (_PROTO, 1),
        pickle.STOP: (_STOP, 0),
        pickle.MARK: (_FIXED, 0),
        pickle.NONE: (_FIXED, 0),
        pickle.NEWTRUE: (_FIXED, 0),
        pickle.NEWFALSE: (_FIXED, 0),
        pickle.BININT: (_FIXED, 4),
        pickle.BININT1: (_FIXED, 1),
        pickle.BININT2: (_FIXED, 2),
        pickle.LONG1: (_LEN1, 0),
        pickle.BINFLOAT: (_FIXED, 8),
        pickle.BINUNICODE: (_LEN4, 0),
        pickle.EMPTY_LIST: (_FIXED, 0),
        pickle.APPEND: (_FIXED, 0),
        pickle.APPENDS: (_FIXED, 0),
        pickle.EMPTY_DICT: (_FIXED, 0),
        pickle.SETITEM: (_FIXED, 0),
        pickle.SETITEMS: (_FIXED, 0),
        pickle.EMPTY_TUPLE: (_FIXED, 0),
        pickle.TUPLE: (_FIXED, 0),
        pickle.TUPLE1: (_FIXED, 0),
        pickle.TUPLE2: (_FIXED, 0),
        pickle.TUPLE3: (_FIXED, 0),
        pickle.GLOBAL: (_LINES2, 0),
        pickle.REDUCE: (_FIXED, 0),
        pickle.BINGET: (_FIXED, 1),
        pickle.LONG_BINGET: (_FIXED, 4),
        pickle.BINPUT: (_PUT1, 1),
        pickle.LONG_BINPUT: (_PUT4, 4),
    }.items()
}

_OPCODE_NAMES: Final = {
    value[0]: name
    for name, value in vars(pickle).items()
    if name.isupper() and isinstance(value, bytes) and len(value) == 1
}

# The same table as two flat lists indexed by opcode byte: list indexing is the cheapest
# lookup in the scanner's per-opcode loop. Kind -1 marks a refused opcode.
_SCAN_KINDS: Final = [_SCAN_TABLE.get(op, (-1, 0))[0] for op in range(256)]
_SCAN_SIZES: Final = [_SCAN_TABLE.get(op, (-1, 0))[1] for op in range(256)]


def _scan_pickle(pickle_bytes: bytes) -> None:
    """Refuse a pickle before any of it runs unless every opcode is on the allowlist.

    Besides the allowlist this bounds memo indices: CPython's C unpickler sizes its memo
    array from the largest index it is told to store, so six bytes (``LONG_BINPUT
    0x3fffffff``) would otherwise allocate and zero 16 GB. A writer numbers memo slots
    0, 1, 2, ... so an index above the number of stores so far is never legitimate.
    """
    data = pickle_bytes
    end = len(data)
    if data[:2] != b"\x80\x02":
        _fail("data.pkl is not a protocol-2 pickle (torch.save writes protocol 2)")
    kinds = _SCAN_KINDS
    sizes = _SCAN_SIZES
    position = 2
    stores = 0
    while position < end:
        opcode = data[position]
        position += 1
        kind = kinds[opcode]
        if kind == _FIXED:
            position += sizes[opcode]
        elif kind < 0:
            name = _OPCODE_NAMES.get(opcode, f"0x{opcode:02x}")
            if opcode in (pickle.PERSID[0], pickle.BINPERSID[0]):
                _fail("data.pkl references a persistent id (tensor storage); refused")
            _fail(f"data.pkl uses pickle opcode {name} at offset {position - 1}; refused")
        elif kind == _LEN4:
            position += 4 + int.from_bytes(data[position : position + 4], "little")
        elif kind == _LEN1:
            position += 1 + (data[position] if position < end else 0)
        elif kind in (_PUT1, _PUT4):
            size = sizes[opcode]
            index = int.from_bytes(data[position : position + size], "little")
            if index > stores:
                _fail(f"data.pkl stores memo slot {index} after only {stores} stores; refused")
            stores += 1
            position += size
        elif kind == _LINES2:
            module_end = data.find(b"\n", position, position + 256)
            name_end = data.find(b"\n", module_end + 1, module_end + 257)
            if module_end < 0 or name_end < 0:
                _fail("data.pkl has a malformed GLOBAL opcode")
            qualified = (
                data[position:module_end].decode("ascii", "replace")
                + "."
                + data[module_end + 1 : name_end].decode("ascii", "replace")
            )
            if qualified not in ADMITTED_GLOBALS:
                _fail(_refused_global_message(qualified))
            position = name_end + 1
        elif kind == _STOP:
            if position != end:
                _fail(f"data.pkl has {end - position} bytes after STOP")
            return
        else:  # _PROTO: a second PROTO mid-stream is legal pickle but never written
            _fail("data.pkl repeats the PROTO opcode")
    _fail("data.pkl is truncated (no STOP opcode)")


def _refused_global_message(qualified: str) -> str:
    return (
        f"data.pkl imports global {qualified!r}, which is not admitted; only "
        f"{', '.join(sorted(ADMITTED_GLOBALS))} (used for bytes values) may appear"
    )


def _bytes_from_latin1(*args: object) -> bytes:
    # Protocol 2 spells a bytes value b as _codecs.encode(b.decode("latin1"), "latin1"). Only
    # that exact call is honoured: the output is never larger than the input text.
    if len(args) != 2 or type(args[0]) is not str or args[1] != "latin1":
        _fail("data.pkl calls _codecs.encode with arguments other than (str, 'latin1')")
    text: str = args[0]
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        _fail("data.pkl calls _codecs.encode on text that is not latin-1")


def _empty_bytes(*args: object) -> bytes:
    # Protocol 2 spells b"" as bytes(). bytes(n) would allocate n bytes, so no argument is
    # accepted at all.
    if args:
        _fail("data.pkl calls bytes() with arguments; only bytes() for b'' is admitted")
    return b""


_GLOBAL_FACTORIES: Final[dict[tuple[str, str], Callable[..., bytes]]] = {
    ("_codecs", "encode"): _bytes_from_latin1,
    ("__builtin__", "bytes"): _empty_bytes,
    ("builtins", "bytes"): _empty_bytes,
}


class _SidecarUnpickler(pickle.Unpickler):
    """The C unpickler, able to resolve only the admitted globals and no persistent id."""

    def find_class(self, module: str, name: str, /) -> Any:
        factory = _GLOBAL_FACTORIES.get((module, name))
        if factory is None:
            _fail(_refused_global_message(f"{module}.{name}"))
        return factory

    def persistent_load(self, pid: Any, /) -> NoReturn:
        _fail("data.pkl references a persistent id (tensor storage); refused")


def _unpickle(pickle_bytes: bytes) -> Any:
    # Building a million fresh containers triggers the cyclic collector over and over (it
    # tripled the load time of a 5,000-group sidecar); the result is a tree, so pausing the
    # collector for the duration loses nothing. Restored even if loading fails.
    try:
        with paused_gc():
            return _SidecarUnpickler(io.BytesIO(pickle_bytes)).load()
    except InvalidStateError:
        raise
    except Exception as error:
        # The scanner already proved the opcode stream well-formed in shape; whatever the
        # unpickler still objects to (a stack underflow, REDUCE on a non-callable, a GET of an
        # unset slot, ...) means the file is not a valid sidecar. Python documents that
        # unpickling may raise arbitrary exception types, hence the broad catch.
        raise SidecarFormatError(
            f"rollout_recovery.pt: data.pkl does not unpickle: {type(error).__name__}: {error}"
        ) from None


_LEAF_TYPES: Final = frozenset({str, int, float, bool, type(None), bytes})


# A pickle can carry lone surrogates (BINUNICODE is written with "surrogatepass"); every
# other reader and writer of a sidecar's strings cannot, so they are refused on the way in.
_NOT_UTF8: Final = "a string with lone surrogates, which UTF-8 cannot carry"


class _Walker:
    """Proves an unpickled object is a bounded tree of primitives."""

    __slots__ = ("budget", "max_depth")

    def __init__(self, *, max_depth: int, budget: int) -> None:
        self.max_depth = max_depth
        self.budget = budget

    def walk(self, node: object, depth: int) -> None:
        if depth >= self.max_depth:
            raise _PathError(f"nested deeper than {self.max_depth} levels (or self-referencing)")
        leaf_types = _LEAF_TYPES
        if type(node) is dict:
            self.budget -= len(node)
            if self.budget < 0:
                raise _PathError("expands to more nodes than its size allows (shared subtrees)")
            for key, value in node.items():
                if type(key) is str:
                    if not key.isascii() and not is_utf8_text(key):
                        raise _PathError(f"dict key {key!r}: {_NOT_UTF8}")
                elif type(key) is not int:
                    raise _PathError(f"dict key of type {type(key).__name__}; only str or int")
                if type(value) is str:
                    if not value.isascii() and not is_utf8_text(value):
                        raise _PathError(_NOT_UTF8).at(key)
                elif type(value) not in leaf_types:
                    try:
                        self.walk(value, depth + 1)
                    except _PathError as error:
                        raise error.at(key) from None
        elif type(node) is list:
            self.budget -= len(node)
            if self.budget < 0:
                raise _PathError("expands to more nodes than its size allows (shared subtrees)")
            for index, value in enumerate(node):
                if type(value) is str:
                    if not value.isascii() and not is_utf8_text(value):
                        raise _PathError(_NOT_UTF8).at(index)
                elif type(value) not in leaf_types:
                    try:
                        self.walk(value, depth + 1)
                    except _PathError as error:
                        raise error.at(index) from None
        elif type(node) not in leaf_types:
            raise _PathError(f"value of type {type(node).__name__} is not a sidecar primitive")


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def write_torch_pt(
    path: str | os.PathLike[str],
    state: dict[Any, Any],
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> None:
    """Atomically write ``state`` to ``path`` as a file ``torch.load`` reads back.

    The bytes go to a temporary file in the same directory, are fsynced, and replace
    ``path`` in one rename, after which the directory is fsynced: a crash leaves either the
    old file or the new one, never a torn sidecar. Raises like :func:`encode_torch_pt`.
    """
    atomic_write_bytes(path, encode_torch_pt(state, max_depth=max_depth))


def encode_torch_pt(
    state: dict[Any, Any],
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    archive_name: str = _DEFAULT_ARCHIVE_NAME,
) -> bytes:
    """Encode a primitives-only dict as the bytes ``torch.save(state, buffer)`` would hold.

    ``torch.load(..., weights_only=True)`` reads the result back to an equal dict (bytes as
    bytes, int keys as ints). Deterministic. Accepts exactly ``dict`` and ``list``
    containers, dict keys of type ``str`` or ``int``, and leaves of type ``str``, ``int``,
    ``float``, ``bool``, ``None`` and ``bytes`` (subclasses such as enums are refused, since
    torch's loader could not rebuild them). Raises :class:`InvalidStateTypeError` for another
    type and :class:`InvalidStateError` for a tree deeper than ``max_depth`` or an integer
    wider than the 255 bytes torch's loader decodes; ``path`` locates the offending value.
    """
    if type(state) is not dict:
        raise InvalidStateTypeError(
            f"rollout_recovery.pt: top-level state must be a dict, not {type(state).__name__}",
            path="$",
        )
    if not archive_name or "/" in archive_name or not archive_name.isprintable():
        raise InvalidArgumentError(f"invalid archive name {archive_name!r}")
    emitter = _Emitter(max_depth)
    try:
        emitter.emit(state, 0)
    except _PathError as error:
        error_type = InvalidStateTypeError if error.as_type_error else InvalidStateError
        raise error_type(f"rollout_recovery.pt: {error.message}", path=error.path()) from None
    emitter.out += pickle.STOP
    return _zip_records(archive_name, bytes(emitter.out))


def _zip_records(folder: str, pickle_bytes: bytes) -> bytes:
    # Deterministic stand-in for torch's random serialization id: it only names storages,
    # of which a sidecar has none, so any 40-digit value serves.
    serialization_id = str(int.from_bytes(hashlib.sha256(pickle_bytes).digest()[:16], "big"))
    records = (
        ("data.pkl", pickle_bytes),
        (".format_version", _FORMAT_VERSION),
        (".storage_alignment", _STORAGE_ALIGNMENT),
        ("byteorder", _BYTEORDER),
        ("version", _VERSION),
        (".data/serialization_id", serialization_id.zfill(40).encode("ascii")),
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, content in records:
            info = zipfile.ZipInfo(f"{folder}/{name}", date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 0  # not the host's: the bytes must not depend on the OS
            info.external_attr = 0
            archive.writestr(info, content)
    return buffer.getvalue()


_CODECS_ENCODE_GLOBAL: Final = pickle.GLOBAL + b"_codecs\nencode\n"
_LATIN1: Final = "latin1"
# The standard pickler's batch size for APPENDS/SETITEMS; any size is valid.
_BATCH: Final = 1000
_PACK_DOUBLE: Final = struct.Struct(">d").pack
_PACK_U32: Final = struct.Struct("<I").pack
_PACK_I32: Final = struct.Struct("<i").pack
_SMALL_INTS: Final = [pickle.BININT1 + bytes((number,)) for number in range(256)]


class _Emitter:
    """Protocol-2 pickle emitter for primitive trees.

    Strings are memoised by value (dict keys such as ``"status"`` repeat once per attempt,
    and a 2-byte memo reference is far smaller than the text); containers are not, so the
    output is always a tree and the reader's expansion budget is never approached. The memo
    maps each string straight to its ready-made GET opcode, which makes a repeated key one
    dict lookup and one append: the emitter is pure Python and this is its hot path.
    """

    __slots__ = ("codecs_get", "max_depth", "memo", "out", "slots")

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.out = bytearray(pickle.PROTO + b"\x02")
        self.memo: dict[str, bytes] = {}
        self.codecs_get: bytes | None = None
        self.slots = 0

    def _put(self) -> bytes:
        """Store the top of stack in the next slot; return the opcode that fetches it."""
        # Slots are numbered 0, 1, 2, ... as every pickler does (and the reader demands).
        slot = self.slots
        self.slots += 1
        if slot < 256:
            self.out += pickle.BINPUT + bytes((slot,))
            return pickle.BINGET + bytes((slot,))
        self.out += pickle.LONG_BINPUT + _PACK_U32(slot)
        return pickle.LONG_BINGET + _PACK_U32(slot)

    def emit_str(self, text: str) -> None:
        fetch = self.memo.get(text)
        if fetch is not None:
            self.out += fetch
            return
        try:
            encoded = text.encode("utf-8")
        except UnicodeEncodeError:
            raise _PathError(_NOT_UTF8) from None
        self.out += pickle.BINUNICODE + _PACK_U32(len(encoded)) + encoded
        self.memo[text] = self._put()

    def emit_int(self, number: int) -> None:
        out = self.out
        if 0 <= number < 0x100:
            out += _SMALL_INTS[number]
        elif 0 <= number < 0x10000:
            out += pickle.BININT2 + number.to_bytes(2, "little")
        elif -0x80000000 <= number < 0x80000000:
            out += pickle.BININT + _PACK_I32(number)
        else:
            width = (number if number >= 0 else ~number).bit_length() // 8 + 1
            if width > 255:
                # torch's weights-only loader implements LONG1 (<= 255 bytes) but not LONG4.
                raise _PathError(f"integer of {width} bytes is too wide for torch.load")
            out += pickle.LONG1 + bytes((width,)) + number.to_bytes(width, "little", signed=True)

    def emit_bytes(self, blob: bytes) -> None:
        # Always _codecs.encode, even for b"": torch.save's bytes() spelling of b"" is one
        # torch.load(weights_only=True) itself refuses.
        if self.codecs_get is None:
            self.out += _CODECS_ENCODE_GLOBAL
            self.codecs_get = self._put()
        else:
            self.out += self.codecs_get
        encoded = blob.decode("latin-1").encode("utf-8")
        self.out += pickle.BINUNICODE + _PACK_U32(len(encoded)) + encoded
        self.emit_str(_LATIN1)
        self.out += pickle.TUPLE2 + pickle.REDUCE

    def emit(self, node: Any, depth: int) -> None:
        kind = type(node)
        if kind is str:
            self.emit_str(node)
        elif kind is dict:
            self.emit_dict(node, depth)
        elif kind is list:
            self.emit_list(node, depth)
        elif kind is int:
            self.emit_int(node)
        elif kind is bool:
            self.out += pickle.NEWTRUE if node else pickle.NEWFALSE
        elif node is None:
            self.out += pickle.NONE
        elif kind is float:
            self.out += pickle.BINFLOAT + _PACK_DOUBLE(node)
        elif kind is bytes:
            self.emit_bytes(node)
        else:
            raise _PathError(
                f"value of type {kind.__name__} is not a sidecar primitive", as_type_error=True
            )

    def _check_depth(self, depth: int) -> None:
        if depth >= self.max_depth:
            raise _PathError(f"nested deeper than {self.max_depth} levels (or self-referencing)")

    def emit_dict(self, node: dict[Any, Any], depth: int) -> None:
        self._check_depth(depth)
        out = self.out
        memo = self.memo
        emit = self.emit
        small = _SMALL_INTS
        out += pickle.EMPTY_DICT
        items = list(node.items())
        for start in range(0, len(items), _BATCH):
            batch = items[start : start + _BATCH]
            if len(batch) > 1:
                out += pickle.MARK
            for key, value in batch:
                key_type = type(key)
                if key_type is str:
                    fetch = memo.get(key)
                    if fetch is not None:
                        out += fetch
                    else:
                        self.emit_str(key)
                elif key_type is int:
                    self.emit_int(key)
                else:
                    raise _PathError(
                        f"dict key of type {key_type.__name__}; only str or int",
                        as_type_error=True,
                    )
                # The commonest leaves inline: a method call per leaf dominated the profile.
                value_type = type(value)
                if value_type is str and value in memo:
                    out += memo[value]
                elif value is None:
                    out += pickle.NONE
                elif value_type is bool:
                    out += pickle.NEWTRUE if value else pickle.NEWFALSE
                elif value_type is int and 0 <= value < 0x100:
                    out += small[value]
                else:
                    try:
                        emit(value, depth + 1)
                    except _PathError as error:
                        raise error.at(key) from None
            out += pickle.SETITEMS if len(batch) > 1 else pickle.SETITEM

    def emit_list(self, node: list[Any], depth: int) -> None:
        self._check_depth(depth)
        out = self.out
        emit = self.emit
        out += pickle.EMPTY_LIST
        for start in range(0, len(node), _BATCH):
            batch = node[start : start + _BATCH]
            if len(batch) > 1:
                out += pickle.MARK
            for index, value in enumerate(batch, start):
                try:
                    emit(value, depth + 1)
                except _PathError as error:
                    raise error.at(index) from None
            out += pickle.APPENDS if len(batch) > 1 else pickle.APPEND
