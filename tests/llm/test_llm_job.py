"""The LLM job as a user runs it: ``examples/tiny-llama-emit-token.toml`` through
``run_job`` and through the real ``rollout-recovery run``. It learns; a SIGKILL mid-run
costs nothing (rerun, audit passes, trainer state restored exactly); the checkpoint holds
the trainer's state as safetensors and JSON, never pickle."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import merge_sections, sections_to_toml

from rollout_recovery.control import load_config
from rollout_recovery.errors import JobMismatchError
from rollout_recovery.history import audit_run
from rollout_recovery.history._trail_reader import read_records
from rollout_recovery.history.records import Restored
from rollout_recovery.job import run_job
from rollout_recovery.job._run_job import JobResult
from rollout_recovery.llm._model_source import model_digest
from rollout_recovery.rundir import CheckpointStore

Cli = Callable[..., subprocess.CompletedProcess[str]]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY_EXAMPLE = EXAMPLES / "tiny-llama-emit-token.toml"
TRAINER_FILES = ("trainer.model.safetensors", "trainer.optimizer.safetensors", "trainer.state.json")
#: A child imports torch and transformers, then trains 30 tiny steps: minutes at worst on
#: a loaded machine.
CHILD_TIMEOUT_S = 600.0
#: The uninterrupted run's steps (the example's own is 30).
CLEAN_STEPS = 20
#: The kill test's job: the example's first 10 steps, killed after its checkpoint at step 5.
KILLED_STEPS = 10


def example_config(
    example: Path, directory: Path, model_cache: Path, overrides: dict[str, Any] | None = None
) -> Path:
    """A copy of an example with the test's model cache (and ``overrides``)."""
    sections = tomllib.loads(example.read_text())
    layers = (sections, {"model": {"cache_dir": str(model_cache)}}, overrides)
    path = directory / example.name
    path.write_text(sections_to_toml(merge_sections(*layers)))
    return path


@dataclass(frozen=True)
class CleanRun:
    config_path: Path
    out: Path
    result: JobResult
    cpu_s: float


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> CleanRun:
    """The tiny example run once, uninterrupted, in process (every checkpoint kept): what
    the learning test checks and what the kill test compares a killed run with.

    Its first ``CLEAN_STEPS`` steps, not the example's 30: the reward is near 1.0 by then
    and the last 10 steps (a third of the fixture's time) proved nothing more."""
    directory = tmp_path_factory.mktemp("clean")
    overrides = {"checkpoint": {"keep": 10}, "job": {"steps": CLEAN_STEPS}}
    config_path = example_config(TINY_EXAMPLE, directory, model_cache, overrides)
    started = time.process_time()
    result = run_job(directory / "run", load_config(config_path))
    return CleanRun(config_path, directory / "run", result, time.process_time() - started)


@pytest.mark.slow
def test_the_tiny_example_learns_to_emit_the_target(clean_run: CleanRun, model_cache: Path) -> None:
    """20 steps of 8 prompts x 4 samples: mean reward from about 0 in the first tenth of
    the steps to about 1.0 in the last (measured: 0.004 -> 0.996 in 20 steps; 0.004 ->
    0.999 in 30, reward 0.5 near step 12)."""
    config = load_config(clean_run.config_path)
    assert config.trainer.kind == "torch" and config.generation.backend == "transformers"
    summary = clean_run.result.summary
    assert summary.steps == CLEAN_STEPS and summary.prompts_trained == CLEAN_STEPS * 8
    first, last = summary.first_tenth_reward, summary.last_tenth_reward
    assert first is not None and last is not None
    assert first < 0.1 and last > 0.6, (first, last)
    # The bound of 3 CPU seconds a step the example's 30 steps had (90 s).
    assert clean_run.cpu_s < 3.0 * CLEAN_STEPS, clean_run.cpu_s
    run = clean_run.out
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(CLEAN_STEPS))
    assert all(m["train/skipped"] == 0.0 for m in metrics)
    assert audit_run(run).ok
    # The model's digest is the job's identity, recorded at the first start.
    recorded = tomllib.loads((run / "job.toml").read_text())["model"]["digest"]
    assert recorded == model_digest(Path(model_cache) / _only_model(model_cache))
    # The trainer's state as safetensors + JSON in every checkpoint, no numpy archive.
    checkpoints = CheckpointStore(run, keep=1).committed()
    assert [c.step for c in checkpoints] == [20, 15, 10, 5, 0]
    for checkpoint in checkpoints:
        names = {p.name for p in checkpoint.directory.iterdir()}
        assert set(TRAINER_FILES) <= names and "policy.npz" not in names, names


def _only_model(cache: Path) -> str:
    (name,) = [p.name for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return name


def _trainer_files(checkpoint: Path) -> dict[str, bytes]:
    return {name: (checkpoint / name).read_bytes() for name in TRAINER_FILES}


def _same_but_version(mine: bytes, theirs: bytes, offset: int) -> None:
    meta, their_meta = json.loads(mine), json.loads(theirs)
    assert meta.pop("version") == their_meta.pop("version") + offset
    assert meta == their_meta


@pytest.mark.slow
def test_sigkill_of_the_cli_mid_run_costs_nothing(
    tmp_path: Path, clean_run: CleanRun, model_cache: Path, run_cli: Cli, run_cli_until: Cli
) -> None:
    """SIGKILL ``rollout-recovery run --config examples/tiny-llama-emit-token.toml`` after
    its second checkpoint, rerun the same command: the audit passes and, on policy
    (staleness 0; the backend seeds draws per sibling), the run ends with the very
    weights, AdamW moments and per-step rewards of an uninterrupted run. Any trainer state
    restored inexactly would show as different final weights.

    The killed job is the example cut to its first ``KILLED_STEPS`` steps: no step depends
    on ``job.steps`` (no schedule), so it must match the uninterrupted run's first
    ``KILLED_STEPS`` rewards and its checkpoint at that step, which ``clean_run`` keeps.
    The 20 steps after that proved nothing more and took two thirds of the test's time."""
    config_path = example_config(
        TINY_EXAMPLE,
        tmp_path,
        model_cache,
        {"checkpoint": {"keep": 10}, "job": {"steps": KILLED_STEPS}},
    )
    out = tmp_path / "killed"
    args = ["--config", str(config_path), "--out", str(out), "--plain"]

    def second_checkpoint(line: str, lines: list[str]) -> bool:
        # "step 5 (6/10 done) reward=... checkpoints=2": the bootstrap checkpoint is number 1.
        # Reading this line is the kill's trigger: the job still has 4 steps to train, each
        # a batch of 32 sampled completions, so it cannot end before the SIGKILL lands.
        return line.startswith("step ") and int(line.rsplit("checkpoints=", 1)[1]) >= 2

    killed = run_cli_until(args, stop=second_checkpoint, timeout=CHILD_TIMEOUT_S)
    assert killed.returncode == -signal.SIGKILL, killed.stdout
    latest = (out / "checkpoints" / "LATEST").read_text().strip()
    before_rerun = _trainer_files(out / "checkpoints" / latest)

    rerun = run_cli(args, timeout=CHILD_TIMEOUT_S)
    assert rerun.returncode == 0, rerun.stdout
    assert f"resumed from {latest}" in rerun.stdout
    report = audit_run(out)
    assert report.ok and report.complete, report.violations[:10]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(KILLED_STEPS))

    clean = clean_run.out
    clean_metrics = [
        json.loads(line) for line in (clean / "metrics.jsonl").read_text().splitlines()
    ][:KILLED_STEPS]
    assert [m["mean_reward"] for m in metrics] == [m["mean_reward"] for m in clean_metrics]
    # What the killed run checkpointed is what the uninterrupted run had at that step...
    assert before_rerun == _trainer_files(clean / "checkpoints" / latest)
    # ...and what it ended with too. The one difference: steps trained after the
    # checkpoint and before the kill were rolled back and trained again under new version
    # numbers (a version names one set of weights), so it ends that many versions ahead.
    rolled_back = sum(
        len(record.rolled_back_steps)
        for _, record in read_records(out / "events.jsonl")
        if isinstance(record, Restored)
    )
    assert latest == "step_000005", latest
    final = _trainer_files(out / "checkpoints" / f"step_{KILLED_STEPS:06d}")
    expected = _trainer_files(clean / "checkpoints" / f"step_{KILLED_STEPS:06d}")
    for name in TRAINER_FILES[:2]:
        assert final[name] == expected[name], name
    _same_but_version(final["trainer.state.json"], expected["trainer.state.json"], rolled_back)


def test_changed_model_files_are_another_job(tmp_path: Path, model_cache: Path) -> None:
    """The run directory records the model's digest: a rerun against changed files is
    refused naming ``$.model.digest``, and nothing in the directory changes."""
    model = tmp_path / "model"
    shutil.copytree(Path(model_cache) / _only_model(model_cache), model)
    config_path = example_config(
        TINY_EXAMPLE, tmp_path, model_cache, {"model": {"source": str(model)}, "job": {"steps": 1}}
    )
    out = tmp_path / "run"
    run_job(out, load_config(config_path))
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    config = json.loads((model / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(JobMismatchError, match=r"\$\.model\.digest") as refused:
        run_job(out, load_config(config_path))
    assert any(d.startswith("$.model.digest") for d in refused.value.differences)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
