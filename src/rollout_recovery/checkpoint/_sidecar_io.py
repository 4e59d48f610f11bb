"""One small API for sidecar files in either format: write in a chosen one, read any.

Checkpoint code calls :func:`write_sidecar` with ``format="native"`` (the default) or
``format="pt"`` (NeMo-RL's ``rollout_recovery.pt``, loadable by ``torch.load``), and
:func:`load_sidecar` to read one back, whatever its format: the format is detected from
the file's first bytes, never from its name. Loading is all or nothing: it returns only
after ``parse_rollout_recovery_state`` and ``RolloutRecoveryLedger.from_state_dict``
accepted the whole state.

Either format may hold either of NeMo-RL's two schema-3 lineages, also told apart by
content (:meth:`SidecarFormat.lineage`): the uuid lineage (this package's, attempts named
by ``attempt_uuid``) and the Gym lineage (``attempt_index``, PR #4085). Every reader here
reads both and says which; only the uuid lineage restores into a ledger, and writing or
converting a file never changes its lineage (``docs/nemo-rl-lineages.md``).

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

import msgspec

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
from ..ledger.codec_support import GymSidecar, SidecarFields, SidecarLineage, parse_gym_sidecar
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
    "AnyLoadedSidecar",
    "LoadedGymSidecar",
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
    "validate_any_sidecar_state",
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
    def lineage(state: object) -> SidecarLineage:
        """Which of NeMo-RL's two schema-3 lineages a decoded state is, from its content:
        ``uuid`` (attempts named by ``attempt_uuid``, every file this package writes) or
        ``gym`` (numeric ``attempt_index``, capture keys ``<logical>`` / ``<logical>-a<N>``).
        ``state`` may also be a native file's bytes, as for :meth:`find_problems`. Raises
        :class:`InvalidStateError` for a state whose top level holds both, or bytes that
        are not an intact native file."""
        if isinstance(state, bytes | bytearray | memoryview):
            state = msgspec.msgpack.decode(read_native_envelope(state).payload)
        return SidecarLineage.of(state)

    @staticmethod
    def find_problems(state: object) -> list[SidecarProblem]:
        """Every fault of a decoded state (or of a native file's bytes whose typed decode
        failed), one per field; empty exactly when the state loads (see
        :func:`~rollout_recovery.checkpoint._problems.find_sidecar_problems`)."""
        return find_sidecar_problems(state)


SIDECAR_FORMATS: Final = tuple(format.value for format in SidecarFormat)


@dataclass(frozen=True)
class _LoadedFile:
    """What every loaded sidecar says about its file, whichever its lineage."""

    path: Path
    format: SidecarFormat
    size: int
    #: The state as loaded (a fresh tree; nothing else references it).
    state: dict[Any, Any]
    #: From the native envelope; all ``None`` for ``.pt`` (which records none of them).
    format_version: int | None
    writer_version: str | None
    payload_checksum: str | None

    def _file_summary(self, lineage: SidecarLineage, schema_version: int) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "format": self.format,
            "size_bytes": self.size,
            "format_version": self.format_version,
            "writer_version": self.writer_version,
            "payload_checksum": self.payload_checksum,
            "lineage": {
                "name": lineage.value,
                "attempt_identity": lineage.attempt_identity,
                "capture_keys": lineage.capture_keys,
            },
            "schema_version": schema_version,
        }


@dataclass(frozen=True)
class LoadedSidecar(_LoadedFile):
    """A uuid-lineage sidecar file that passed every check, with what ``inspect`` reports
    about it. A native file's groups come through the ledger's storage schema, so in
    ``state`` rewards read as floats, as the ledger holds them; ``decode_sidecar`` gives
    the bytes' exact values."""

    parsed: ParsedRolloutRecoveryState
    #: A ledger restored from ``parsed.ledger_state`` (no runtime prompts bound yet).
    ledger: RolloutRecoveryLedger

    @property
    def lineage(self) -> SidecarLineage:
        """Always the uuid lineage: the only one a ledger holds."""
        return SidecarLineage.UUID

    def summary(self) -> dict[str, Any]:
        """What ``rollout-recovery inspect`` reports about this sidecar: its file, envelope
        and lineage, its groups, siblings and attempts by status, the staging keys a
        restore keeps, and each finalizer metric's mean, min and max (floats as computed: a
        NaN metric gives NaN, not ``None``)."""
        parsed = self.parsed
        metrics: dict[str, list[float]] = {}
        for values in parsed.finalizer_metrics_by_group.values():
            for name, number in values.items():
                metrics.setdefault(name, []).append(number)
        return {
            **self._file_summary(self.lineage, parsed.ledger_state["schema_version"]),
            **_groups_summary(
                parsed.ledger_state["groups"], len(self.ledger.expected_staging_keys())
            ),
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


@dataclass(frozen=True)
class LoadedGymSidecar(_LoadedFile):
    """A Gym-lineage sidecar (NeMo-RL PR #4085's line) that passed every check of that
    lineage; ``state`` holds it exactly as decoded. No ledger is restored from it: its
    attempts are not this package's."""

    gym: GymSidecar

    @property
    def lineage(self) -> SidecarLineage:
        return SidecarLineage.GYM

    def summary(self) -> dict[str, Any]:
        """What ``rollout-recovery inspect`` reports: the same file, lineage, group and
        sibling counts as for the uuid lineage, then what only this lineage holds (the
        agents groups resolved to, completion receipts, acknowledgements still owed)."""
        gym = self.gym
        currents = [sibling["attempts"][-1] for g in gym.groups for sibling in g["siblings"]]
        return {
            **self._file_summary(self.lineage, gym.schema_version),
            **_groups_summary(gym.groups, len(gym.expected_staging_keys())),
            "shortfall_by_step": {
                str(step): count for step, count in sorted(gym.batch_shortfall.items())
            },
            "sampler_stamps_target_steps": gym.sampler_stamps_target_steps,
            "gym": {
                "resolved_agents": _counts(
                    [g["resolved_agent_name"] for g in gym.groups if g.get("resolved_agent_name")]
                ),
                "completion_receipts": sum(
                    attempt.get("completion_receipt") is not None for attempt in currents
                ),
                "pending_acknowledgements": len(gym.pending_acknowledgements),
                "highest_attempt_index": max(
                    (len(s["attempts"]) - 1 for g in gym.groups for s in g["siblings"]),
                    default=None,
                ),
            },
        }


# What ``load_sidecar`` returns: a sidecar of either lineage, each saying which.
AnyLoadedSidecar = LoadedSidecar | LoadedGymSidecar


def _groups_summary(groups: list[dict[str, Any]], expected_staging_keys: int) -> dict[str, Any]:
    siblings = [sibling for group in groups for sibling in group["siblings"]]
    currents = [sibling["attempts"][-1] for sibling in siblings]
    return {
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
            "expected": expected_staging_keys,
            "sealed_without_receipt": sum(
                attempt["status"] == "sealed" and attempt["receipt"] is None
                for attempt in currents
            ),
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


def validate_any_sidecar_state(state: object) -> SidecarLineage:
    """Full validation by the state's own lineage (:meth:`SidecarFormat.lineage`): the
    uuid lineage's by :func:`validate_sidecar_state`, the Gym lineage's by
    ``parse_gym_sidecar``. Returns the lineage; raises like them."""
    with _deep_nesting_refused():
        lineage = SidecarLineage.of(state)
        if lineage is SidecarLineage.GYM:
            parse_gym_sidecar(state)
        else:
            validate_sidecar_state(state)
    return lineage


def encode_sidecar(
    state: dict[Any, Any], *, format: str = "native", validate: bool = True
) -> bytes:
    """The bytes of a sidecar file holding ``state`` in ``format``.

    With ``validate`` (the default) the state must pass its lineage's full validation
    (:func:`validate_any_sidecar_state`) first and must read back unchanged, so a file
    that could not be loaded is never produced. Both formats are deterministic for a given
    state, of either lineage; neither changes a state's lineage.
    """
    _check_format(format)
    # Validation and the read-back check build 10^6 acyclic containers; without the pause
    # every 700 of them trigger a collection that rescans the whole heap.
    with paused_gc():
        if validate:
            validate_any_sidecar_state(state)
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


def load_sidecar(path: str | os.PathLike[str]) -> AnyLoadedSidecar:
    """Read, decode and fully validate a sidecar of either lineage by that lineage's rules;
    all or nothing (see the module doc). A uuid-lineage file gives a
    :class:`LoadedSidecar` with its restored ledger, a Gym-lineage one a
    :class:`LoadedGymSidecar` (no ledger holds its attempts); ``.lineage`` says which."""
    resolved, data = read_sidecar_bytes(path)
    with paused_gc():  # decoding and validating build only acyclic containers
        return _load_bytes(resolved, data)


def _load_bytes(resolved: Path, data: bytes) -> AnyLoadedSidecar:
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
        file = _file_fields(resolved, format, len(data), state, metadata)
        del data
        if groups is None:  # the Gym lineage's, read as plain data
            return _loaded_gym(file)
        with _deep_nesting_refused():
            parsed = parse_rollout_recovery_state(state)
            ledger = RolloutRecoveryLedger.from_decoded_groups(groups)
    else:
        format, state = decode_sidecar(data)
        file = _file_fields(resolved, format, len(data), state, (None, None, None))
        del data
        if SidecarLineage.of(state) is SidecarLineage.GYM:
            return _loaded_gym(file)
        parsed, ledger = validate_sidecar_state(state)
    return LoadedSidecar(**file, parsed=parsed, ledger=ledger)


def _file_fields(
    path: Path,
    format: SidecarFormat,
    size: int,
    state: dict[Any, Any],
    metadata: tuple[int | None, str | None, str | None],
) -> dict[str, Any]:
    """The ``_LoadedFile`` fields, as keyword arguments of either loaded class."""
    return {
        "path": path,
        "format": format,
        "size": size,
        "state": state,
        "format_version": metadata[0],
        "writer_version": metadata[1],
        "payload_checksum": metadata[2],
    }


def _loaded_gym(file: dict[str, Any]) -> LoadedGymSidecar:
    with _deep_nesting_refused():
        gym = parse_gym_sidecar(file["state"])
    return LoadedGymSidecar(**file, gym=gym)
