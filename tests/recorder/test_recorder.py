"""The recorder's calls, one behaviour each: identity, staging, sealing, training,
checkpoints and restores, refusals that change nothing, and a run directory the audit,
journal and inspect commands read unchanged."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from rollout_recovery.cli._main import cli
from rollout_recovery.errors import (
    ClosedResourceError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidTransitionError,
    NotARunDirectoryError,
    RunDirectoryLockedError,
    UnknownGroupError,
)
from rollout_recovery.history import AuditTrail, audit_run, records
from rollout_recovery.history import _journal as journal_module
from rollout_recovery.recorder import Recorder, SiblingOutput, StagedCall
from rollout_recovery.rundir import RunDirectory

PROMPT = [{"role": "user", "content": "Count on from 3:", "row_id": 3}]


def output(*tokens: int, reward: float | None = None) -> SiblingOutput:
    return SiblingOutput([1, 2], list(tokens), [-0.5] * len(tokens), reward, 0, {"t": "x"})


def history(run_dir: Path) -> list[records.HistoryRecord]:
    return AuditTrail.read_history(RunDirectory(run_dir))


def of_type(run_dir: Path, kind: type) -> list:
    return [record for record in history(run_dir) if isinstance(record, kind)]


def require_audit(run_dir: Path) -> None:
    report = audit_run(run_dir)
    assert report.ok, report.violations


def seal_all(rec: Recorder, key: str, prompt: object = PROMPT) -> str:
    taken = rec.take(key, prompt)
    for sibling in taken.unsealed:
        rec.seal(taken.group_id, sibling, output(10 + sibling))
    return taken.group_id


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


# -- identity ---------------------------------------------------------------------------


def test_a_fresh_directory_is_a_run_the_commands_read(run_dir: Path) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        seal_all(rec, "0:3")
        rec.mark_checkpoint("checkpoint-1", step=1)
    kinds = [type(r).__name__ for r in history(run_dir)]
    assert kinds[0] == "RunStarted" and "SiblingSealed" in kinds
    require_audit(run_dir)


def test_taking_a_key_again_is_the_same_group_and_records_new_aliases(run_dir: Path) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        first = rec.take("0:3", PROMPT, aliases=["uid-a"])
        again = rec.take("0:3", PROMPT, aliases=["uid-a", "uid-b"])
        other = rec.take("0:4", "another prompt")
    assert again.group_id == first.group_id != other.group_id
    assert again.aliases == ("uid-a", "uid-b")
    aliased = of_type(run_dir, records.PromptAliased)
    assert [(a.group_id, a.aliases) for a in aliased] == [(first.group_id, ["uid-b"])]
    taken = of_type(run_dir, records.PromptTaken)
    assert [(t.key, t.aliases) for t in taken] == [("0:3", ["uid-a"]), ("0:4", [])]


def test_a_key_with_another_prompt_is_refused_naming_both_digests(run_dir: Path) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        rec.take("0:3", PROMPT)
        size = run_dir.joinpath("events.jsonl").stat().st_size
        with pytest.raises(InvalidArgumentError, match=r"key '0:3'.*digest [0-9a-f]{64}, now"):
            rec.take("0:3", [{"role": "user", "content": "something else", "row_id": 3}])
        assert run_dir.joinpath("events.jsonl").stat().st_size == size


def test_a_prompt_that_is_not_json_is_refused_naming_the_key(run_dir: Path) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        with pytest.raises(InvalidArgumentTypeError, match="prompt of key '0:3'"):
            rec.take("0:3", {"tokens": {1, 2}})
        with pytest.raises(InvalidArgumentTypeError, match="aliases"):
            rec.take("0:3", PROMPT, aliases="uid")


# -- staging and sealing ----------------------------------------------------------------


def test_a_seal_is_kept_and_resealing_it_is_idempotent(run_dir: Path) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        taken = rec.take("0:3", PROMPT)
        sealed = rec.seal(taken.group_id, 1, output(7, 8, reward=0.5))
        assert rec.seal(taken.group_id, 1, output(7, 8, reward=0.5)) == sealed
        assert rec.take("0:3", PROMPT).sealed == {1: sealed}
    with Recorder.open(run_dir, group_size=2) as rec:
        assert rec.take("0:3", PROMPT).sealed == {1: sealed}
    assert sealed.completion_token_ids == [7, 8] and sealed.extra == {"t": "x"}
    assert len(of_type(run_dir, records.SiblingSealed)) == 1


def test_sealing_a_sealed_sibling_differently_is_refused_and_changes_nothing(
    run_dir: Path,
) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        taken = rec.take("0:3", PROMPT)
        rec.seal(taken.group_id, 0, output(7))
        size = run_dir.joinpath("events.jsonl").stat().st_size
        with pytest.raises(InvalidTransitionError, match=rf"sibling 0 of group '{taken.group_id}'"):
            rec.seal(taken.group_id, 0, output(9))
        with pytest.raises(InvalidTransitionError, match="is sealed"):
            rec.stage_call(taken.group_id, 0, StagedCall([1], [2]))
        assert run_dir.joinpath("events.jsonl").stat().st_size == size
        assert rec.take("0:3", PROMPT).sealed[0].completion_token_ids == [7]


def test_unknown_groups_siblings_and_bad_values_are_refused(run_dir: Path) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        taken = rec.take("0:3", PROMPT)
        with pytest.raises(UnknownGroupError, match="'nope'"):
            rec.seal("nope", 0, output(1))
        with pytest.raises(InvalidArgumentError, match=r"siblings 0\.\.1, not 2"):
            rec.seal(taken.group_id, 2, output(1))
        with pytest.raises(InvalidArgumentError, match="logprobs has 1 values for 2 tokens"):
            rec.seal(taken.group_id, 0, SiblingOutput([1], [2, 3], [-1.0]))
        with pytest.raises(InvalidArgumentTypeError, match="extra is not JSON"):
            rec.stage_call(taken.group_id, 0, StagedCall([1], [2], extra={"x": object()}))
        assert rec.take("0:3", PROMPT).sealed == {}
        assert rec.take("0:3", PROMPT).staged == {}


def test_staged_calls_come_back_after_a_restart_and_the_sibling_continues(run_dir: Path) -> None:
    calls = [StagedCall([1, 2], [3], [-0.25], 4, {"turn": 0}), StagedCall([1, 2, 3, 9], [5, 6])]
    with Recorder.open(run_dir, group_size=2) as rec:
        taken = rec.take("0:3", PROMPT)
        for call in calls:
            rec.stage_call(taken.group_id, 1, call)
        # Not closed: the process "dies" here (the lock goes with the descriptor).
        rec._release()
    with Recorder.open(run_dir, group_size=2) as rec:
        again = rec.take("0:3", PROMPT)
        assert again.staged == {1: calls}
        rec.stage_call(again.group_id, 1, StagedCall([1, 2, 3, 9, 5, 6], [7]))
        sealed = rec.seal(again.group_id, 1, output(3, 5, 6, 7))
    resumed = of_type(run_dir, records.AttemptResumed)
    assert len(resumed) == 1 and len(resumed[0].calls) == 2 and resumed[0].tokens == 3
    (seal,) = of_type(run_dir, records.SiblingSealed)
    assert seal.seal.rollout_id == sealed.rollout_id == resumed[0].rollout_id
    assert seal.seal.inherited_calls == 2 and seal.seal.inherited_tokens == 3
    with Recorder.open(run_dir, group_size=2) as rec:
        rec.mark_checkpoint("c", step=0)
    require_audit(run_dir)


# -- training, checkpoints, restores -----------------------------------------------------


def test_training_needs_every_sibling_sealed_and_happens_once(run_dir: Path) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        taken = rec.take("0:3", PROMPT)
        rec.seal(taken.group_id, 0, output(1))
        with pytest.raises(InvalidTransitionError, match=r"siblings \[1\] are not sealed"):
            rec.mark_trained([taken.group_id], step=1)
        rec.seal(taken.group_id, 1, output(2))
        rec.mark_trained([taken.group_id], step=1)
        assert rec.take("0:3", PROMPT).trained
        with pytest.raises(InvalidTransitionError, match="trained already"):
            rec.mark_trained([taken.group_id], step=2)
        with pytest.raises(InvalidArgumentError, match="names a group twice"):
            rec.mark_trained([taken.group_id, taken.group_id], step=2)
        rec.mark_checkpoint("checkpoint-1", step=1)
    (step,) = of_type(run_dir, records.StepTrained)
    assert step.step == 0 and step.group_ids == [taken.group_id] and len(step.rows) == 2
    require_audit(run_dir)


def test_resuming_a_checkpoint_makes_later_training_trainable_again(run_dir: Path) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        early = seal_all(rec, "0:1")
        rec.mark_trained([early], step=1)
        rec.mark_checkpoint("checkpoint-1", step=1)
        late = seal_all(rec, "0:2")
        rec.mark_trained([late], step=2)
        rec.mark_checkpoint("checkpoint-2", step=2)
    with Recorder.open(run_dir, group_size=2, resume_checkpoint="checkpoint-1") as rec:
        assert rec.take("0:1", PROMPT).trained
        again = rec.take("0:2", PROMPT)
        assert not again.trained and sorted(again.sealed) == [0, 1]  # nothing regenerated
        rec.mark_trained([again.group_id], step=2)
        rec.mark_checkpoint("checkpoint-2", step=2)
    (restored,) = of_type(run_dir, records.Restored)
    assert restored.rolled_back_steps == [1] and restored.checkpoint == "checkpoint-1"
    require_audit(run_dir)
    # A fresh trainer: everything trained is trainable again, every seal stays.
    with Recorder.open(run_dir, group_size=2, resume_checkpoint=None) as rec:
        assert not rec.take("0:1", PROMPT).trained
        assert sorted(rec.take("0:1", PROMPT).sealed) == [0, 1]
        rec.mark_checkpoint("checkpoint-0", step=0)
    require_audit(run_dir)


def test_a_checkpoint_a_restore_abandoned_is_refused(run_dir: Path) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        rec.mark_trained([seal_all(rec, "0:1")], step=1)
        rec.mark_checkpoint("checkpoint-1", step=1)
    Recorder.open(run_dir, group_size=2, resume_checkpoint=None).close()  # a fresh trainer
    with pytest.raises(InvalidArgumentError, match=r"'checkpoint-1' .* was abandoned"):
        Recorder.open(run_dir, group_size=2, resume_checkpoint="checkpoint-1")
    require_audit(run_dir)


def test_an_unknown_checkpoint_is_refused_naming_the_known_ones(run_dir: Path) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        rec.mark_checkpoint("checkpoint-2", step=2)
    size = run_dir.joinpath("events.jsonl").stat().st_size
    with pytest.raises(InvalidArgumentError, match=r"no checkpoint 'checkpoint-4'.*'checkpoint-2'"):
        Recorder.open(run_dir, group_size=2, resume_checkpoint="checkpoint-4")
    assert run_dir.joinpath("events.jsonl").stat().st_size == size
    with pytest.raises(InvalidArgumentError, match="no recorder journal"):
        Recorder.open(run_dir.parent / "empty", group_size=2, resume_checkpoint="checkpoint-2")


def test_another_group_size_is_refused_naming_both(run_dir: Path) -> None:
    Recorder.open(run_dir, group_size=2).close()
    with pytest.raises(InvalidArgumentError, match="group_size=2, not 4"):
        Recorder.open(run_dir, group_size=4)


def test_one_recorder_per_directory_and_none_in_a_jobs(run_dir: Path, tmp_path: Path) -> None:
    with (
        Recorder.open(run_dir, group_size=2),
        pytest.raises(RunDirectoryLockedError, match=r"in use .* \(pid \d+\)"),
    ):
        Recorder.open(run_dir, group_size=2)
    job = tmp_path / "job"
    job.mkdir()
    job.joinpath("job.toml").write_text("[job]\nsteps = 3\n")
    with pytest.raises(NotARunDirectoryError, match="job's run directory"):
        Recorder.open(job, group_size=2)


def test_a_closed_recorder_refuses_calls(run_dir: Path) -> None:
    rec = Recorder.open(run_dir, group_size=2)
    rec.close()
    rec.close()
    with pytest.raises(ClosedResourceError, match="closed"):
        rec.take("0:3", PROMPT)


# -- durability and threads --------------------------------------------------------------


def test_a_seal_returns_only_after_an_fdatasync_covered_it(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = journal_module._fdatasync

    def watched(fd: int) -> None:
        real(fd)
        synced.append(run_dir.joinpath("events.jsonl").stat().st_size)

    monkeypatch.setattr(journal_module, "_fdatasync", watched)
    with Recorder.open(run_dir, group_size=2) as rec:
        taken = rec.take("0:3", PROMPT)
        for sibling in range(2):
            rec.seal(taken.group_id, sibling, output(sibling))
            end = run_dir.joinpath("events.jsonl").stat().st_size
            assert synced and max(synced) >= end


def test_threads_sealing_at_once_lose_nothing(run_dir: Path) -> None:
    keys = [f"0:{i}" for i in range(8)]
    sealed: dict[tuple[str, int], list[int]] = {}
    with Recorder.open(run_dir, group_size=3) as rec:

        def work(key: str) -> None:
            taken = rec.take(key, key)
            for sibling in range(3):
                rec.stage_call(taken.group_id, sibling, StagedCall([1], [sibling]))
                result = rec.seal(taken.group_id, sibling, output(len(key), sibling))
                sealed[(key, sibling)] = result.completion_token_ids

        threads = [threading.Thread(target=work, args=(key,)) for key in keys]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        groups = [rec.take(key, key).group_id for key in keys]
        rec.mark_trained(groups[:4], step=1)
        rec.mark_checkpoint("c1", step=1)
    with Recorder.open(run_dir, group_size=3, resume_checkpoint="c1") as rec:
        for key in keys:
            got = rec.take(key, key).sealed
            assert {s: v.completion_token_ids for s, v in got.items()} == {
                s: sealed[(key, s)] for s in range(3)
            }
    assert len(of_type(run_dir, records.SiblingSealed)) == 24
    require_audit(run_dir)


def test_a_torn_tail_is_cut_on_open(run_dir: Path) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        seal_all(rec, "0:3")
    with run_dir.joinpath("events.jsonl").open("ab") as handle:
        handle.write(b'{"crc":"00000000","event":"sibling_se')
    with Recorder.open(run_dir, group_size=2) as rec:
        assert sorted(rec.take("0:3", PROMPT).sealed) == [0, 1]
        rec.mark_checkpoint("c", step=0)
    assert re.search(rb"sibling_se$", run_dir.joinpath("events.jsonl").read_bytes()) is None
    require_audit(run_dir)


@pytest.mark.parametrize("command", ["audit", "journal", "inspect"])
def test_the_commands_read_a_recorders_directory_unchanged(run_dir: Path, command: str) -> None:
    with Recorder.open(run_dir, group_size=2) as rec:
        group_id = seal_all(rec, "0:3")
        rec.mark_trained([group_id], step=0)
        rec.mark_checkpoint("checkpoint-1", step=1)
    # inspect reads a checkpoint's sidecar: the newest one the recorder committed.
    [checkpoint] = (
        RunDirectory(run_dir).checkpoints_dir.glob("step_*") if command == "inspect" else [run_dir]
    )
    result = CliRunner().invoke(cli, [command, str(checkpoint)], terminal_width=200)
    assert result.exit_code == 0, result.output
    if command == "journal":
        assert "sibling_sealed" in result.output and "prompt_taken" in result.output
