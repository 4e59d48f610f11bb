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

# torch, transformers and safetensors are not analysed: the handles' types are this
# project's own classes, so which pairs mypy refuses does not depend on them, and following
# them cost about 60 s of a cold run (a fresh clone has no mypy cache) against 14 s.
UNFOLLOWED = """\
[mypy]
[mypy-torch.*]
follow_imports = skip
[mypy-transformers.*]
follow_imports = skip
[mypy-safetensors.*]
follow_imports = skip
"""


@pytest.mark.slow
def test_mypy_refuses_exactly_the_mismatched_weights(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the torch side's modules import torch and transformers
    config = tmp_path / "mypy.ini"
    config.write_text(UNFOLLOWED)
    stdout, stderr, _ = run_mypy(
        [
            "--strict",
            "--no-error-summary",
            f"--config-file={config}",
            f"--cache-dir={tmp_path / 'cache'}",
            str(PAIRS),
        ]
    )
    reported = {
        int(match.group(1))
        for match in re.finditer(r"weights_pairs\.py:(\d+): error:", stdout, re.M)
    }
    lines = PAIRS.read_text().splitlines()
    refused = {number for number, line in enumerate(lines, 1) if line.endswith("# refused")}
    assert refused, "the fixture lost its refused lines"
    assert reported == refused, f"{stdout}{stderr}"
