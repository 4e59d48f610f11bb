"""Checkpoint files: the sidecar in the native format or NeMo-RL's ``.pt``, written atomically.

Checkpoint code needs only :func:`write_sidecar` and :func:`load_sidecar` (or
:func:`read_sidecar`); inside a checkpoint cut, :func:`encode_native_checkpoint` produces
the file's bytes straight from ledger storage, to be written after the cut. The codecs
below them are public for tools and tests.
"""

from .._durable import atomic_write_bytes, fsync_directory
from ._errors import SidecarFormatError
from ._native import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MAGIC,
    SUPPORTED_FORMAT_VERSIONS,
    NativeEnvelope,
    decode_native,
    decode_native_payload,
    encode_native,
    encode_native_checkpoint,
    looks_like_native,
    read_native_envelope,
)
from ._problems import SidecarProblem, find_sidecar_problems
from ._sidecar_io import (
    NATIVE_SIDECAR_FILENAME,
    PT_SIDECAR_FILENAME,
    SIDECAR_FILENAMES,
    SIDECAR_FORMATS,
    LoadedSidecar,
    SidecarFormat,
    decode_sidecar,
    detect_sidecar_format,
    encode_sidecar,
    load_sidecar,
    read_sidecar,
    read_sidecar_bytes,
    resolve_sidecar_path,
    sidecar_filename,
    validate_sidecar_state,
    write_sidecar,
)
from ._torch_pt import (
    decode_torch_pt,
    encode_torch_pt,
    looks_like_torch_zip,
    read_torch_pt,
    write_torch_pt,
)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAGIC",
    "NATIVE_SIDECAR_FILENAME",
    "PT_SIDECAR_FILENAME",
    "SIDECAR_FILENAMES",
    "SIDECAR_FORMATS",
    "SUPPORTED_FORMAT_VERSIONS",
    "LoadedSidecar",
    "NativeEnvelope",
    "SidecarFormat",
    "SidecarFormatError",
    "SidecarProblem",
    "atomic_write_bytes",
    "decode_native",
    "decode_native_payload",
    "decode_sidecar",
    "decode_torch_pt",
    "detect_sidecar_format",
    "encode_native",
    "encode_native_checkpoint",
    "encode_sidecar",
    "encode_torch_pt",
    "find_sidecar_problems",
    "fsync_directory",
    "load_sidecar",
    "looks_like_native",
    "looks_like_torch_zip",
    "read_native_envelope",
    "read_sidecar",
    "read_sidecar_bytes",
    "read_torch_pt",
    "resolve_sidecar_path",
    "sidecar_filename",
    "validate_sidecar_state",
    "write_sidecar",
    "write_torch_pt",
]
