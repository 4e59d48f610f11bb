"""Checkpoint files: the sidecar in the native format or NeMo-RL's ``.pt``, written atomically.

Checkpoint code writes with :func:`write_sidecar` (or :func:`encode_sidecar` for the
bytes) and reads with :func:`load_sidecar` (a :class:`LoadedSidecar`: the state, its
parsed parts and a restored ledger); inside a checkpoint cut,
:func:`encode_native_checkpoint` produces the file's bytes straight from ledger storage,
to be written after the cut. Tools read raw bytes (:func:`read_sidecar_bytes`,
:func:`decode_sidecar`) and list every fault (:func:`find_sidecar_problems`). Bytes that
are not an intact sidecar raise :class:`SidecarFormatError` through every reader. The
codecs themselves are private.
"""

from ._errors import SidecarFormatError
from ._native import encode_native_checkpoint
from ._problems import find_sidecar_problems
from ._sidecar_io import (
    SIDECAR_FILENAMES,
    LoadedSidecar,
    SidecarFormat,
    decode_sidecar,
    encode_sidecar,
    load_sidecar,
    read_sidecar_bytes,
    sidecar_filename,
    write_sidecar,
)

__all__ = [
    "SIDECAR_FILENAMES",
    "LoadedSidecar",
    "SidecarFormat",
    "SidecarFormatError",
    "decode_sidecar",
    "encode_native_checkpoint",
    "encode_sidecar",
    "find_sidecar_problems",
    "load_sidecar",
    "read_sidecar_bytes",
    "sidecar_filename",
    "write_sidecar",
]
