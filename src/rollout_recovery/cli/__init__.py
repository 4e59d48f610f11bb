"""The ``rollout-recovery`` command line: one click group, one module per command."""

from __future__ import annotations

import sys

from ._standby_link import hand_over

__all__ = ["main"]


def main() -> None:
    """Console-script entry point. A rerun whose run directory has a warm standby
    (``[job] standby_within_s``) runs in a child of that standby, its imports done; any
    other command, or a rerun without one, runs here."""
    code = hand_over(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from ._main import main as run_here

    run_here()
