"""The dataset task as a job (issue 27 items 1, 2 and 4): a user's rows and reward function
train the tiny Llama; each row of an epoch is trained in exactly one group, in the
dataloader's order, across a SIGKILL (the audit checks it against the dataset); a reward
that raises, returns NaN or no number, or hangs, fails its completion, never the run;
each step's metrics hold sample completions and the reward's components."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dataset_support import ROWS, dataset_job_toml, write_dataset, write_reward

from rollout_recovery._sampler import dataset_position_to_idx
from rollout_recovery.control import load_config
from rollout_recovery.errors import JobMismatchError
from rollout_recovery.history import audit_run
from rollout_recovery.history._trail_reader import read_records
from rollout_recovery.history.records import PromptTaken, SiblingSealed, StepTrained
from rollout_recovery.job import run_job

pytest.importorskip("datasets")

Cli = Callable[..., subprocess.CompletedProcess[str]]
CHILD_TIMEOUT_S = 600.0


def _config(tmp_path: Path, model_cache: Path, reward_body: str | None = None, **kw: Any) -> Path:
    data = write_dataset(tmp_path / "data", "jsonl")
    reward = write_reward(tmp_path, reward_body) if reward_body else write_reward(tmp_path)
    path = tmp_path / "job.toml"
    path.write_text(
        dataset_job_toml(data=data, reward=f"{reward}:score", model_cache=model_cache, **kw)
    )
    return path


def _records(run: Path) -> list[Any]:
    return [record for _, record in read_records(run / "events.jsonl")]


def _metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_dataset_job_trains_each_row_once_and_shows_what_the_model_said(
    tmp_path: Path, model_cache: Path
) -> None:
    # 3 steps x 4 prompts: the 12 rows, one epoch.
    config = load_config(_config(tmp_path, model_cache))
    out = tmp_path / "run"
    result = run_job(out, config)
    assert result.summary.steps == 3 and result.summary.prompts_trained == len(ROWS)
    taken = [r for r in _records(out) if isinstance(r, PromptTaken)]
    assert [r.prompt_idx for r in taken] == [
        dataset_position_to_idx(p, size=len(ROWS), seed=3) for p in range(len(ROWS))
    ]
    assert sorted(r.prompt_idx for r in taken) == list(range(len(ROWS)))
    report = audit_run(out)
    assert report.ok and report.complete, report.violations
    assert report.counts["dataset_rows"] == len(ROWS)
    assert report.counts["dataset_rows_trained"] == len(ROWS)
    assert report.counts["dataset_epochs_complete"] == 1
    assert report.counts["dataset_digest"] == "matches"
    # Each step: two samples as text, and the mean of each reward component.
    for step in _metrics(out):
        samples = step["samples"]
        assert len(samples) == 2
        for sample in samples:
            assert sample["prompt"] == ROWS[sample["prompt_idx"]]["prompt"]
            assert isinstance(sample["completion"], str) and sample["reward"] is not None
            assert set(sample["components"]) == {"correct", "short"}
        assert set(step["reward_components"]) == {"correct", "short"}
        assert step["reward_components_rows"] == 8
        assert step["reward_components"]["short"] == pytest.approx(0.1)


def test_changed_data_is_another_job(tmp_path: Path, model_cache: Path) -> None:
    config_path = _config(tmp_path, model_cache, steps=1)
    out = tmp_path / "run"
    run_job(out, load_config(config_path))
    write_dataset(tmp_path / "data", "jsonl", [*ROWS[:-1], {**ROWS[-1], "answer": 1000}])
    with pytest.raises(JobMismatchError, match=r"\$\.task\.digest"):
        run_job(out, load_config(config_path))
    # The audit sees the changed data too.
    report = audit_run(out)
    assert report.counts["dataset_digest"] == "differs" and not report.ok


# A reward broken four ways, by the row's answer: raises, NaN, no number, hangs once.
BROKEN = """
    import threading

    _hung = threading.Event()

    def score(completion, answer):
        if answer == 0:
            raise ZeroDivisionError("no reward for zero")
        if answer == 1:
            return float("nan")
        if answer == 2:
            return "two"
        if answer == 3 and not _hung.is_set():
            _hung.set()
            threading.Event().wait()  # never returns: past [reward] timeout_s
        return {"length": float(len(completion))}
"""


@pytest.mark.slow
def test_a_broken_reward_fails_its_completions_never_the_run(
    tmp_path: Path, model_cache: Path
) -> None:
    config = load_config(_config_with_timeout(tmp_path, model_cache))
    out = tmp_path / "run"
    result = run_job(out, config)
    assert result.summary.steps == 3
    failures: dict[str, int] = {}
    for record in _records(out):
        if isinstance(record, SiblingSealed) and record.seal.mask_sample:
            reason = record.seal.receipt["failure_reason"]
            failures[reason] = failures.get(reason, 0) + 1
    # Rows 0+0 (answer 0), 0+1 and 1+0 (answer 1), 0+2, 1+1, 2+0 (answer 2): 2 siblings each.
    assert failures.get("data_error:reward_raised") == 2
    assert failures.get("data_error:reward_not_finite") == 4
    assert failures.get("data_error:reward_not_a_number") == 6
    assert failures.get("data_error:reward_timeout") == 1
    reasons: dict[str, int] = {}
    for step in _metrics(out):
        for reason, count in step["placeholder_reasons"].items():
            reasons[reason] = reasons.get(reason, 0) + count
    assert sum(reasons.values()) == 13 and all("reward_" in r for r in reasons)
    assert audit_run(out).ok


def _config_with_timeout(tmp_path: Path, model_cache: Path) -> Any:
    path = _config(tmp_path, model_cache, BROKEN)
    text = path.read_text().replace(
        '[reward]\nfunction = "', '[reward]\ntimeout_s = 5.0\nfunction = "'
    )
    path.write_text(text)
    return path


@pytest.mark.slow
def test_sigkill_mid_epoch_keeps_exactly_once_in_the_dataloaders_order(
    tmp_path: Path, model_cache: Path, run_cli: Cli, run_cli_until: Cli
) -> None:
    """``rollout-recovery run`` killed with SIGKILL after its second step, then rerun:
    the rows taken before the kill keep their groups, the rest follow in the dataloader's
    order, and every row of the epoch is trained in exactly one group."""
    config_path = _config(tmp_path, model_cache)
    out = tmp_path / "run"
    args = ["--config", str(config_path), "--out", str(out), "--plain"]

    def second_step(line: str, lines: list[str]) -> bool:
        return line.startswith("step 1 ")

    killed = run_cli_until(args, stop=second_step, timeout=CHILD_TIMEOUT_S)
    assert killed.returncode == -signal.SIGKILL, killed.stdout
    rerun = run_cli(args, timeout=CHILD_TIMEOUT_S)
    assert rerun.returncode == 0, rerun.stdout
    assert "resumed from" in rerun.stdout
    records = _records(out)
    taken = [r for r in records if isinstance(r, PromptTaken)]
    positions = sorted({r.position: r.prompt_idx for r in taken}.items())
    assert [idx for _, idx in positions] == [
        dataset_position_to_idx(p, size=len(ROWS), seed=3) for p in range(len(ROWS))
    ]
    report = audit_run(out)
    assert report.ok and report.complete, report.violations
    assert report.counts["dataset_epochs_complete"] == 1
    trained = [
        row.prompt_idx
        for record in records
        if isinstance(record, StepTrained)
        for row in record.rows
        if row.generation_index == 0
    ]
    # Rolled-back steps are trained again; their rows once each in what survived.
    assert set(trained) == set(range(len(ROWS)))
