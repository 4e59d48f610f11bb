"""``rollout-recovery audit``: a real small run passes; one hand-broken copy per invariant fails.

One run of 6 steps x 3 prompts x 3 generations is made once per module (checkpoints every
2 steps, 3 kept: steps 2, 4 and 6 remain; the cuts at steps 2 and 4 are held until the
ledger holds a sealed sibling, so those checkpoints own staged rows). Each test breaks a
private copy in one way and checks that the audit fails with a violation naming the ids
and, for the trail, the ``file:line`` involved.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from auditor_support import (
    PROMPTS,
    STEPS,
    History,
    N,
    SaveHeldUntilClear,
    checkpoints,
    checkpoints_wait_for_sealed_work,
    small_config,
    the_violation,
    with_row,
)
from click.testing import CliRunner

from rollout_recovery._crashpoints import CRASH_AT_ENV, reset_crash_points_for_tests
from rollout_recovery.capture import CaptureWriter
from rollout_recovery.cli._main import cli
from rollout_recovery.control._deferred import DeferredDeletionDataPlane
from rollout_recovery.dataplane import SqliteDataPlane
from rollout_recovery.dataplane._replay import CANONICAL_PARTITION
from rollout_recovery.errors import NotARunDirectoryError
from rollout_recovery.history import audit_run
from rollout_recovery.history._auditor import AuditReport
from rollout_recovery.history.records import StepTrained
from rollout_recovery.job import run_job
from rollout_recovery.rundir import CheckpointStore

EVENTS = "events.jsonl"

KEEP = 3  # of the checkpoints at steps 0, 2, 4, 6: 2, 4 and 6 remain


@pytest.fixture(scope="module")
def original_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's one good run: never change it (tests change copies)."""
    out = tmp_path_factory.mktemp("auditor") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(CRASH_AT_ENV, raising=False)
        reset_crash_points_for_tests()
        with checkpoints_wait_for_sealed_work({2, 4}):
            run_job(out, small_config(keep=KEEP))
        reset_crash_points_for_tests()
    return out


@pytest.fixture
def run(original_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(original_run, copy)
    return copy


def failed(run: Path) -> AuditReport:
    report = audit_run(run)
    assert not report.ok, "the audit passed a broken run"
    assert report.to_json()["verdict"] == "fail"
    return report


# -- the good run -----------------------------------------------------------------------


def test_the_good_run_passes_with_exact_counts(run: Path) -> None:
    report = audit_run(run)
    assert report.violations == []
    assert report.ok and report.complete
    assert report.audited_through_step == STEPS
    counts = report.counts
    assert counts["rows"] == STEPS * PROMPTS * N
    assert counts["groups"] == STEPS * PROMPTS
    assert counts["steps"] == STEPS
    assert counts["prompts_taken"] == STEPS * PROMPTS
    assert counts["dropped"] == 0
    assert counts["checkpoints"] == KEEP
    assert counts["restores"] == counts["reused"] == counts["regenerated"] == 0
    assert counts["torn_tail_bytes"] == 0
    # Every seal was trained or excused; the valid-row fraction is reported.
    assert counts["seals"] == counts["seals_trained"] + counts["seals_excused"]
    assert counts["valid_rows"] <= counts["rows"]
    assert counts["valid_row_fraction"] == round(counts["valid_rows"] / counts["rows"], 4)
    # The module run has what the checkpoint tests break.
    views = checkpoints(run, KEEP)
    assert [view.step for view in views] == [6, 4, 2]
    assert all(view.expected_staging for view in views if view.step in (2, 4))
    assert any(view.replay_rows for view in views)


def test_the_audit_changes_nothing(run: Path) -> None:
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    audit_run(run)
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before


# -- the history's invariants, broken in a real run -----------------------------------------
# (test_trail_check.py breaks each invariant in hand-made histories; here a few edits of a
# real run show the audit reads them from events.jsonl with their lines.)


def test_a_sibling_row_duplicated_in_its_group(run: Path) -> None:
    history = History.read(run)
    group = history.clean_group()
    entry, rows = history.group_rows()[group]
    assert isinstance(entry.record, StepTrained)
    # The twin takes the place of a row at least as long as itself: the edit is made in place,
    # and which row encodes longest (its tokens) is the run's, not the test's, choice.
    replaced = max(rows[1:], key=lambda row: len(msgspec.json.encode(row)))
    twin = min(
        (row for row in rows if row is not replaced), key=lambda row: len(msgspec.json.encode(row))
    )
    history.replace(entry, with_row(entry.record, replaced, twin))
    indices = sorted(
        twin.generation_index if row is replaced else row.generation_index for row in rows
    )

    report = failed(run)
    the_violation(
        report.violations,
        f"sibling ('{group}', {twin.generation_index}) trained twice",
        f"{EVENTS}:",
    )
    the_violation(report.violations, f"group {group} trained rows for generation indices {indices}")


def test_a_prompt_trained_twice(run: Path) -> None:
    history = History.read(run)
    groups = history.group_rows()
    first = history.clean_group()
    prompt = groups[first][1][0].prompt_idx
    other = next(
        g
        for g, (_, rows) in sorted(groups.items())
        if g != first and len(str(rows[0].prompt_idx)) == len(str(prompt))
    )
    entry, rows = groups[other]
    step = entry.record
    assert isinstance(step, StepTrained)
    for row in rows:
        step = with_row(step, row, msgspec.structs.replace(row, prompt_idx=prompt))
    history.replace(entry, step)

    report = failed(run)
    the_violation(report.violations, f"prompt {prompt} trained 2 times but taken 1", first, other)


def test_a_sealed_sibling_trained_as_another_rollout(run: Path) -> None:
    history = History.read(run)
    group = history.clean_group()
    entry, rows = history.group_rows()[group]
    assert isinstance(entry.record, StepTrained)
    row = rows[0]
    other = row.rollout_id[:-1] + ("0" if row.rollout_id[-1] != "0" else "1")
    history.replace(
        entry, with_row(entry.record, row, msgspec.structs.replace(row, rollout_id=other))
    )

    report = failed(run)
    seal_line = history.seal_line(group, row.rollout_id)
    the_violation(
        report.violations,
        f"sibling ({group}, {row.generation_index}) sealed as {row.rollout_id} "
        f"({EVENTS}:{seal_line})",
        f"trained as {other} ({EVENTS}:{entry.line})",
        "a lost seal",
    )


def test_an_altered_record_is_a_violation_naming_its_line(run: Path) -> None:
    history = History.read(run)
    entry = history.steps()[1]
    data = bytearray(history.path.read_bytes())
    data[entry.offset + 30] ^= 0x01
    history.path.write_bytes(bytes(data))
    the_violation(failed(run).violations, f"{EVENTS}:{entry.line}", "checksum")


# -- the trail against the checkpoints (what an emptied or lost trail looks like) --------


@pytest.mark.parametrize("name", ["events.jsonl", "metrics.jsonl"])
def test_an_emptied_trail_file_fails(run: Path, name: str) -> None:
    (run / name).write_bytes(b"")
    the_violation(failed(run).violations, f"{name} is 0 bytes but checkpoint step_000006 recorded")


def test_emptying_both_trail_files_fails(run: Path) -> None:
    for name in ("events.jsonl", "metrics.jsonl"):
        (run / name).write_bytes(b"")
    report = failed(run)
    assert len([v for v in report.violations if "is 0 bytes" in v]) == 2


@pytest.mark.parametrize("name", ["events.jsonl", "metrics.jsonl"])
def test_a_missing_trail_file_is_a_violation_naming_it(run: Path, name: str) -> None:
    (run / name).unlink()
    the_violation(failed(run).violations, f"{name} is missing")


def test_a_truncated_history_with_the_steps_gone_fails(run: Path) -> None:
    history = History.read(run)
    last_step = history.steps()[-1]
    # The history cut right before the last step: shorter than the newest checkpoint.
    with open(history.path, "r+b") as handle:
        handle.truncate(last_step.offset)
    the_violation(failed(run).violations, "events.jsonl is", "checkpoint step_000006 recorded")


def test_a_torn_data_plane_file_is_a_violation_not_a_traceback(run: Path) -> None:
    path = run / "dataplane.sqlite"
    path.write_bytes(path.read_bytes()[:1000])
    for leftover in ("dataplane.sqlite-wal", "dataplane.sqlite-shm"):
        (run / leftover).unlink(missing_ok=True)
    the_violation(failed(run).violations, "dataplane.sqlite cannot be read as a data plane")


# -- invariant 4: each checkpoint's rows are in the data plane ---------------------------


def test_a_staged_row_a_checkpoint_ledger_expects_is_missing(run: Path) -> None:
    view = next(v for v in checkpoints(run, KEEP) if v.expected_staging)
    key = sorted(view.expected_staging)[0]
    with SqliteDataPlane(run / "dataplane.sqlite") as store:
        assert key in store.keys(CaptureWriter.staging_partition)
        store.clear(CaptureWriter.staging_partition, [key])

    report = failed(run)
    the_violation(
        report.violations,
        f"checkpoint {view.name}: staged rows the ledger expects are missing",
        key,
        "(total=1)",
    )


def test_a_canonical_row_the_replay_index_owns_is_missing(run: Path) -> None:
    view = next(v for v in checkpoints(run, KEEP) if v.replay_rows)
    _, keys = sorted(view.replay_rows.items())[0]
    with SqliteDataPlane(run / "dataplane.sqlite") as store:
        assert keys[0] in store.keys(CANONICAL_PARTITION)
        store.clear(CANONICAL_PARTITION, [keys[0]])

    report = failed(run)
    the_violation(
        report.violations,
        f"checkpoint {view.name}: canonical rows the replay index owns are missing",
        keys[0],
    )


def test_a_missing_data_plane(run: Path) -> None:
    (run / "dataplane.sqlite").unlink()
    the_violation(failed(run).violations, "dataplane.sqlite is missing")


# -- invariants 5-6: checkpoint directories ---------------------------------------------


def test_a_step_directory_without_committed(run: Path) -> None:
    (run / "checkpoints" / "step_000002" / "COMMITTED").unlink()
    report = failed(run)
    assert report.violations == ["checkpoint step_000002 is published without COMMITTED"]
    assert report.complete


def test_a_checkpoint_whose_manifest_omits_a_file_is_a_violation_not_a_crash(run: Path) -> None:
    # COMMITTED lists what the directory holds; a manifest without the controller state
    # loads, so the decoder itself must refuse it (it used to raise a bare KeyError).
    directory = run / "checkpoints" / "step_000002"
    manifest = json.loads((directory / "COMMITTED").read_text())
    del manifest["files"]["replay_index.msgpack"]
    (directory / "COMMITTED").write_text(json.dumps(manifest))
    (directory / "replay_index.msgpack").unlink()
    report = failed(run)
    assert any(
        "step_000002" in v and "missing replay_index.msgpack" in v for v in report.violations
    ), report.violations


@pytest.mark.parametrize(
    ("name", "file_name"),
    [("step_000004", "policy.npz"), ("step_000006", "replay_index.msgpack")],
)
def test_a_flipped_byte_in_a_checkpoint_file(run: Path, name: str, file_name: str) -> None:
    path = run / "checkpoints" / name / file_name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))

    report = failed(run)
    the_violation(report.violations, f"checkpoint {name} is published but unusable", file_name)
    the_violation(report.violations, "sha256 mismatch")
    if name == "step_000006":
        # The newest is unusable: the history is audited against step 4's checkpoint.
        assert report.audited_through_step == 4
        the_violation(report.violations, "LATEST names 'step_000006'")


def test_latest_naming_a_checkpoint_that_does_not_exist(run: Path) -> None:
    (run / "checkpoints" / "LATEST").write_text("step_000008\n")
    report = failed(run)
    assert report.violations == [
        "LATEST names 'step_000008', which is not a usable committed checkpoint"
    ]


def test_a_temporary_directory_is_not_a_violation(run: Path) -> None:
    """A save killed mid-way leaves ``.tmp-step_*``: never published, so not damage."""
    shutil.copytree(
        run / "checkpoints" / "step_000006", run / "checkpoints" / ".tmp-step_000008-dead"
    )
    (run / "checkpoints" / ".tmp-step_000008-dead" / "COMMITTED").unlink()
    assert audit_run(run).violations == []


# -- the command ------------------------------------------------------------------------


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["audit", *args], catch_exceptions=False, terminal_width=80)


def test_the_cli_exits_0_on_a_good_run(run: Path) -> None:
    result = invoke(str(run))
    assert result.exit_code == 0, result.output
    assert "PASS" in result.stdout
    assert "violation:" not in result.stdout
    assert str(STEPS * PROMPTS * N) in result.stdout


def break_a_rollout_id(run: Path) -> str:
    history = History.read(run)
    group = history.clean_group()
    entry, rows = history.group_rows()[group]
    assert isinstance(entry.record, StepTrained)
    row = rows[0]
    broken = msgspec.structs.replace(row, rollout_id="x" * len(row.rollout_id))
    history.replace(entry, with_row(entry.record, row, broken))
    return group


def test_the_cli_exits_1_listing_violations(run: Path) -> None:
    group = break_a_rollout_id(run)
    result = invoke(str(run))
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.stdout
    listed = [line for line in result.stdout.splitlines() if line.startswith("violation: ")]
    assert listed and any(group in line for line in listed)


def _empty(*names: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        for name in names:
            (run / name).write_bytes(b"")

    return damage


def _remove(*names: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        for name in names:
            (run / name).unlink(missing_ok=True)

    return damage


def _tear_data_plane(run: Path) -> None:
    path = run / "dataplane.sqlite"
    path.write_bytes(path.read_bytes()[:1000])
    _remove("dataplane.sqlite-wal", "dataplane.sqlite-shm")(run)


# Issue 15, items 9 and 10: each damage is a violation naming the file, exit 1, never a
# traceback or a pass.
FILE_DAMAGE: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "emptied-history": (_empty(EVENTS), [f"{EVENTS} is 0 bytes"]),
    "emptied-metrics": (_empty("metrics.jsonl"), ["metrics.jsonl is 0 bytes"]),
    "emptied-both": (
        _empty(EVENTS, "metrics.jsonl"),
        [f"{EVENTS} is 0 bytes", "metrics.jsonl is 0 bytes"],
    ),
    "missing-history": (_remove(EVENTS), [f"{EVENTS} is missing"]),
    "missing-metrics": (_remove("metrics.jsonl"), ["metrics.jsonl is missing"]),
    "torn-data-plane": (_tear_data_plane, ["dataplane.sqlite cannot be read as a data plane"]),
    "missing-data-plane": (
        _remove("dataplane.sqlite", "dataplane.sqlite-wal", "dataplane.sqlite-shm"),
        ["dataplane.sqlite is missing"],
    ),
}


@pytest.mark.parametrize("damage", list(FILE_DAMAGE))
def test_the_cli_exits_1_naming_a_damaged_or_missing_file(run: Path, damage: str) -> None:
    break_it, named = FILE_DAMAGE[damage]
    break_it(run)
    result = invoke(str(run))  # an exception would propagate: catch_exceptions=False
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.stdout and "PASS" not in result.stdout
    listed = [line for line in result.stdout.splitlines() if line.startswith("violation: ")]
    for fragment in named:
        assert any(fragment in line for line in listed), (fragment, listed)
    as_json = json.loads(invoke("--json", str(run)).stdout)
    assert as_json["verdict"] == "fail"


def test_the_cli_prints_each_violation_whole_on_its_own_line(run: Path) -> None:
    """Each listed violation is one ``violation:`` line, whatever the terminal width, so
    its ids and ``file:line`` can be grepped."""
    break_a_rollout_id(run)
    expected = json.loads(invoke("--json", str(run)).stdout)["violations"]
    result = invoke(str(run))
    listed = [line for line in result.stdout.splitlines() if line.startswith("violation: ")]
    assert listed == [f"violation: {violation}" for violation in expected]


@pytest.mark.parametrize("kind", ["missing", "empty", "file", "bad_job"])
def test_the_cli_exits_2_with_one_line_for_a_non_run(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "target"
    if kind == "empty":
        target.mkdir()
    elif kind == "file":
        target.write_text("hello\n")
    elif kind == "bad_job":
        target.mkdir()
        (target / "job.toml").write_text("[job\nsteps = \n")
    result = invoke(str(target))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("rollout-recovery audit: ")
    assert str(target) in result.stderr
    with pytest.raises(NotARunDirectoryError):
        audit_run(target)


def test_the_cli_json(run: Path) -> None:
    good = invoke("--json", str(run))
    assert good.exit_code == 0
    report = json.loads(good.stdout)
    assert report["verdict"] == "pass"
    assert report["complete"] is True
    assert report["audited_through_step"] == STEPS
    assert report["violations"] == []
    assert report["counts"]["rows"] == STEPS * PROMPTS * N
    assert report["counts"]["groups"] == STEPS * PROMPTS

    group = break_a_rollout_id(run)
    bad = invoke("--json", str(run))
    assert bad.exit_code == 1
    report = json.loads(bad.stdout)
    assert report["verdict"] == "fail"
    assert any(group in violation for violation in report["violations"])
    assert set(report) >= {"verdict", "counts", "violations"}


# -- a regression of the run: deferred deletions vs a checkpoint being written ------------


def test_a_row_cleared_while_a_checkpoint_is_written_survives_while_that_checkpoint_is_kept(
    tmp_path: Path,
) -> None:
    """Checkpoint k's position is taken under the barrier and its snapshot and files are
    made after it. A staging clear requested in between (a publish) must not be deleted
    while checkpoint k is retained. (It was: the clear was stamped with epoch k-1, because
    the epoch counted commits, not cuts, so it ran at commit k-1+keep and the audit of the
    finished run failed about one time in four, naming the oldest kept checkpoint.) Forced:
    checkpoint 2's save is held until a publish clears a staged row its ledger expects.
    """
    hold = SaveHeldUntilClear(step=2, capture=2)
    out = tmp_path / "run"
    keep = 3  # commits at steps 0, 2, 4, 6: step 2 is the oldest kept at the end
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(CRASH_AT_ENV, raising=False)
        reset_crash_points_for_tests()
        patch.setattr(CheckpointStore, "save", hold.wrap_save(CheckpointStore.save))
        patch.setattr(
            DeferredDeletionDataPlane, "clear", hold.wrap_clear(DeferredDeletionDataPlane.clear)
        )
        patch.setattr(
            DeferredDeletionDataPlane,
            "checkpoint_captured",
            hold.wrap_captured(DeferredDeletionDataPlane.checkpoint_captured),
        )
        with checkpoints_wait_for_sealed_work({2}):
            run_job(out, small_config(keep=keep))
        reset_crash_points_for_tests()
    assert hold.cleared_while_writing, "the interleaving was not forced"

    with SqliteDataPlane(out / "dataplane.sqlite") as store:
        staged = set(store.keys(CaptureWriter.staging_partition))
    assert "step_000002" in {c.name for c in CheckpointStore(out, keep=keep).committed()}
    assert hold.cleared_while_writing <= staged, (
        "rows retained checkpoint step_000002 owns were deleted: "
        f"{sorted(hold.cleared_while_writing - staged)}"
    )
    assert audit_run(out).violations == []


# -- a run in progress ------------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_run_audits_through_its_newest_checkpoint_then_completes(
    tmp_path: Path,
    write_config: Callable[..., Path],
    run_cli: Callable[..., Any],
) -> None:
    steps = 10
    config = write_config(
        {
            "job": {"steps": steps, "prompts_per_step": PROMPTS, "generations_per_prompt": N},
            "checkpoint": {"every_steps": 2, "keep": 3},
        }
    )
    out = tmp_path / "killed"
    args = ["--out", str(out), "--plain", "--config", str(config)]

    # Killed as the sixth step trains: checkpoints are written in the background, but
    # step_000004's capture (before the fifth) awaited step_000002's write, so that one is
    # committed and step_000004 may be. (A SIGKILL on an output line raced the run: a
    # reader late on a loaded machine found it finished, or step_000010 committed.)
    killed = run_cli(args, env={CRASH_AT_ENV: "train.before_clear:6"})
    assert killed.returncode == -9, killed.stdout

    newest = CheckpointStore(out, keep=3).committed()[0].step
    assert 2 <= newest < steps
    report = audit_run(out)
    assert report.violations == []
    assert not report.complete
    assert report.audited_through_step == newest
    # The whole journal is history: the steps trained after the newest checkpoint too.
    assert report.counts["steps"] >= newest
    assert report.counts["restores"] == 0
    assert invoke(str(out)).exit_code == 0

    finished = run_cli(args)
    assert finished.returncode == 0, finished.stdout
    report = audit_run(out)
    assert report.violations == []
    assert report.complete
    assert report.audited_through_step == steps
    assert report.counts["restores"] >= 1
    assert report.counts["rows"] == report.counts["groups"] * N
    assert report.counts["groups"] + report.counts["dropped"] == report.counts["prompts_taken"]
    # Nothing sealed before the kill was lost: every seal trained or excused.
    assert report.counts["seals"] == report.counts["seals_trained"] + report.counts["seals_excused"]
