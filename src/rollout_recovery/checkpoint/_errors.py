"""Errors of the sidecar file layer (the schema errors come from ``rollout_recovery.errors``)."""

from __future__ import annotations

from ..errors import InvalidStateError

__all__ = ["SidecarFormatError"]


class SidecarFormatError(InvalidStateError):
    """The bytes are not a readable sidecar file: unknown format, truncated, corrupted.

    Raised before any schema check runs, so no state was produced. It derives from
    :class:`~rollout_recovery.errors.InvalidStateError` (hence from ``RolloutRecoveryError``
    and ``ValueError``): a caller that treats every bad checkpoint alike catches that one
    class, while a caller that must tell "cannot decode" (``rollout-recovery validate`` exits
    2) from "decoded but breaks the schema" (exit 1) catches this subclass first. ``path``
    names the envelope field at fault when one is known, else it is ``None``.
    """
