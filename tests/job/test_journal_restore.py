"""Zero loss between checkpoints: SIGKILL the real job, rerun it, and every seal it had
journaled is still there; training after the checkpoint rolls back; weight versions stay
unique; the reuse policy decides what a restore keeps; torn and altered journals.

Each test runs the CLI in a child process group and SIGKILLs the group on an observed
output line (never after a sleep). Checkpoints are rare (``every_steps`` large), so most
of the work a kill interrupts lies after the newest checkpoint: exactly what the journal
must keep.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import FAST, merge_sections, run_cli_once, sections_to_toml

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.dataplane import SqliteDataPlane
from rollout_recovery.history import audit_run
from rollout_recovery.history._trail_check import check_trail
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.history.records import (
    AttemptsAbandoned,
    BatchAdmitted,
    GroupPublished,
    GroupSealed,
    PromptDropped,
    Restored,
    RoundStarted,
    RunStarted,
    SiblingSealed,
    StepTrained,
)
from rollout_recovery.rollout import FailureReason

Cli = Callable[..., subprocess.CompletedProcess[str]]

#: Slow calls and rare checkpoints: a kill at step 6 leaves ~5 steps of seals, publishes
#: and training after the bootstrap checkpoint.
JOURNAL_JOB: dict[str, dict[str, Any]] = {
    "job": {"steps": 12},
    "generation": {"call_latency_s": 0.004},
    "faults": {"straggler_rate": 0.2, "straggler_factor": 6.0},
    "checkpoint": {"every_steps": 50},
}


def seals(path: Path) -> dict[str, list[int]]:
    """Every journaled seal's rollout id -> its calls' weight versions."""
    found: dict[str, list[int]] = {}
    for entry in read_entries(path):
        record = entry.record
        if isinstance(record, SiblingSealed):
            found[record.seal.rollout_id] = record.seal.weight_versions
        elif isinstance(record, GroupSealed):
            found.update({seal.rollout_id: seal.weight_versions for seal in record.seals})
    return found


def dropped_groups(out: Path) -> set[str]:
    return {
        e.record.group_id
        for e in read_entries(out / "events.jsonl")
        if isinstance(e.record, PromptDropped)
    }


def kill_at_step(
    run_cli_until: Cli, out: Path, config: Path, step: int
) -> subprocess.CompletedProcess[str]:
    killed = run_cli_until(
        ["--out", str(out), "--config", str(config), "--plain"],
        stop=lambda line, lines: line.startswith(f"step {step - 1} ("),
    )
    assert killed.returncode == -9, killed.stdout
    return killed


#: The step the shared killed run (``killed_run``) is SIGKILLed at.
SHARED_KILL_STEP = 6


@pytest.fixture(scope="module")
def killed_original(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One run of ``JOURNAL_JOB`` SIGKILLed on its step-6 line, and its config: shared by
    the tests below that each need *a* kill between checkpoints and then act on it (the
    kill's state is only read, on a private copy). Never change it."""
    root = tmp_path_factory.mktemp("journal-killed")
    config = root / "config.toml"
    config.write_text(sections_to_toml(merge_sections(FAST, JOURNAL_JOB)))
    out = root / "run"
    killed = run_cli_once(
        ["--out", str(out), "--config", str(config), "--plain"],
        stop=lambda line, lines: line.startswith(f"step {SHARED_KILL_STEP - 1} ("),
    )
    assert killed.returncode == -9, killed.stdout
    return out, config


@pytest.fixture
def killed_run(killed_original: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A private copy (mtimes kept) of the shared killed run, and its config."""
    original, config = killed_original
    out = tmp_path / "run"
    shutil.copytree(original, out)
    return out, config


@pytest.mark.slow
def test_a_sigkill_between_checkpoints_loses_no_seal(
    tmp_path: Path, killed_run: tuple[Path, Path], run_cli: Cli
) -> None:
    out, config = killed_run
    at_kill = tmp_path / "events-at-kill.jsonl"
    shutil.copy(out / "events.jsonl", at_kill)
    sealed_at_kill = seals(at_kill)
    trained_at_kill = {
        row.rollout_id
        for entry in read_entries(at_kill)
        if isinstance(entry.record, StepTrained)
        for row in entry.record.rows
    }
    assert len(trained_at_kill) >= 5 * 4 * 4, "the kill came before the work it must keep"

    finished = run_cli(["--out", str(out), "--config", str(config), "--plain"])
    assert finished.returncode == 0, finished.stdout

    report = check_trail(out)
    assert report.ok and report.complete, report.violations
    trained = {row.rollout_id for _, row in report.rows}
    # Every seal journaled before the kill was trained: reused, not regenerated.
    lost = set(sealed_at_kill) - trained
    assert not lost, f"{len(lost)} seals journaled before the kill were regenerated"
    # The rows trained before the kill were trained again, from the same seals, once.
    assert trained_at_kill <= trained
    restored = [e.record for e in read_entries(out / "events.jsonl")]
    (restore,) = [r for r in restored if isinstance(r, Restored)]
    assert restore.checkpoint == "step_000000" and restore.seals_lost == 0
    assert restore.rolled_back_steps == list(range(len(restore.rolled_back_steps)))
    assert len(restore.rolled_back_steps) >= 5
    assert audit_run(out).ok


@pytest.mark.slow
def test_weight_versions_continue_above_every_version_a_restore_lost(
    killed_run: tuple[Path, Path], run_cli: Cli
) -> None:
    out, config = killed_run
    before = [
        e.record.weight_version
        for e in read_entries(out / "events.jsonl")
        if isinstance(e.record, StepTrained)
    ]
    assert run_cli(["--out", str(out), "--config", str(config), "--plain"]).returncode == 0
    records = [e.record for e in read_entries(out / "events.jsonl")]
    versions = [r.weight_version for r in records if isinstance(r, StepTrained)]
    after = versions[len(before) :]
    assert len(versions) == len(set(versions)), "one version names two sets of weights"
    assert min(after) == max(before) + 1
    # The policy the run resumed from is the snapshot's: versions 1.. were rolled back.
    (restore,) = [r for r in records if isinstance(r, Restored)]
    assert restore.rolled_back_steps == list(range(len(before)))


@pytest.mark.slow
@pytest.mark.parametrize("reuse", ["all", "ancestors", "none"])
def test_the_reuse_policy_decides_what_a_restore_keeps(
    write_config: Callable[..., Path],
    killed_run: tuple[Path, Path],
    run_cli: Cli,
    reuse: str,
) -> None:
    out, _ = killed_run
    journaled = seals(out / "events.jsonl")
    # The policy is operational: the rerun may choose it.
    second = write_config({**JOURNAL_JOB, "recovery": {"reuse": reuse}})
    finished = run_cli(["--out", str(out), "--config", str(second), "--plain"])
    assert finished.returncode == 0, finished.stdout
    records = [e.record for e in read_entries(out / "events.jsonl")]
    (restore,) = [r for r in records if isinstance(r, Restored)]
    assert restore.reuse == reuse
    discarded = {seal.rollout_id for seal in restore.discarded}
    assert restore.seals_lost == len(discarded)
    assert restore.tokens_lost == sum(seal.tokens for seal in restore.discarded)
    lineage = {0}  # the snapshot (the bootstrap checkpoint) is weight version 0
    if reuse == "all":
        assert discarded == set()
    elif reuse == "none":
        assert discarded == set(journaled) and discarded
    else:
        # A group keeps its seals only if every one was made by versions the restored
        # policy descends from (GRPO trains a group together); dropped groups are moot.
        lost = {rid for rid, versions in journaled.items() if not set(versions) <= lineage}
        groups = {rid.split("_g")[0] for rid in lost} - dropped_groups(out)
        expected = {rid for rid in journaled if rid.split("_g")[0] in groups}
        assert discarded == expected
        assert discarded and set(journaled) - discarded
    report = check_trail(out)
    assert report.ok and report.complete, report.violations
    trained = {row.rollout_id for _, row in report.rows}
    assert not discarded & trained, "a discarded seal was trained"
    assert set(journaled) - discarded <= trained
    assert audit_run(out).ok


@pytest.mark.slow
def test_a_torn_journal_tail_is_cut_and_said(killed_run: tuple[Path, Path], run_cli: Cli) -> None:
    out, config = killed_run
    with open(out / "events.jsonl", "ab") as handle:
        handle.write(b'{"crc":"0000abcd","event":"sibling_sea')  # a write a power cut tore
    result = run_cli(["--out", str(out), "--config", str(config), "--plain"])
    assert result.returncode == 0, result.stdout
    records = [e.record for e in read_entries(out / "events.jsonl")]
    (restore,) = [r for r in records if isinstance(r, Restored)]
    assert restore.torn_tail_bytes == len(b'{"crc":"0000abcd","event":"sibling_sea')
    assert audit_run(out).ok


@pytest.mark.slow
def test_a_journal_altered_before_its_end_stops_the_run_saying_why(
    killed_run: tuple[Path, Path], run_cli: Cli
) -> None:
    out, config = killed_run
    entries = read_entries(out / "events.jsonl")
    middle = entries[len(entries) // 2]
    data = bytearray((out / "events.jsonl").read_bytes())
    data[middle.offset + 25] ^= 0x01
    (out / "events.jsonl").write_bytes(bytes(data))
    before = (out / "events.jsonl").read_bytes()
    result = run_cli(["--out", str(out), "--config", str(config), "--plain"])
    assert result.returncode == 1, result.stdout
    assert "this run cannot continue" in result.stdout
    assert f"events.jsonl:{middle.line}" in result.stdout
    assert "rerun the same command" not in result.stdout
    assert (out / "events.jsonl").read_bytes() == before  # nothing was "repaired"


@pytest.mark.slow
def test_a_crash_inside_the_replay_is_resumed_by_the_next_start(
    killed_run: tuple[Path, Path], run_cli: Cli
) -> None:
    out, config = killed_run
    sealed = seals(out / "events.jsonl")
    crashed = run_cli(
        ["--out", str(out), "--config", str(config), "--plain"],
        env={"ROLLOUT_RECOVERY_CRASH_AT": "replay.mid"},
    )
    assert crashed.returncode == -9 and "crash point replay.mid fired" in crashed.stdout
    assert run_cli(["--out", str(out), "--config", str(config), "--plain"]).returncode == 0
    report = check_trail(out)
    assert report.ok and report.complete
    assert set(sealed) <= {row.rollout_id for _, row in report.rows}
    records = [e.record for e in read_entries(out / "events.jsonl")]
    starts = [r for r in records if isinstance(r, RunStarted)]
    assert len(starts) == 2  # the replay the crash cut wrote nothing


@pytest.mark.slow
def test_a_restore_that_rolls_training_back_keeps_generation_inside_the_window(
    tmp_path: Path, write_config: Callable[..., Path], run_cli_until: Cli, run_cli: Cli
) -> None:
    """Groups admitted before the kill for a step the rolled-back trainer is again too far
    from wait for the staleness window, as a fresh admission would: on staleness 0 no
    round after the restore starts for a step other than the one being trained."""
    config = write_config({**JOURNAL_JOB, "job": {"steps": 12, "staleness_window": 0}})
    out = tmp_path / "run"
    kill_at_step(run_cli_until, out, config, 6)
    assert run_cli(["--out", str(out), "--config", str(config), "--plain"]).returncode == 0
    records = [e.record for e in read_entries(out / "events.jsonl")]
    (restore_at,) = [i for i, r in enumerate(records) if isinstance(r, Restored)]
    restore = records[restore_at]
    assert isinstance(restore, Restored) and restore.rolled_back_steps
    target = {
        group_id: r.target_step
        for r in records
        if isinstance(r, BatchAdmitted)
        for group_id in r.group_ids
    }
    step, early = restore.step, []
    for record in records[restore_at:]:
        if isinstance(record, StepTrained):
            step = record.step + 1
        elif isinstance(record, RoundStarted) and target[record.group_id] > step:
            early.append((record.group_id, target[record.group_id], step))
    assert not early, f"rounds started outside the window (group, target, step): {early[:5]}"
    assert check_trail(out).ok


@pytest.mark.slow
def test_kills_in_a_row_do_not_spend_the_retry_budget_of_interrupted_groups(
    tmp_path: Path, write_config: Callable[..., Path], run_cli_until: Cli, run_cli: Cli
) -> None:
    # One round per group and no faults: the only thing that ends a round early is a
    # kill. A round a kill interrupted must not count, or every group in flight at the
    # kill is dropped at the rerun (and its step stranded short).
    config = write_config(
        {**JOURNAL_JOB, "retry": {"max_rounds": 1}, "faults": {}}, faults_off=True
    )
    out = tmp_path / "run"
    kill_at_step(run_cli_until, out, config, 3)
    kill_at_step(run_cli_until, out, config, 5)
    finished = run_cli(["--out", str(out), "--config", str(config), "--plain"])
    assert finished.returncode == 0, finished.stdout
    records = [e.record for e in read_entries(out / "events.jsonl")]
    interrupted = [
        r
        for r in records
        if isinstance(r, AttemptsAbandoned)
        and all(a.reason is FailureReason.RESTART for a in r.attempts)
    ]
    assert interrupted, "no kill found a group generating"
    rounds = [r for r in records if isinstance(r, RoundStarted)]
    assert {r.group_id for r in interrupted} <= {r.group_id for r in rounds if r.round == 1}
    assert not [r for r in records if isinstance(r, PromptDropped)]
    assert audit_run(out).ok


@pytest.mark.slow
def test_a_restore_counts_lost_only_the_tokens_of_the_attempts_the_kill_interrupted(
    tmp_path: Path, write_config: Callable[..., Path], run_cli_until: Cli, run_cli: Cli
) -> None:
    # Checkpoints every 2 steps: the staged rows of published groups wait in the store for
    # deferred deletion, next to the rows of the attempts in flight at the kill.
    # Attempt-level resume: every staged call of an interrupted attempt is lost (call-level
    # resume keeps them; tests/rollout/test_backend_resume.py counts that). Two calls an
    # episode, so the call count below lands mid-run.
    config = write_config(
        {
            **JOURNAL_JOB,
            "checkpoint": {"every_steps": 2, "keep": 3},
            "recovery": {"resume": "attempt"},
            "task": {"thinking_calls": 1},
        }
    )
    out = tmp_path / "run"
    args = ["--out", str(out), "--config", str(config), "--plain"]
    # Killed right after a call was staged (32 calls a step: about step 5), so at least
    # one interrupted attempt has a staged call.
    killed = run_cli(args, env={"ROLLOUT_RECOVERY_CRASH_AT": "capture.before_ack:160"})
    assert killed.returncode == -9, killed.stdout
    dispatched: set[str] = set()
    closed: set[str] = set()
    published: set[str] = set()
    for entry in read_entries(out / "events.jsonl"):
        record = entry.record
        if isinstance(record, RoundStarted):
            dispatched.update(a.rollout_id for a in record.dispatched)
        elif isinstance(record, SiblingSealed):
            closed.add(record.seal.rollout_id)
        elif isinstance(record, GroupSealed):
            closed.update(seal.rollout_id for seal in record.seals)
        elif isinstance(record, AttemptsAbandoned):
            closed.update(a.rollout_id for a in record.attempts)
        elif isinstance(record, PromptDropped):
            closed.update(r for r in dispatched if r.startswith(f"{record.group_id}_g"))
        elif isinstance(record, GroupPublished):
            published.add(record.group_id)
    interrupted = dispatched - closed
    with SqliteDataPlane(out / "dataplane.sqlite") as store:
        keys = store.keys(CaptureWriter.staging_partition)
        mine = [key for key in keys if key.split("/")[0] in interrupted]
        expected = sum(
            int(row.token_mask.sum()) for row in store.get(CaptureWriter.staging_partition, mine)
        )
        waiting = [key for key in keys if key.split("_g")[0] in published]
    assert mine, "no call of an interrupted attempt was staged at the kill"
    assert waiting, "no published group's rows were waiting for deferred deletion"
    finished = run_cli(args)
    assert finished.returncode == 0, finished.stdout
    (restore,) = [
        e.record for e in read_entries(out / "events.jsonl") if isinstance(e.record, Restored)
    ]
    assert restore.tokens_in_flight_lost == expected
    assert restore.tokens_lost == 0  # reuse = "all"
