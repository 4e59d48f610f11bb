"""The ``rollout-recovery`` command line: one click group, one module per command."""

from ._main import main

__all__ = ["main"]
