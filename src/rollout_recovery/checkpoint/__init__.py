"""Checkpoint files: the sidecar in the native format or NeMo-RL's ``.pt``, written atomically.

Checkpoint code writes with :func:`write_sidecar` (or ``SidecarFormat(...).encode_state``
for the bytes) and reads with :func:`load_sidecar` (the state, its parsed parts, a restored
ledger, and ``.summary()``: what ``rollout-recovery inspect`` shows); inside a checkpoint cut,
``SidecarFormat.encode_checkpoint`` produces the file's bytes from the ledger (the native
file straight from ledger storage), to be written after the cut; an
:class:`IncrementalSidecar` gives the same bytes again and again re-encoding only the groups
that changed since its last encode (the snapshot builder's), the native file as its parts
(``encode_parts``: neither joined nor checksummed until it is written). A
:class:`SidecarFormat` also names its file (``.filename``). Tools read raw bytes
(``SidecarFormat.read_bytes``, ``SidecarFormat.decode``) and list every fault
(``SidecarFormat.find_problems``). Bytes that are not an intact sidecar raise
:class:`~rollout_recovery.errors.SidecarFormatError` through every reader. The codecs
themselves are private.
"""

from ._incremental import IncrementalSidecar
from ._sidecar_io import SidecarFormat, load_sidecar, write_sidecar

__all__ = [
    "IncrementalSidecar",
    "SidecarFormat",
    "load_sidecar",
    "write_sidecar",
]
