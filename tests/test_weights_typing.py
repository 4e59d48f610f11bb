"""The weights handle is typed (issue 16, item 5): ``mypy --strict`` proves a trainer
feeds only a backend that can load its weights, so no backend downcasts them.

``tests/fixtures/typing/weights_pairs.py`` pairs every trainer with every backend; the
pairs marked ``# refused`` must be exactly the lines mypy reports.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mypy_support import run_mypy

pytest.importorskip("mypy.api")

PAIRS = Path(__file__).parent / "fixtures" / "typing" / "weights_pairs.py"


@pytest.mark.slow
def test_mypy_refuses_exactly_the_mismatched_weights() -> None:
    pytest.importorskip("torch")  # the torch side's types come from torch and transformers
    stdout, stderr, _ = run_mypy(["--strict", "--no-error-summary", str(PAIRS)])
    reported = {
        int(match.group(1))
        for match in re.finditer(r"weights_pairs\.py:(\d+): error:", stdout, re.M)
    }
    lines = PAIRS.read_text().splitlines()
    refused = {number for number, line in enumerate(lines, 1) if line.endswith("# refused")}
    assert refused, "the fixture lost its refused lines"
    assert reported == refused, f"{stdout}{stderr}"
