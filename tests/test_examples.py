"""The example configs in examples/: each loads as a job, and the README shows how to run
it. (tests/llm/test_llm_job.py runs the tiny one: it learns and survives a SIGKILL.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout_recovery.control import load_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))


def test_there_are_examples() -> None:
    assert {path.name for path in EXAMPLES} >= {
        "tiny-llama-emit-token.toml",
        "smollm2-emit-newline.toml",
    }


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_an_example_loads_and_the_readme_runs_it(example: Path) -> None:
    config = load_config(example)
    assert config.trainer.kind == "torch" and config.generation.backend == "transformers"
    assert config.model.source in {"tiny-llama", "smollm2"}
    # No cache directory of the author's machine, no pinned digest: it runs anywhere.
    assert config.model.cache_dir == "" and config.model.digest == ""
    command = f"rollout-recovery run --config examples/{example.name} --out"
    assert command in (ROOT / "README.md").read_text()
