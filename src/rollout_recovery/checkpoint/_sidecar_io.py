"""One small API for sidecar files in either format: write in a chosen one, read any.

Checkpoint code calls :func:`write_sidecar` with ``format="native"`` (the default) or
``format="pt"`` (NeMo-RL's ``rollout_recovery.pt``, loadable by ``torch.load``), and
:func:`load_sidecar` to read one back, whatever its format: the format is detected from
the file's first bytes, never from its name. Loading is all or nothing: it returns only
after ``parse_rollout_recovery_state`` and ``RolloutRecoveryLedger.from_state_dict``
accepted the whole state.

Errors a reader can see, and nothing else for bad content:

* :class:`~rollout_recovery.errors.SidecarFormatError`: the bytes are not an intact
  sidecar of a known format;
* :class:`~rollout_recovery.errors.InvalidStateError` /
  :class:`~rollout_recovery.errors.InvalidStateTypeError`: decoded, but the state breaks
  the schema; ``path`` names the field;
* ``OSError``: the file cannot be opened or read (missing, a directory without a sidecar,
  no permission); :class:`~rollout_recovery.errors.NotARegularFileError` for a FIFO, a
  device or a socket, refused before anything is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Unpack

from .._durable import atomic_write_bytes
from .._gc import paused_gc
from ..errors import InvalidArgumentError, InvalidStateError, SidecarFormatError
from ..ledger import (
    ROLLOUT_RECOVERY_STATE_FILENAME,
    ParsedRolloutRecoveryState,
    RolloutRecoveryLedger,
    build_rollout_recovery_state,
    parse_rollout_recovery_state,
)
from ..ledger.codec_support import SidecarFields
from ._native import (
    DEFAULT_MAX_FILE_BYTES,
    decode_native_payload,
    decode_native_payload_for_load,
    encode_native,
    encode_native_checkpoint,
    looks_like_native,
    read_native_envelope,
)
from ._problems import SidecarProblem, find_sidecar_problems
from ._regular_file import open_regular_file
from ._torch_pt import decode_torch_pt, encode_torch_pt, looks_like_torch_zip

__all__ = [
    "NATIVE_SIDECAR_FILENAME",
    "PT_SIDECAR_FILENAME",
    "SIDECAR_FILENAMES",
    "SIDECAR_FORMATS",
    "LoadedSidecar",
    "SidecarFormat",
    "decode_sidecar",
    "detect_sidecar_format",
    "encode_sidecar",
    "load_sidecar",
    "read_sidecar",
    "read_sidecar_bytes",
    "resolve_sidecar_path",
    "sidecar_filename",
    "validate_sidecar_state",
    "write_sidecar",
]

NATIVE_SIDECAR_FILENAME: Final = "rollout_recovery.sidecar"
PT_SIDECAR_FILENAME: Final = ROLLOUT_RECOVERY_STATE_FILENAME
# The names a checkpoint directory may hold its sidecar under. The name only finds the
# file; its content decides how it is read.
SIDECAR_FILENAMES: Final = (NATIVE_SIDECAR_FILENAME, PT_SIDECAR_FILENAME)


class SidecarFormat(StrEnum):
    """A sidecar file's format: ``native`` (a checksummed MessagePack envelope) or ``pt``
    (NeMo-RL's torch-loadable ``rollout_recovery.pt``). A member equals its name as a
    string, so ``"pt"`` is accepted wherever a format is."""

    NATIVE = "native"
    PT = "pt"

    @property
    def filename(self) -> str:
        """The conventional file name of a sidecar in this format inside a checkpoint."""
        return sidecar_filename(self)

    @staticmethod
    def filenames() -> tuple[str, ...]:
        """Every name a checkpoint directory may hold its sidecar under."""
        return SIDECAR_FILENAMES

    def encode_state(self, state: dict[Any, Any], *, validate: bool = True) -> bytes:
        """The bytes of a sidecar file holding ``state`` (see :func:`encode_sidecar`)."""
        return encode_sidecar(state, format=self, validate=validate)

    def encode_checkpoint(
        self, ledger: RolloutRecoveryLedger, **fields: Unpack[SidecarFields]
    ) -> bytes:
        """A checkpoint's sidecar built from ``ledger`` and
        ``build_rollout_recovery_state``'s keyword arguments: the native file straight
        from ledger storage (:func:`encode_native_checkpoint`), a ``.pt`` from the built
        state."""
        if self is SidecarFormat.NATIVE:
            return encode_native_checkpoint(ledger, **fields)
        return encode_sidecar(dict(build_rollout_recovery_state(ledger, **fields)), format=self)

    @staticmethod
    def read_bytes(
        path: str | os.PathLike[str], *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    ) -> tuple[Path, bytes]:
        """The resolved sidecar path (a file, or a checkpoint directory's one sidecar) and
        its raw bytes, whatever the format (see :func:`read_sidecar_bytes`)."""
        return read_sidecar_bytes(path, max_file_bytes=max_file_bytes)

    @staticmethod
    def decode(data: bytes | bytearray | memoryview) -> tuple[SidecarFormat, dict[Any, Any]]:
        """Detect the format and decode the bytes (see :func:`decode_sidecar`)."""
        return decode_sidecar(data)

    @staticmethod
    def find_problems(state: object) -> list[SidecarProblem]:
        """Every fault of a decoded state (or of a native file's bytes whose typed decode
        failed), one per field; empty exactly when the state loads (see
        :func:`~rollout_recovery.checkpoint._problems.find_sidecar_problems`)."""
        return find_sidecar_problems(state)


SIDECAR_FORMATS: Final = tuple(format.value for format in SidecarFormat)


@dataclass(frozen=True)
class LoadedSidecar:
    """A sidecar file that passed every check, with what ``inspect`` reports about it."""

    path: Path
    format: SidecarFormat
    size: int
    #: The state as loaded (a fresh tree; nothing else references it). A native file's
    #: groups come through the ledger's storage schema, so rewards read as floats, as the
    #: ledger holds them; ``decode_sidecar`` gives the bytes' exact values.
    state: dict[Any, Any]
    parsed: ParsedRolloutRecoveryState
    #: A ledger restored from ``parsed.ledger_state`` (no runtime prompts bound yet).
    ledger: RolloutRecoveryLedger
    #: From the native envelope; all ``None`` for ``.pt`` (which records none of them).
    format_version: int | None
    writer_version: str | None
    payload_checksum: str | None


def sidecar_filename(format: str) -> str:
    """The conventional file name for a sidecar in ``format`` inside a checkpoint."""
    _check_format(format)
    return NATIVE_SIDECAR_FILENAME if format == "native" else PT_SIDECAR_FILENAME


def _check_format(format: object) -> None:
    if format not in SIDECAR_FORMATS:
        raise InvalidArgumentError(
            f"unknown sidecar format {format!r}; expected one of {SIDECAR_FORMATS}"
        )


def detect_sidecar_format(data: bytes | bytearray | memoryview) -> SidecarFormat | None:
    """The format of a sidecar's bytes, judged on content only; ``None`` if neither."""
    if looks_like_native(data):
        return SidecarFormat.NATIVE
    if looks_like_torch_zip(data):
        return SidecarFormat.PT
    return None


# ------------------------------------------------------------------------------ write


@contextmanager
def _deep_nesting_refused() -> Iterator[None]:
    """Turn a RecursionError from validating hostile nesting into the documented error.

    A file can nest a JSON document inside a string (a log context's full_result_json) or
    an in-memory state can refer to itself; either would otherwise escape as a bare
    RecursionError.
    """
    try:
        yield
    except RecursionError:
        raise InvalidStateError(
            "sidecar state is nested too deeply or refers to itself", path="$"
        ) from None


def validate_sidecar_state(
    state: object,
) -> tuple[ParsedRolloutRecoveryState, RolloutRecoveryLedger]:
    """Full validation: the sidecar's own rules, then every ledger load invariant.

    Raises the first :class:`InvalidStateError` / :class:`InvalidStateTypeError` found.
    """
    with _deep_nesting_refused():
        parsed = parse_rollout_recovery_state(state)
        ledger = RolloutRecoveryLedger.from_state_dict(parsed.ledger_state)
    return parsed, ledger


def encode_sidecar(
    state: dict[Any, Any], *, format: str = "native", validate: bool = True
) -> bytes:
    """The bytes of a sidecar file holding ``state`` in ``format``.

    With ``validate`` (the default) the state must pass :func:`validate_sidecar_state`
    first and must read back unchanged, so a file that could not be loaded is never
    produced. Both formats are deterministic for a given state.
    """
    _check_format(format)
    # Validation and the read-back check build 10^6 acyclic containers; without the pause
    # every 700 of them trigger a collection that rescans the whole heap.
    with paused_gc():
        if validate:
            validate_sidecar_state(state)
        if format == "native":
            return encode_native(state, verify=validate)
        # The .pt encoder accepts exact primitive types only, so its output reads back equal.
        return encode_torch_pt(state)


def write_sidecar(
    path: str | os.PathLike[str],
    state: dict[Any, Any],
    *,
    format: str = "native",
    validate: bool = True,
) -> None:
    """Atomically write ``state`` to ``path`` in ``format`` (see :func:`encode_sidecar`).

    A crash leaves either the previous file or the complete new one at ``path``.
    """
    atomic_write_bytes(path, encode_sidecar(state, format=format, validate=validate))


# ------------------------------------------------------------------------------- read


def resolve_sidecar_path(path: str | os.PathLike[str]) -> Path:
    """A sidecar file itself, or the one sidecar inside a checkpoint directory.

    Raises ``FileNotFoundError`` when a directory holds none of :data:`SIDECAR_FILENAMES`
    and :class:`SidecarFormatError` when it holds more than one (which to trust would be
    a guess).
    """
    candidate = Path(path)
    if not candidate.is_dir():
        return candidate
    found = [candidate / name for name in SIDECAR_FILENAMES if (candidate / name).is_file()]
    if not found:
        raise FileNotFoundError(
            f"checkpoint directory {str(candidate)!r} holds no sidecar (looked for "
            f"{', '.join(SIDECAR_FILENAMES)})"
        )
    if len(found) > 1:
        raise SidecarFormatError(
            f"checkpoint directory {str(candidate)!r} holds several sidecars: "
            f"{', '.join(p.name for p in found)}"
        )
    return found[0]


def read_sidecar_bytes(
    path: str | os.PathLike[str], *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> tuple[Path, bytes]:
    """The resolved sidecar path and its bytes, refusing files over ``max_file_bytes``."""
    resolved = resolve_sidecar_path(path)
    with open_regular_file(resolved) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > max_file_bytes:
            raise SidecarFormatError(
                f"sidecar file is {size} bytes, over the {max_file_bytes}-byte limit"
            )
        # One byte past the cap, so a file growing while read is still bounded.
        data = handle.read(max_file_bytes + 1)
    if len(data) > max_file_bytes:
        raise SidecarFormatError(f"sidecar file is over the {max_file_bytes}-byte limit")
    return resolved, data


def decode_sidecar(
    data: bytes | bytearray | memoryview,
) -> tuple[SidecarFormat, dict[Any, Any]]:
    """Detect the format and decode the bytes to a fresh state tree (no value checks).

    Raises :class:`SidecarFormatError` when the bytes are neither format or are damaged,
    and, for a native payload whose types break the schema, :class:`InvalidStateError`.
    """
    format = detect_sidecar_format(data)
    if format == "native":
        with paused_gc():
            return format, decode_native_payload(read_native_envelope(data).payload)
    if format == "pt":
        # Everything the .pt reader refuses is a SidecarFormatError: it checks only that
        # the file is a primitive tree, never the sidecar's schema.
        with paused_gc():
            return format, decode_torch_pt(data)
    raise SidecarFormatError(
        "not a rollout-recovery sidecar: the content is neither the native format (magic "
        "prefix) nor a torch zip archive with a data.pkl"
    )


def read_sidecar(path: str | os.PathLike[str]) -> dict[Any, Any]:
    """Read a sidecar file (or a checkpoint directory's) in either format, fully validated.

    Returns the state as stored. For the parsed parts and a restored ledger, use
    :func:`load_sidecar`.
    """
    return load_sidecar(path).state


def load_sidecar(path: str | os.PathLike[str]) -> LoadedSidecar:
    """Read, decode and fully validate a sidecar; all or nothing (see the module doc)."""
    resolved, data = read_sidecar_bytes(path)
    with paused_gc():  # decoding and validating build only acyclic containers
        return _load_bytes(resolved, data)


def _load_bytes(resolved: Path, data: bytes) -> LoadedSidecar:
    format = detect_sidecar_format(data)
    if format == "native":
        # Read the envelope once: it carries the metadata and the verified payload. The
        # payload decodes straight into the ledger's storage schema, so the ledger is
        # built from it without a second conversion (the state dict is built alongside).
        envelope = read_native_envelope(data)
        state, groups = decode_native_payload_for_load(envelope.payload)
        metadata: tuple[int | None, str | None, str | None] = (
            envelope.format_version,
            envelope.writer_version,
            envelope.checksum,
        )
        del envelope  # the payload bytes need not outlive the decode
        size = len(data)
        del data
        with _deep_nesting_refused():
            parsed = parse_rollout_recovery_state(state)
            ledger = RolloutRecoveryLedger.from_decoded_groups(groups)
    else:
        format, state = decode_sidecar(data)
        metadata = (None, None, None)
        size = len(data)
        del data
        parsed, ledger = validate_sidecar_state(state)
    return LoadedSidecar(
        path=resolved,
        format=format,
        size=size,
        state=state,
        parsed=parsed,
        ledger=ledger,
        format_version=metadata[0],
        writer_version=metadata[1],
        payload_checksum=metadata[2],
    )
