"""The dataset examples run from their config alone (issue 27): ``rollout-recovery run
--config examples/<name>/<config>.toml --out DIR`` finds its data and its reward beside
the config, trains, shows sample completions and passes the audit, the dataset check
included. Each runs a copy of its directory, shortened to a few steps, with the test's
model cache (the examples' own lengths are measured in docs/benchmarks.md)."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from run_fixtures import merge_sections, sections_to_toml

from rollout_recovery.history import audit_run

pytest.importorskip("datasets")

Cli = Callable[..., subprocess.CompletedProcess[str]]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DATASET_EXAMPLES = [
    EXAMPLES / "math" / "tiny-llama-math.toml",
    EXAMPLES / "answer-tag" / "tiny-llama-answer-tag.toml",
]


@pytest.mark.slow
@pytest.mark.parametrize("example", DATASET_EXAMPLES, ids=lambda path: path.parent.name)
def test_a_dataset_example_runs_from_its_config_alone(
    tmp_path: Path, model_cache: Path, example: Path, run_cli: Cli
) -> None:
    copy = tmp_path / example.parent.name
    shutil.copytree(example.parent, copy)
    config = copy / example.name
    sections = tomllib.loads(config.read_text())
    short = {"job": {"steps": 2}, "model": {"cache_dir": str(model_cache)}}
    config.write_text(sections_to_toml(merge_sections(sections, short)))
    out = tmp_path / "run"
    # The child's working directory is the repository's, where the copy's relative paths
    # lead nowhere: they are found beside the config.
    done = run_cli(["--config", str(config), "--out", str(out), "--plain"])
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert any(line.startswith("dataset ") and " rows (sha256 " in line for line in lines)
    assert sum(line.startswith("  sample ") for line in lines) == 2 * 2
    report = audit_run(out)
    assert report.ok and report.complete, report.violations
    assert report.counts["dataset_digest"] == "matches"
