"""``rollout-recovery run`` end to end: a fresh run, learning, resume, refusals, fallback.

Most runs are in process (``run_job``) on the small fast job of ``conftest.py``; the ones
whose subject is the command (exit codes, messages, kills) run the CLI in a child process
group and synchronize on its output lines.
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rollout_recovery.checkpoint._sidecar_io import SIDECAR_FILENAMES
from rollout_recovery.cli._main import cli
from rollout_recovery.control import RunConfig, load_config
from rollout_recovery.history._trail_check import check_trail
from rollout_recovery.job import run_job
from rollout_recovery.job._run_job import JobResult
from rollout_recovery.rundir import CheckpointStore

Cli = Callable[..., subprocess.CompletedProcess[str]]
Snapshot = Callable[[Path], dict[str, tuple[int, int, str]]]
ReadJsonl = Callable[[Path], list[dict[str, Any]]]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEP_LINE = re.compile(r"^step \d+ \((\d+)/(\d+) done\) ")

#: The learning job: the default policy, data, faults and deadlines; only the job is
#: shorter and the model calls faster.
LEARNING: dict[str, dict[str, Any]] = {
    "job": {"steps": 30, "seed": 0},
    "generation": {"call_latency_s": 0.002},
}


def tenth_means(rewards: list[float]) -> tuple[float, float]:
    tenth = max(1, math.ceil(len(rewards) / 10))
    return sum(rewards[:tenth]) / tenth, sum(rewards[-tenth:]) / tenth


def assert_trail_ok(out: Path, config: RunConfig) -> dict[str, int]:
    report = check_trail(out, group_size=config.job.generations_per_prompt)
    assert report.ok, "\n".join(report.violations[:20])
    return report.counts


def assert_one_metrics_line_per_step(read_jsonl: ReadJsonl, out: Path, steps: int) -> list[Any]:
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(steps))
    return metrics


def step_at_least(minimum: int) -> Callable[[str, list[str]], bool]:
    def stop(line: str, lines: list[str]) -> bool:
        match = STEP_LINE.match(line)
        return match is not None and int(match.group(1)) >= minimum

    return stop


# -------------------------------------------------------------------------- fresh run


def test_fresh_run_finishes_with_a_consistent_trail_and_summary(
    finished_run_original: tuple[Path, RunConfig, JobResult], read_jsonl: ReadJsonl
) -> None:
    out, config, result = finished_run_original
    job = config.job
    counts = assert_trail_ok(out, config)

    metrics = assert_one_metrics_line_per_step(read_jsonl, out, job.steps)
    assert sum(m["groups"] for m in metrics) == counts["groups_trained"]
    assert all(m["rows"] == m["groups"] * job.generations_per_prompt for m in metrics)

    png = (out / "reward.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 1000

    summary = result.summary
    assert result.restored is None and result.skipped == []
    assert summary.steps == job.steps
    assert summary.prompts_taken == job.steps * job.prompts_per_step == counts["prompts_taken"]
    assert summary.prompts_trained + summary.prompts_dropped == summary.prompts_taken
    assert summary.prompts_trained == counts["groups_trained"]
    assert summary.prompts_dropped == counts["prompts_dropped"]
    assert summary.attempts >= summary.prompts_taken * job.generations_per_prompt
    # The bootstrap checkpoint, one every K steps, none extra at the end (10 is a multiple).
    assert summary.checkpoints == 1 + job.steps // config.checkpoint.every_steps
    assert summary.restores == 0
    rewards = [m["mean_reward"] for m in metrics]
    assert (summary.first_tenth_reward, summary.last_tenth_reward) == pytest.approx(
        tenth_means(rewards)
    )
    # Checkpoints: the newest `keep`, LATEST naming the last one.
    store = CheckpointStore(out, keep=config.checkpoint.keep)
    assert [c.step for c in store.committed()] == [10, 8, 6]
    assert store.latest_hint() == "step_000010"
    events = read_jsonl(out / "events.jsonl")
    committed = [e["step"] for e in events if e["event"] == "checkpoint_committed"]
    assert committed == [0, 2, 4, 6, 8, 10]


# --------------------------------------------------------------------------- learning


@pytest.mark.slow
def test_default_policy_learns(
    tmp_path: Path, fast_config: Callable[..., RunConfig], read_jsonl: ReadJsonl
) -> None:
    config = fast_config(LEARNING, fast=False)
    out = tmp_path / "run"
    result = run_job(out, config)
    metrics = assert_one_metrics_line_per_step(read_jsonl, out, config.job.steps)
    first, last = tenth_means([m["mean_reward"] for m in metrics])
    assert last >= first + 0.3, (first, last)
    assert result.summary.last_tenth_reward == pytest.approx(last)
    assert_trail_ok(out, config)


@pytest.mark.slow
def test_run_killed_and_resumed_twice_learns_as_well(
    tmp_path: Path,
    write_config: Callable[..., Path],
    fast_config: Callable[..., RunConfig],
    run_cli: Cli,
    run_cli_until: Cli,
    read_jsonl: ReadJsonl,
) -> None:
    overrides = {**LEARNING, "checkpoint": {"every_steps": 4}}
    config = fast_config(overrides, fast=False)
    args = ["--out", str(tmp_path / "run"), "--config", str(write_config(overrides, fast=False))]
    args.append("--plain")
    out = tmp_path / "run"

    def newest_checkpoint() -> int:
        # Read after each kill: a kill can land a step or two after the step that asked
        # for it, so the checkpoint a resume must take is the one on disk, not a constant.
        return CheckpointStore(out, keep=config.checkpoint.keep).committed()[0].step

    def past(step: int, checkpoint: int) -> Callable[[str, list[str]], bool]:
        # Checkpoints are written in the background: the step line can come before the
        # checkpoint it asked for is published, so the kill waits for that one too.
        at_least = step_at_least(step)
        return lambda line, lines: at_least(line, lines) and newest_checkpoint() >= checkpoint

    first = run_cli_until(args, stop=past(9, 8))
    assert first.returncode == -9, first.stdout
    one = newest_checkpoint()
    second = run_cli_until(args, stop=past(21, 20))
    assert second.returncode == -9, second.stdout
    assert f"resumed from step_{one:06d}: step {one}" in second.stdout, second.stdout
    two = newest_checkpoint()
    final = run_cli(args)
    assert final.returncode == 0, final.stdout
    assert f"resumed from step_{two:06d}: step {two}" in final.stdout, final.stdout
    assert one >= 8 and two >= 20

    metrics = assert_one_metrics_line_per_step(read_jsonl, out, config.job.steps)
    first_tenth, last_tenth = tenth_means([m["mean_reward"] for m in metrics])
    assert last_tenth >= first_tenth + 0.3, (first_tenth, last_tenth)
    assert_trail_ok(out, config)
    runs = [line["event"] for line in read_jsonl(out / "run_log.jsonl")]
    assert runs == ["start", "resume", "resume"]
    restored = [e for e in read_jsonl(out / "events.jsonl") if e["event"] == "restored"]
    assert [e["step"] for e in restored] == [one, two]


# ------------------------------------------------------------ resume after completion


def test_rerunning_a_finished_run_does_nothing(
    finished_run: tuple[Path, RunConfig],
    write_config: Callable[..., Path],
    run_cli: Cli,
    dir_snapshot: Snapshot,
    read_jsonl: ReadJsonl,
) -> None:
    out, config = finished_run
    before = dir_snapshot(out)
    events_before = read_jsonl(out / "events.jsonl")

    result = run_cli(["--out", str(out), "--config", str(write_config()), "--plain"])

    assert result.returncode == 0, result.stdout
    assert "resumed from step_000010: step 10" in result.stdout
    assert not any(STEP_LINE.match(line) for line in result.stdout.splitlines())
    after = dir_snapshot(out)
    # Checkpoints untouched (mtimes included); the metrics the same bytes.
    checkpoints = {n: v for n, v in before.items() if n.startswith("checkpoints/")}
    assert checkpoints == {n: v for n, v in after.items() if n.startswith("checkpoints/")}
    (size, _, digest), (size_after, _, digest_after) = (
        before["metrics.jsonl"],
        after["metrics.jsonl"],
    )
    assert (size_after, digest_after) == (size, digest)
    # The journal is never cut: it gained the restore and the start, nothing else.
    events_after = read_jsonl(out / "events.jsonl")
    assert events_after[: len(events_before)] == events_before
    new = events_after[len(events_before) :]
    assert [e["event"] for e in new] == ["restored", "run_started"] and new[0]["step"] == 10
    assert new[0]["replayed_records"] >= 1 and new[0]["rolled_back_steps"] == []
    assert_trail_ok(out, config)


# ------------------------------------------------------------------- refusals


def test_a_directory_of_another_seed_is_refused_unchanged(
    finished_run: tuple[Path, RunConfig],
    write_config: Callable[..., Path],
    run_cli: Cli,
    dir_snapshot: Snapshot,
) -> None:
    out, config = finished_run
    assert config.job.seed == 0
    before = dir_snapshot(out)

    result = run_cli(["--out", str(out), "--config", str(write_config()), "--seed", "1"])

    assert result.returncode == 2, result.stdout
    assert "$.job.seed" in result.stdout and "0 != 1" in result.stdout
    assert dir_snapshot(out) == before


def test_a_non_empty_non_run_directory_is_refused_unchanged(
    tmp_path: Path, write_config: Callable[..., Path], run_cli: Cli, dir_snapshot: Snapshot
) -> None:
    out = tmp_path / "not-a-run"
    out.mkdir()
    (out / "notes.txt").write_text("my notes\n")
    before = dir_snapshot(out)

    result = run_cli(["--out", str(out), "--config", str(write_config()), "--plain"])

    assert result.returncode == 2, result.stdout
    assert "not a rollout-recovery run directory" in result.stdout
    assert dir_snapshot(out) == before


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("[faults]\nhang_rat = 0.1\n", ["$.faults", "hang_rat"]),
        ('[faults]\nhang_rate = "high"\n', ["$.faults.hang_rate"]),
        ("[faults]\nhang_rate = 1.5\n", ["$.faults.hang_rate"]),
        ("[job]\nsteps = 2.5\n", ["$.job.steps"]),
        ("[nonsense]\nx = 1\n", ["nonsense"]),
    ],
    ids=["unknown-key", "wrong-type", "out-of-range", "float-for-int", "unknown-section"],
)
def test_a_bad_config_is_a_usage_error_and_creates_nothing(
    tmp_path: Path, toml: str, expected: list[str]
) -> None:
    config_path = tmp_path / "bad.toml"
    config_path.write_text(toml)
    out = tmp_path / "run"

    result = CliRunner().invoke(
        cli, ["run", "--out", str(out), "--config", str(config_path), "--plain"]
    )

    assert result.exit_code == 2, result.output
    assert "Usage:" in result.output
    for fragment in expected:
        assert fragment in result.output
    assert not out.exists()


def test_print_config_reads_back_as_the_defaults(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["run", "--print-config"])
    assert result.exit_code == 0, result.output
    printed = tmp_path / "printed.toml"
    printed.write_text(result.output)
    assert load_config(printed) == load_config(None)
    # Every section of the config is printed.
    for section in RunConfig.__struct_fields__:
        assert f"[{section}]" in result.output


# ------------------------------------------------------- corrupt newest checkpoint


def test_a_corrupt_newest_sidecar_is_skipped_for_the_previous_checkpoint(
    finished_run: tuple[Path, RunConfig],
    write_config: Callable[..., Path],
    run_cli: Cli,
    read_jsonl: ReadJsonl,
) -> None:
    out, config = finished_run
    newest = out / "checkpoints" / "step_000010"
    [sidecar] = [newest / name for name in SIDECAR_FILENAMES if (newest / name).exists()]
    data = bytearray(sidecar.read_bytes())
    data[len(data) // 2] ^= 0xFF
    sidecar.write_bytes(bytes(data))

    result = run_cli(["--out", str(out), "--config", str(write_config()), "--plain"])

    assert result.returncode == 0, result.stdout
    assert f"skipping checkpoint step_000010: {sidecar.name}: sha256 mismatch" in result.stdout
    assert "resumed from step_000008: step 8" in result.stdout
    assert [m.group(1) for m in map(STEP_LINE.match, result.stdout.splitlines()) if m] == [
        "9",
        "10",
    ]
    assert_trail_ok(out, config)
    assert_one_metrics_line_per_step(read_jsonl, out, config.job.steps)
    # The re-saved step_000010 is whole again.
    store = CheckpointStore(out, keep=config.checkpoint.keep)
    assert store.committed()[0].step == 10
    store.load(store.committed()[0])


def test_an_uncommitted_newest_checkpoint_is_skipped_for_the_previous_one(
    finished_run: tuple[Path, RunConfig], read_jsonl: ReadJsonl
) -> None:
    out, config = finished_run
    (out / "checkpoints" / "step_000010" / "COMMITTED").unlink()
    messages: list[str] = []

    result = run_job(out, config, log=messages.append)

    assert [(s.name, s.step) for s in result.skipped] == [("step_000010", 10)]
    assert "missing COMMITTED" in result.skipped[0].reason
    assert result.restored is not None and result.restored.step == 8
    assert any(m.startswith("skipping checkpoint step_000010: missing COMMITTED") for m in messages)
    assert any(m.startswith("resumed from step_000008: step 8") for m in messages)
    assert result.summary.steps == config.job.steps
    assert_trail_ok(out, config)
    metrics = assert_one_metrics_line_per_step(read_jsonl, out, config.job.steps)
    assert len(metrics) == config.job.steps
