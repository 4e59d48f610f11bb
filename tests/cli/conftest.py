"""Make the checkpoint tests' ``sidecar_fixtures`` importable from the CLI tests."""

from __future__ import annotations

import sys
from pathlib import Path

_FIXTURES = str(Path(__file__).resolve().parents[1] / "checkpoint")
if _FIXTURES not in sys.path:
    sys.path.insert(0, _FIXTURES)
