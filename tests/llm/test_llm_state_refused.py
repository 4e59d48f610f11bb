"""The torch job: a checkpoint whose ``trainer.state.json`` was edited (an RNG word of
2**70, its manifest updated so the checkpoint still loads) is skipped for the previous
checkpoint at the next start, instead of a traceback on every rerun (issue 24, item 18)."""

from __future__ import annotations

import json
from pathlib import Path

from run_fixtures import rewrite_checkpoint_file
from test_llm_job import TINY_EXAMPLE, example_config

from rollout_recovery.control import load_config
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job

SMALL = {
    "job": {"steps": 4, "prompts_per_step": 4},
    "checkpoint": {"every_steps": 2, "keep": 3},
}


def test_an_rng_word_past_its_width_skips_the_checkpoint_for_the_previous_one(
    tmp_path: Path, model_cache: Path
) -> None:
    out = tmp_path / "run"
    config = load_config(example_config(TINY_EXAMPLE, tmp_path, model_cache, SMALL))
    run_job(out, config)
    *_, previous, newest = sorted((out / "checkpoints").glob("step_*"))
    state = json.loads((newest / "trainer.state.json").read_bytes())
    state["python_rng"][1][3] = 2**70
    rewrite_checkpoint_file(newest, "trainer.state.json", json.dumps(state).encode())

    longer = {**SMALL, "job": {"steps": 6, "prompts_per_step": 4}}
    more = load_config(example_config(TINY_EXAMPLE, tmp_path, model_cache, longer))
    result = run_job(out, more)

    assert [skip.name for skip in result.skipped] == [newest.name]
    assert "bad RNG state" in result.skipped[0].reason
    assert result.restored is not None and result.restored.checkpoint == previous.name
    assert result.summary.steps == 6
    assert audit_run(out).ok
