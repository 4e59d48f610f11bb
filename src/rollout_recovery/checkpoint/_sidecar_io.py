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

import math
import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
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

    def summary(self) -> dict[str, Any]:
        """What ``rollout-recovery inspect`` reports about this sidecar: its file and
        envelope, its groups, siblings and attempts by status, the staging keys a restore
        keeps, and each finalizer metric's mean, min and max (floats as computed: a NaN
        metric gives NaN, not ``None``)."""
        parsed = self.parsed
        groups: list[dict[str, Any]] = parsed.ledger_state["groups"]
        siblings = [sibling for group in groups for sibling in group["siblings"]]
        currents = [sibling["attempts"][-1] for sibling in siblings]
        metrics: dict[str, list[float]] = {}
        for values in parsed.finalizer_metrics_by_group.values():
            for name, number in values.items():
                metrics.setdefault(name, []).append(number)
        return {
            "path": str(self.path),
            "format": self.format,
            "size_bytes": self.size,
            "format_version": self.format_version,
            "writer_version": self.writer_version,
            "payload_checksum": self.payload_checksum,
            "schema_version": parsed.ledger_state["schema_version"],
            "groups": {
                "total": len(groups),
                "by_status": _counts([group["status"] for group in groups]),
                "by_phase": _counts([group["phase"] for group in groups]),
                "by_granularity": _counts([group["recovery_granularity"] for group in groups]),
            },
            "siblings": {
                "total": len(siblings),
                "sealed": sum(attempt["status"] == "sealed" for attempt in currents),
                "current_attempts_by_status": _counts([attempt["status"] for attempt in currents]),
                "attempts_per_sibling": _counts([len(sibling["attempts"]) for sibling in siblings]),
                "attempts_total": sum(len(sibling["attempts"]) for sibling in siblings),
            },
            "staging_keys": {
                # What a restore keeps in the staging partition: keys of sealed current attempts.
                "expected": len(self.ledger.expected_staging_keys()),
                "sealed_without_receipt": sum(
                    attempt["status"] == "sealed" and attempt["receipt"] is None
                    for attempt in currents
                ),
            },
            "shortfall_by_step": {
                str(step): count for step, count in sorted(parsed.batch_shortfall.items())
            },
            "sampler_stamps_target_steps": parsed.sampler_stamps_target_steps,
            "reward_settings": (
                None if parsed.reward_settings is None else parsed.reward_settings.to_state()
            ),
            "finalizer": {
                "groups": len(parsed.finalizer_metrics_by_group),
                "reward_observations": sum(
                    len(rows) for rows in parsed.finalizer_rewards_by_group.values()
                ),
                "metrics": {
                    name: {
                        "groups": len(values),
                        "mean": _mean(values),
                        "min": _extreme(values, min),
                        "max": _extreme(values, max),
                    }
                    for name, values in sorted(metrics.items())
                },
            },
        }


def _counts(values: list[Any]) -> dict[str, int]:
    return {str(key): count for key, count in sorted(Counter(values).items(), key=repr)}


def _mean(values: list[float]) -> float:
    """The mean without overflow: ``[1e308, 1e308]`` gives 1e308, not inf.

    The sum is exact (``math.fsum``, or fractions where it passes the float range), so the
    mean is within an ulp. NaN when a value is NaN, ±inf when the infinities agree.
    """
    if not all(map(math.isfinite, values)):
        return sum(values) / len(values)
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        # A sum beyond the float range; the mean of finite floats never is. Exact, then.
        return float(sum(map(Fraction, values), Fraction(0)) / len(values))


def _extreme(values: list[float], pick: Callable[[list[float]], float]) -> float:
    # min/max with a NaN depend on where the NaN is; make any NaN the answer instead.
    return math.nan if any(map(math.isnan, values)) else float(pick(values))


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
