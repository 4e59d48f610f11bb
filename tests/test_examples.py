"""The example configs in examples/: each loads as a job, and the README shows how to run
it. (tests/llm/test_llm_job.py runs the tiny one: it learns and survives a SIGKILL;
tests/integration/llm/test_vllm_llm_job.py the same job on vLLM servers;
tests/llm/test_dataset_examples.py runs the dataset examples from their configs.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout_recovery.control import load_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").rglob("*.toml"))
#: Below this AdamW learning rate a bf16 server rounds most of each step away: a step
#: moves a weight by about the learning rate, and half a bf16 step exceeds 1e-4 for 84%
#: of SmolLM2's weights (1.4% at 1e-3), so the server samples another policy than the
#: trainer's (docs/benchmarks.md, "bf16 or fp32 servers").
BF16_MIN_LEARNING_RATE = 1e-3


def test_there_are_examples() -> None:
    assert {path.name for path in EXAMPLES} >= {
        "tiny-llama-emit-token.toml",
        "smollm2-emit-newline.toml",
        "tiny-llama-vllm.toml",
        "smollm2-vllm.toml",
        "tiny-llama-math.toml",
        "tiny-llama-answer-tag.toml",
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
        # The servers sample the policy the trainer trains.
        assert (
            config.vllm.dtype == "float32"
            or config.trainer.learning_rate >= BF16_MIN_LEARNING_RATE
        )
    # No cache directory of the author's machine, no pinned digest: it runs anywhere.
    assert config.model.cache_dir == "" and config.model.digest == ""
    if config.task.kind == "dataset":
        # Its data and its reward beside it, found from the config alone.
        assert config.task.digest == "" and Path(config.task.path).is_file()
        assert Path(config.task.path).parent == example.parent
        reward_file = Path(config.reward.function.rpartition(":")[0])
        assert reward_file.is_file() and reward_file.parent == example.parent
    command = f"rollout-recovery run --config {example.relative_to(ROOT)} --out"
    assert command in (ROOT / "README.md").read_text()
