"""The README's recorder example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "Inside a loop you own: the recorder"


def test_the_readme_recorder_example_runs() -> None:
    text = README.read_text()
    match = re.search(rf"^## {re.escape(SECTION)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README has no '## {SECTION}' section"
    (code,) = re.findall(r"```python\n(.*?)```", match.group(1), re.S)
    exec(compile(code, "README.md recorder block", "exec"), {"__name__": "__recorder__"})
