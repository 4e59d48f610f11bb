"""The ``rollout-recovery`` command line: one click group, one module per command."""

from ._main import cli, main

__all__ = ["cli", "main"]
