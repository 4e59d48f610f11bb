"""The native sidecar file: MessagePack through typed msgspec Structs in a versioned envelope.

Layout of a file::

    MAGIC (15 bytes) | MessagePack map: NativeEnvelope{format, format_version,
                                                       writer_version, checksum, payload}

``payload`` is the MessagePack encoding of the sidecar dict (``build_rollout_recovery_state``
output) and ``checksum`` is ``"sha256:" + hexdigest(payload)``. The magic prefix lets every
reader recognise the format from content alone; its first byte is non-ASCII and it holds a
CR-LF pair and a Ctrl-Z, so text-mode transfers that mangle line ends are detected, as in
PNG's signature.

Reading is layered so each layer only trusts what the previous one proved: the magic; the
envelope, strictly typed with unknown fields refused; the format name and version; the
checksum (a torn, truncated or bit-flipped payload stops here); then the payload, decoded
straight into typed Structs shaped like the schema-3 sidecar, so a type error names its
field path (``$.groups[3].siblings[0].attempts[1].status``) and comes from C, not from a
Python walk. The schema's value rules (enums, invariants) are the ledger's job: see
``_sidecar_io.load_sidecar``. Nothing in a file is ever executed; MessagePack has no code.
"""

from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Iterator, Sequence
from enum import StrEnum
from types import GenericAlias, UnionType
from typing import (
    Any,
    Final,
    Generic,
    Protocol,
    TypeVar,
    Union,
    Unpack,
    cast,
    get_args,
    get_origin,
)

import msgspec

from .. import __version__
from .._messages import split_validation_path
from ..errors import InvalidStateError, InvalidStateTypeError, SidecarFormatError
from ..ledger import ROLLOUT_RECOVERY_SCHEMA_VERSION, RolloutRecoveryLedger
from ..ledger.codec_support import (
    GroupState,
    SidecarFields,
    SidecarLineage,
    checkpoint_parts,
    lineage_mismatches,
)
from ._torch_pt import check_primitive_tree

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAGIC",
    "SUPPORTED_FORMAT_VERSIONS",
    "EncodedGroups",
    "NativeEnvelope",
    "NativeFileParts",
    "decode_native",
    "decode_native_payload",
    "decode_native_payload_for_load",
    "encode_native",
    "encode_native_checkpoint",
    "encode_native_fragments",
    "encode_native_group",
    "encode_native_parts",
    "looks_like_native",
    "read_native_envelope",
]

_T = TypeVar("_T")

MAGIC: Final = b"\x89RRSIDECAR\r\n\x1a\n"
FORMAT_NAME: Final = "rollout-recovery-sidecar"
# Bump when the envelope or the payload encoding changes shape; the sidecar's own
# ``schema_version`` versions the ledger schema inside the payload independently.
FORMAT_VERSION: Final = 1
SUPPORTED_FORMAT_VERSIONS: Final = frozenset({FORMAT_VERSION})
# The same cap as the .pt reader: a sidecar for tens of thousands of groups is tens of MB.
DEFAULT_MAX_FILE_BYTES: Final = 256 * 1024 * 1024
_CHECKSUM_PREFIX: Final = "sha256:"


class NativeEnvelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The versioned wrapper around the payload bytes (what ``inspect`` shows as metadata)."""

    format: str
    format_version: int
    writer_version: str
    checksum: str
    payload: bytes


# ------------------------------------------------------------------------ payload schema
# The payload is ``_Sidecar`` parameterized by the group type, and both group types are the
# ledger's storage Structs: ``GroupState`` itself for the fast load, and for the readers
# that must see the file as written (``decode_native``: inspect, validate, convert) the same
# Structs with three leaf rules relaxed, derived below rather than restated, so a field added
# to storage is in both payloads at once. The relaxations keep a value exactly as stored:
# an enum is read as its ``str`` (the ledger names an unknown value with the seed's message),
# a ``float`` also as an ``int`` (int stays int: a file must read back to exactly the state
# that was written; the storage type would turn ``1`` into ``1.0``), and a ``dict[str, ...]``
# with any key type (a receipt's bad key is reported by the ledger, not by msgspec). Storage
# Structs no rule touches (prompt_ref, reward checks, log context) are used as they are.
# ``Any`` appears only where the schema holds free-form plain data: receipts, reward
# settings and finalized-reward rows, whose owners validate them on load.


def _as_written(annotation: Any) -> Any:
    """``annotation`` with the ledger's reading rules relaxed to the file's primitive types."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return _as_written_struct(annotation)
    if isinstance(annotation, type) and issubclass(annotation, StrEnum):
        return str
    if annotation is float:
        return int | float
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is dict and args[0] is str:
        return GenericAlias(dict, (Any, _as_written(args[1])))
    if origin is list:
        return GenericAlias(list, (_as_written(args[0]),))
    if origin in (Union, UnionType):
        return functools.reduce(operator.or_, map(_as_written, args))
    return annotation


@functools.cache
def _as_written_struct(struct: type[msgspec.Struct]) -> type[msgspec.Struct]:
    """``struct`` itself when no rule relaxes a field, else its twin with the same fields."""
    stored = [(field.name, field.type) for field in msgspec.structs.fields(struct)]
    written = [(name, _as_written(annotation)) for name, annotation in stored]
    if written == stored:
        return struct
    return msgspec.defstruct(
        f"{struct.__name__}AsWritten", written, gc=False, forbid_unknown_fields=True
    )


_G = TypeVar("_G")


class _Sidecar(msgspec.Struct, Generic[_G], gc=False, forbid_unknown_fields=True, kw_only=True):
    """The payload schema; the group type is the parameter.

    ``_Sidecar[GroupState as written]`` keeps every value exactly as stored (conversions
    reproduce the original bytes). ``_Sidecar[GroupState]`` decodes straight into the
    ledger's storage, so ``load_sidecar`` hands groups to the ledger without another
    conversion; it is stricter only where the ledger would refuse anyway.
    """

    # Field order is ``build_rollout_recovery_state``'s key order, so decoding keeps it and
    # a .pt -> native -> .pt conversion reproduces the original bytes.
    schema_version: int
    groups: list[_G]
    # The two keys the schema lets older sidecars omit. UNSET (not None) so an absent key
    # stays absent after a round trip: ``to_builtins`` drops UNSET fields.
    batch_shortfall: dict[int, int] | msgspec.UnsetType = msgspec.UNSET
    sampler_stamps_target_steps: bool | msgspec.UnsetType | None = msgspec.UNSET
    finalizer_metrics_by_group: dict[str, dict[str, int | float]]
    reward_settings: dict[str, Any] | None
    finalizer_rewards_by_group: dict[str, list[dict[str, Any]]]


class _ExtensionRefused(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _refuse_extension(code: int, data: memoryview) -> Any:
    # MessagePack extension types decode to objects that are not sidecar primitives.
    raise _ExtensionRefused(code)


_ENVELOPE_DECODER: Final = msgspec.msgpack.Decoder(NativeEnvelope, ext_hook=_refuse_extension)
# A type built at import time cannot be a static type argument; ``Any`` lets it be one here.
_PAYLOAD_DECODER: Final = msgspec.msgpack.Decoder(
    cast(Any, _Sidecar)[_as_written_struct(GroupState)], ext_hook=_refuse_extension
)
_LOADABLE_DECODER: Final = msgspec.msgpack.Decoder(_Sidecar[GroupState], ext_hook=_refuse_extension)
_ENCODER: Final = msgspec.msgpack.Encoder()
# Besides DecodeError, msgspec lets these escape on malformed input (found by the fuzz
# tests: a flipped byte inside a string raises UnicodeDecodeError, a ValueError).
_MALFORMED: Final = (ValueError, OverflowError, RecursionError)


def _split_msgspec_error(error: msgspec.ValidationError) -> tuple[str, str]:
    message, path = split_validation_path(str(error))
    return message, path or "$"


# ------------------------------------------------------------------------------ detect


def looks_like_native(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` starts with the native magic (a format guess; never raises)."""
    return bytes(memoryview(data)[: len(MAGIC)]) == MAGIC


# ------------------------------------------------------------------------------- write


def encode_native(state: dict[Any, Any], *, verify: bool = True) -> bytes:
    """Encode a sidecar dict as the bytes of a native file.

    With ``verify`` (the default) the payload is decoded again by the reader's typed
    decoder and must equal ``state``: a value MessagePack cannot carry faithfully (a tuple,
    a set, a dataclass, a datetime) is refused here, at write time, rather than found to
    have changed at restore time. Raises :class:`InvalidStateTypeError` for a value that
    cannot be encoded, :class:`InvalidStateError` for an integer outside MessagePack's
    64-bit range, a string with lone surrogates, or a state the reader would reject or read
    back differently (``path`` names the field when the typed decoder knows it).
    """
    if type(state) is not dict:
        raise InvalidStateTypeError(
            f"native sidecar state must be a dict, not {type(state).__name__}", path="$"
        )
    payload = _encode_payload(state)
    if verify:
        decoded = decode_native_payload(payload)
        if decoded != state and not _same_tree(decoded, state):
            raise InvalidStateError(
                "native sidecar: state would not read back unchanged (it holds tuples, sets "
                "or other non-primitive values)",
                path="$",
            )
    return _wrap(payload)


def encode_native_checkpoint(
    ledger: RolloutRecoveryLedger, **fields: Unpack[SidecarFields]
) -> bytes:
    """The native file's bytes for a checkpoint, encoded straight from ledger storage.

    Takes ``build_rollout_recovery_state``'s keyword arguments (``SidecarFields``),
    reads back to exactly what it builds from them and refuses what it refuses, but
    builds no dicts for the groups: run it inside the checkpoint cut, then write the bytes
    (``atomic_write_bytes``) after the cut is released. The ledger's own checks
    (checkpoint-safe, prompts bound) and the sidecar's validation seam run first
    (``checkpoint_parts``, shared with the builder); receipts are plain data by
    construction.
    """
    groups, controller = checkpoint_parts(ledger, operation="encode_native_checkpoint", **fields)
    return encode_native_parts(groups, controller)


def encode_native_parts(groups: list[GroupState], controller: dict[str, Any]) -> bytes:
    """The native file's bytes for ``checkpoint_parts``' two parts, already checked."""
    sidecar = _Sidecar[GroupState](
        schema_version=ROLLOUT_RECOVERY_SCHEMA_VERSION, groups=groups, **controller
    )
    return _wrap(_encode_payload(sidecar))


def encode_native_group(group: GroupState) -> bytes:
    """One group's MessagePack: exactly its bytes inside a checkpoint's payload, where the
    groups array is its items' encodings one after another (MessagePack is context-free).

    An incremental encoder keeps these and re-encodes only the groups that changed; see
    :func:`encode_native_fragments`.
    """
    return _encode_payload(group)


class EncodedGroups(Protocol):
    """Groups' encodings (:func:`encode_native_group`), counted and iterated in order."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[bytes]: ...


def encode_native_fragments(groups: EncodedGroups, controller: dict[str, Any]) -> NativeFileParts:
    """:func:`encode_native_parts` for groups already encoded (:func:`encode_native_group`):
    the same file, as its parts (``bytes(...)`` joins them).

    The payload is the encoding of the sidecar with no groups, whose empty groups array
    (one byte) is replaced by the array's header and the groups. Nothing here is
    proportional to the file: ``groups`` is kept as given, to be iterated when the parts are
    written, so it must never change (the incremental encoder's ``MapView``), and the
    checksum and the file's header are computed then too (:class:`NativeFileParts`).
    """
    empty = _Sidecar[GroupState](
        schema_version=ROLLOUT_RECOVERY_SCHEMA_VERSION, groups=[], **controller
    )
    frame = _encode_payload(empty)
    # "groups" is the second field, after an int: the key's first occurrence is the field.
    split = frame.index(_GROUPS_KEY) + len(_GROUPS_KEY)
    if frame[split] != _EMPTY_ARRAY:
        raise AssertionError("the native payload's empty groups array is not where expected")
    return NativeFileParts(frame[:split] + _array_header(len(groups)), groups, frame[split + 1 :])


class NativeFileParts:
    """A native file as the parts of its payload: written without joining them, its
    checksum computed by whoever writes it (``_durable.FileParts``).

    The envelope holds the payload's SHA-256 before the payload, so :meth:`parts` hashes
    the payload first (one pass, in the writer's thread) and yields the magic, the envelope
    and the ``bin`` header, then the payload's parts. The bytes are exactly
    :func:`encode_native_parts`'s for the same sidecar. The parts are immutable ``bytes``
    in a collection nobody changes (a ``MapView``): the encoder that made them may go on
    (changing its own map) while they are written.
    """

    __slots__ = ("_groups", "_head", "_tail")

    def __init__(self, head: bytes, groups: EncodedGroups, tail: bytes) -> None:
        self._head, self._groups, self._tail = head, groups, tail

    def _payload(self) -> Iterator[bytes]:
        yield self._head
        yield from self._groups
        yield self._tail

    def parts(self) -> Iterator[bytes]:
        digest = hashlib.sha256()
        size = 0
        for part in self._payload():
            digest.update(part)
            size += len(part)
        yield _file_head(size, digest.hexdigest())
        yield from self._payload()

    def __bytes__(self) -> bytes:
        """The file's bytes, joined (one copy of the file: tests and tools, not writers)."""
        return b"".join(self.parts())

    def __eq__(self, other: object) -> bool:
        """Equal to the same file, as parts or as bytes (tests compare snapshots)."""
        if isinstance(other, NativeFileParts):
            other = bytes(other)
        if isinstance(other, bytes | bytearray | memoryview):
            return bytes(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to bytes that hash otherwise

    def __repr__(self) -> str:
        return f"NativeFileParts(groups={len(self._groups)})"


def _encode_payload(value: object) -> bytes:
    """MessagePack-encode a payload; what it cannot carry becomes the documented errors."""
    try:
        return _ENCODER.encode(value)
    except TypeError as error:
        raise InvalidStateTypeError(
            f"native sidecar: state holds a value MessagePack cannot encode: {error}", path="$"
        ) from None
    except RecursionError:
        raise InvalidStateError(
            "native sidecar: state is nested too deeply or refers to itself", path="$"
        ) from None
    except (OverflowError, UnicodeEncodeError, ValueError) as error:
        raise InvalidStateError(
            f"native sidecar: state holds a value MessagePack cannot encode: {error}", path="$"
        ) from None


def _wrap(payload: bytes) -> bytes:
    """Magic prefix plus the versioned, checksummed envelope around ``payload``."""
    return _join_file([payload], hashlib.sha256(payload).hexdigest())


_GROUPS_KEY: Final = _ENCODER.encode("groups")
_EMPTY_ARRAY: Final = _ENCODER.encode([])[0]
_EMPTY_BIN: Final = _ENCODER.encode(b"")


def _join_file(payload: Sequence[bytes], hexdigest: str) -> bytes:
    """The file: magic and envelope around the payload that is ``payload``'s parts joined,
    whose SHA-256 is ``hexdigest``, in one copy of the payload's bytes (instead of two: the
    envelope's encode, then the magic's concatenation)."""
    return b"".join((_file_head(sum(map(len, payload)), hexdigest), *payload))


def _file_head(size: int, hexdigest: str) -> bytes:
    """Everything before a payload of ``size`` bytes whose SHA-256 is ``hexdigest``: the
    magic, then the envelope up to the payload's bytes.

    The envelope is what msgspec encodes (``NativeEnvelope``, whose last field is the
    payload): its encoding with an empty payload, the empty ``bin`` replaced by the
    payload's ``bin`` header.
    """
    head = _ENCODER.encode(
        NativeEnvelope(
            format=FORMAT_NAME,
            format_version=FORMAT_VERSION,
            writer_version=__version__,
            checksum=_CHECKSUM_PREFIX + hexdigest,
            payload=b"",
        )
    )
    if not head.endswith(_EMPTY_BIN):
        raise AssertionError("the native envelope does not end with its payload")
    return b"".join((MAGIC, head[: -len(_EMPTY_BIN)], _bin_header(size)))


def _bin_header(size: int) -> bytes:
    """MessagePack's header of a ``bin`` of ``size`` bytes (its smallest form, as msgspec
    writes it)."""
    if size < 0x100:
        return b"\xc4" + size.to_bytes(1, "big")
    if size < 0x10000:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


def _array_header(count: int) -> bytes:
    """MessagePack's header of an array of ``count`` items (its smallest form)."""
    if count < 0x10:
        return bytes((0x90 | count,))
    if count < 0x10000:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def _same_tree(left: object, right: object) -> bool:
    """Exact equality that also holds for NaN; the slow path behind a failed ``==``.

    ``==`` says NaN differs from itself, so a state with a NaN metric would fail the fast
    check although it reads back faithfully. Types must match exactly (a tuple is not a
    list); a ``str`` enum member matches its value, as it is written as that string.
    """
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(
            _same_tree(value, right[key]) for key, value in left.items()
        )
    if isinstance(left, list) and type(right) is list:
        return len(left) == len(right) and all(map(_same_tree, left, right))
    if type(left) is float and type(right) is float and left != left and right != right:
        return True
    if isinstance(right, str) and type(left) is str:
        return left == right
    return type(left) is type(right) and left == right


# -------------------------------------------------------------------------------- read


def read_native_envelope(
    data: bytes | bytearray | memoryview, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> NativeEnvelope:
    """Check magic, envelope, format, version and checksum; return the envelope.

    Raises :class:`SidecarFormatError` for anything that is not an intact native file of
    a supported version. The payload is not decoded.
    """
    view = memoryview(data)
    if view.nbytes > max_file_bytes:
        raise SidecarFormatError(
            f"native sidecar: file is {view.nbytes} bytes, over the {max_file_bytes}-byte limit"
        )
    if not looks_like_native(view):
        raise SidecarFormatError("native sidecar: missing the magic prefix")
    try:
        envelope = _ENVELOPE_DECODER.decode(view[len(MAGIC) :])
    except msgspec.ValidationError as error:
        message, path = _split_msgspec_error(error)
        raise SidecarFormatError(
            f"native sidecar: invalid envelope: {message}", path=path
        ) from None
    except (msgspec.DecodeError, _ExtensionRefused, *_MALFORMED) as error:
        raise SidecarFormatError(
            f"native sidecar: envelope is not valid MessagePack (truncated or corrupted): {error!s}"
        ) from None
    if envelope.format != FORMAT_NAME:
        raise SidecarFormatError(
            f"native sidecar: format is {envelope.format!r}, expected {FORMAT_NAME!r}",
            path="$.format",
        )
    if envelope.format_version not in SUPPORTED_FORMAT_VERSIONS:
        raise SidecarFormatError(
            f"native sidecar: unsupported format_version={envelope.format_version!r}; this "
            f"reader supports {sorted(SUPPORTED_FORMAT_VERSIONS)}",
            path="$.format_version",
        )
    expected = _CHECKSUM_PREFIX + hashlib.sha256(envelope.payload).hexdigest()
    if envelope.checksum != expected:
        raise SidecarFormatError(
            "native sidecar: payload checksum mismatch (the file is corrupted or was "
            "modified after writing)",
            path="$.checksum",
        )
    return envelope


def decode_native(
    data: bytes | bytearray | memoryview, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> dict[Any, Any]:
    """Decode a native file's bytes into a fresh sidecar dict (type-checked, not validated).

    Raises :class:`SidecarFormatError` when the bytes are not an intact native file and
    :class:`InvalidStateError` (with ``path``) when the payload breaks the sidecar's types.
    Value rules are checked by ``parse_rollout_recovery_state`` and the ledger.
    """
    envelope = read_native_envelope(data, max_file_bytes=max_file_bytes)
    return decode_native_payload(envelope.payload)


def decode_native_payload(payload: bytes) -> dict[Any, Any]:
    """Decode an envelope's (checksum-verified) payload; raises like :func:`decode_native`.

    The typed schema is the uuid lineage's (every file this package writes); a payload it
    refuses is read again as the Gym lineage's if that is what it holds
    (:func:`_other_lineage`).
    """
    try:
        sidecar = _typed_decode(_PAYLOAD_DECODER, payload)
    except InvalidStateError as error:
        return _other_lineage(payload, error)
    state: dict[Any, Any] = msgspec.to_builtins(sidecar, builtin_types=(bytes,), str_keys=False)
    _refuse_timestamps(sidecar, state)
    return state


def decode_native_payload_for_load(
    payload: bytes,
) -> tuple[dict[Any, Any], list[GroupState] | None]:
    """Decode a payload to its state dict and, separately, the ledger's storage groups.

    The groups share no container with the dict, and nothing else references them: hand
    them to ``RolloutRecoveryLedger.from_decoded_groups``. ``None`` instead of groups: the
    payload is a Gym-lineage sidecar, which no ledger holds (check the dict with
    ``parse_gym_sidecar``). Raises like :func:`decode_native`.
    """
    try:
        sidecar = _typed_decode(_LOADABLE_DECODER, payload)
    except InvalidStateError as error:
        return _other_lineage(payload, error), None
    state: dict[Any, Any] = msgspec.to_builtins(sidecar, builtin_types=(bytes,), str_keys=False)
    _refuse_timestamps(sidecar, state)
    return state, sidecar.groups


def _other_lineage(payload: bytes, refusal: InvalidStateError) -> dict[Any, Any]:
    """A payload the uuid lineage's typed schema refused: a Gym-lineage sidecar, read as
    plain data (its own checks are ``parse_gym_sidecar``'s), or else the refusal.

    Only files this schema refuses pay for the second decode. For a uuid-lineage file
    holding a Gym attempt the refusal says so, at that attempt's ``attempt_index``,
    rather than msgspec's "unknown field".
    """
    if isinstance(refusal, SidecarFormatError):
        raise refusal
    try:
        untyped = msgspec.msgpack.decode(payload, ext_hook=_refuse_extension)
    except _ExtensionRefused as error:
        raise SidecarFormatError(
            f"native sidecar: payload holds MessagePack extension type {error.code}, which "
            "is not a sidecar primitive"
        ) from None
    except Exception:  # the typed decoder's verdict stands on anything it did not parse
        raise refusal from None
    if not isinstance(untyped, dict):
        raise refusal
    if SidecarLineage.of(untyped) is SidecarLineage.UUID:
        for mismatch in lineage_mismatches(untyped):
            raise mismatch from None
        raise refusal
    # msgspec decodes a timestamp extension to a datetime without asking the ext hook.
    check_primitive_tree(untyped, what="native sidecar")
    return untyped


def _typed_decode(decoder: msgspec.msgpack.Decoder[_T], payload: bytes) -> _T:
    try:
        return decoder.decode(payload)
    except msgspec.ValidationError as error:
        message, path = _split_msgspec_error(error)
        raise InvalidStateError(f"native sidecar: {message}", path=path) from None
    except _ExtensionRefused as error:
        raise SidecarFormatError(
            f"native sidecar: payload holds MessagePack extension type {error.code}, which "
            "is not a sidecar primitive"
        ) from None
    except (msgspec.DecodeError, *_MALFORMED) as error:
        raise SidecarFormatError(
            f"native sidecar: payload is not valid MessagePack: {error}"
        ) from None


def _free_form_values(sidecar: _Sidecar[Any]) -> list[Any]:
    values: list[Any] = [
        attempt.receipt
        for group in sidecar.groups
        for sibling in group.siblings
        for attempt in sibling.attempts
        if attempt.receipt is not None
    ]
    values.append(sidecar.reward_settings)
    values.append(sidecar.finalizer_rewards_by_group)
    return values


def _free_form_paths(sidecar: _Sidecar[Any]) -> list[str]:
    # Built only after a failed check: formatting a path per attempt up front cost more than
    # the check itself.
    groups: Sequence[Any] = sidecar.groups  # either payload schema: the same shape
    paths = [
        f"$.groups[{g}].siblings[{s}].attempts[{a}].receipt"
        for g, group in enumerate(groups)
        for s, sibling in enumerate(group.siblings)
        for a, attempt in enumerate(sibling.attempts)
        if attempt.receipt is not None
    ]
    return [*paths, "$.reward_settings", "$.finalizer_rewards_by_group"]


def _refuse_timestamps(sidecar: _Sidecar[Any], state: dict[Any, Any]) -> None:
    """Refuse MessagePack timestamps inside the free-form (``Any``-typed) parts.

    msgspec decodes the timestamp extension to ``datetime`` without consulting the ext hook,
    and ``to_builtins`` then quietly turns it into a string: a silent change. ``state`` (the
    ``to_builtins`` image of ``sidecar``) differs from the decoded values exactly when such
    a value is present, and comparing the two runs in C, which a Python walk over 10^5
    receipts would not.
    """
    values = _free_form_values(sidecar)
    converted: list[Any] = [
        attempt["receipt"]
        for group in state["groups"]
        for sibling in group["siblings"]
        for attempt in sibling["attempts"]
        if attempt["receipt"] is not None
    ]
    converted.append(state["reward_settings"])
    converted.append(state["finalizer_rewards_by_group"])
    if converted == values:
        return
    for path, value in zip(_free_form_paths(sidecar), values, strict=True):
        if msgspec.to_builtins(value, builtin_types=(bytes,), str_keys=False) != value:
            raise InvalidStateError(
                f"native sidecar: {path} holds a MessagePack timestamp or another value that "
                "is not a sidecar primitive",
                path=path,
            )
    raise InvalidStateError("native sidecar: payload holds a value that is not a primitive")
