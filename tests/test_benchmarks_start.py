"""Every benchmark still starts: a refactor that breaks a benchmark's imports or its
argument parser fails here, not months later when someone wants the numbers.

A benchmark that needs an optional extra (Ray, torch) is skipped when the extra is not
installed; any other import error fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))
OPTIONAL = ("ray", "torch", "transformers", "safetensors", "pytest_benchmark")


@pytest.mark.parametrize("script", BENCHMARKS, ids=[path.name for path in BENCHMARKS])
def test_the_benchmark_starts(script: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    missing = [name for name in OPTIONAL if f"No module named '{name}'" in done.stderr]
    if done.returncode != 0 and missing:
        pytest.skip(f"needs {missing[0]}")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
