"""The example configs in examples/: each loads as a job, and the README shows how to run
it. (tests/llm/test_llm_job.py runs the tiny one: it learns and survives a SIGKILL;
tests/integration/llm/test_vllm_llm_job.py the same job on vLLM servers.)"""

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
        "tiny-llama-vllm.toml",
        "smollm2-vllm.toml",
    }


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_an_example_loads_and_the_readme_runs_it(example: Path) -> None:
    config = load_config(example)
    assert config.trainer.kind == "torch" and config.generation.backend in {"transformers", "http"}
    assert config.model.source in {"tiny-llama", "smollm2"}
    if config.generation.backend == "http":
        # vLLM servers the job launches from the trainer's model, from the venv
        # .ci/vllm-integration builds (a path under ~, not the author's home).
        assert config.http.weight_sync == "vllm" and config.vllm.launch >= 1
        assert config.vllm.model == "" and config.vllm.python.startswith("~/")
    # No cache directory of the author's machine, no pinned digest: it runs anywhere.
    assert config.model.cache_dir == "" and config.model.digest == ""
    command = f"rollout-recovery run --config examples/{example.name} --out"
    assert command in (ROOT / "README.md").read_text()
