"""mypy run in this process, leaving the process as it found it.

``mypy.api.run`` raises the interpreter's recursion limit and leaves it raised; every
later test then runs with a deeper stack than the default (a deeply nested request body
that the server refuses by the limit would decode). ``tests/conftest.py`` fails a test that
leaks it, so every in-process mypy run goes through here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pytest


def run_mypy(arguments: Sequence[str]) -> tuple[str, str, int]:
    """``mypy.api.run(arguments)``, the recursion limit restored after it."""
    api = pytest.importorskip("mypy.api")
    limit = sys.getrecursionlimit()
    try:
        stdout, stderr, status = api.run(list(arguments))
    finally:
        sys.setrecursionlimit(limit)
    return stdout, stderr, status
