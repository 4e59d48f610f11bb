"""``rollout-recovery journal DIR``: records, positions, snapshot marks, torn tails, damage
and restores, for people and as JSON; read-only; exit codes 0, 1 and 2.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from rollout_recovery.cli._main import cli
from rollout_recovery.control import RunConfig
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.history.records import RECORD_TYPES, Restored
from rollout_recovery.rundir import CheckpointStore

Snapshot = Callable[[Path], dict[str, tuple[int, int, str]]]
Cli = Callable[..., subprocess.CompletedProcess[str]]

TORN = b'{"crc":"0000abcd","event":"sibling_sea'


def journal_cli(*args: str) -> Result:
    return CliRunner().invoke(cli, ["journal", *args])


def as_json(*args: str) -> tuple[int, dict[str, Any]]:
    result = journal_cli(*args, "--json")
    return result.exit_code, json.loads(result.output)


def marks(run: Path) -> dict[str, int]:
    """Each committed checkpoint's journal position, read from its manifest here."""
    found = {}
    for path in sorted((run / "checkpoints").glob("step_*")):
        manifest = json.loads((path / "COMMITTED").read_text())
        found[path.name] = manifest["marks"]["events.jsonl"]
    return found


def test_the_json_report_counts_every_record_and_names_every_mark(
    finished_run: tuple[Path, RunConfig],
) -> None:
    run, _ = finished_run
    code, report = as_json(str(run))
    assert code == 0
    assert report["format"] == "rollout-recovery-journal" and report["version"] == 1
    assert report["verdict"] == "ok" and report["problems"] == [] and not report["live"]
    lines = (run / "events.jsonl").read_bytes().splitlines(keepends=True)
    assert report["records"] == len(lines)
    assert report["size"] == report["end"] == sum(map(len, lines))
    assert report["torn_tail"] is None and report["corrupt"] is None
    events = [json.loads(line)["event"] for line in lines]
    by_type = report["by_type"]
    assert {name: item["count"] for name, item in by_type.items()} == {
        name: events.count(name) for name in set(events)
    }
    assert sum(item["bytes"] for item in by_type.values()) == report["size"]
    offsets = [sum(map(len, lines[:index])) for index in range(len(lines))]
    first_seal = events.index("sibling_sealed")
    assert by_type["sibling_sealed"]["first"] == {
        "offset": offsets[first_seal],
        "line": first_seal + 1,
    }
    assert report["last"] == {"offset": offsets[-1], "line": len(lines)}
    # The marks are the manifests', each at a record's start, with what follows it.
    snapshots = {mark["checkpoint"]: mark for mark in report["snapshots"]}
    assert {name: mark["position"] for name, mark in snapshots.items()} == marks(run)
    for mark in snapshots.values():
        index = offsets.index(mark["position"])
        assert mark["line"] == index + 1 and mark["problem"] is None
        assert mark["records_after"] == len(lines) - index
        assert mark["bytes_after"] == report["size"] - mark["position"]
    assert report["restores"] == [] and report["listing"] is None


def test_the_human_report_shows_each_part(finished_run: tuple[Path, RunConfig]) -> None:
    run, _ = finished_run
    result = journal_cli(str(run))
    assert result.exit_code == 0, result.output
    text = result.output
    assert "ends cleanly at byte" in text
    for heading in ("records by type", "snapshot marks", "restores (0)"):
        assert heading in text
    newest = max(marks(run))
    assert f"  {newest} " in text
    assert "sibling_sealed" in text and "step_trained" in text


def test_records_are_listed_from_a_position_by_type_up_to_a_limit(
    finished_run: tuple[Path, RunConfig],
) -> None:
    run, _ = finished_run
    entries = read_entries(run / "events.jsonl")
    trained = [e for e in entries if e.record.__struct_config__.tag == "step_trained"]
    start = trained[3].offset - 1  # inside the line before: the next record on is listed
    code, report = as_json(str(run), "--from", str(start), "--type", "step_trained", "--limit", "2")
    assert code == 0
    listing = report["listing"]
    assert listing["from"] == start and listing["types"] == ["step_trained"]
    assert listing["matched"] == len(trained) - 3
    assert [item["offset"] for item in listing["records"]] == [t.offset for t in trained[3:5]]
    assert [item["record"]["step"] for item in listing["records"]] == [3, 4]
    assert all(item["record"]["event"] == "step_trained" for item in listing["records"])
    # From a checkpoint: exactly what a restore from it would replay.
    newest = max(marks(run))
    code, report = as_json(str(run), "--from", newest)
    assert code == 0
    after = [e.offset for e in entries if e.offset >= marks(run)[newest]]
    assert [item["offset"] for item in report["listing"]["records"]] == after
    human = journal_cli(str(run), "--type", "run_started")
    assert human.exit_code == 0
    assert "1 matched, 1 shown" in human.output and "run_started" in human.output


def test_inspection_changes_nothing_and_takes_the_shared_checkpoint_lock(
    finished_run: tuple[Path, RunConfig], dir_snapshot: Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, _ = finished_run
    lock_file = run / ".checkpoints.lock"
    read_marks = CheckpointStore.read_marks
    held_shared: list[bool] = []

    def probing(self: CheckpointStore, checkpoint: Any) -> dict[str, int]:
        # While a manifest is read, nobody may publish or prune: an exclusive lock fails.
        fd = os.open(lock_file, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            held_shared.append(error.errno in (errno.EWOULDBLOCK, errno.EAGAIN))
        else:
            held_shared.append(False)
        finally:
            os.close(fd)
        return read_marks(self, checkpoint)

    before = dir_snapshot(run)
    assert journal_cli(str(run), "--from", "0").exit_code == 0
    assert journal_cli(str(run), "--json").exit_code == 0
    assert dir_snapshot(run) == before  # byte-identical, mtimes included
    monkeypatch.setattr(CheckpointStore, "read_marks", probing)
    assert journal_cli(str(run)).exit_code == 0
    assert held_shared and all(held_shared)


def test_a_torn_tail_is_reported_with_its_offset_and_is_not_a_failure(
    finished_run: tuple[Path, RunConfig], dir_snapshot: Snapshot
) -> None:
    run, _ = finished_run
    journal = run / "events.jsonl"
    size = journal.stat().st_size
    with open(journal, "ab") as handle:
        handle.write(TORN)
    before = dir_snapshot(run)
    code, report = as_json(str(run))
    assert code == 0
    assert report["torn_tail"]["offset"] == report["end"] == size
    assert report["torn_tail"]["bytes"] == len(TORN)
    assert "no newline" in report["torn_tail"]["reason"]
    human = journal_cli(str(run))
    assert human.exit_code == 0
    assert f"torn tail: {len(TORN)} bytes at byte {size:,}" in human.output
    assert dir_snapshot(run) == before  # reported, never cut


def test_a_damaged_record_is_reported_with_its_file_and_offset(
    finished_run: tuple[Path, RunConfig],
) -> None:
    run, _ = finished_run
    journal = run / "events.jsonl"
    entries = read_entries(journal)
    damaged = entries[10]
    data = bytearray(journal.read_bytes())
    data[damaged.offset + 30] ^= 0x01  # inside line 11, whole records after it
    journal.write_bytes(bytes(data))
    code, report = as_json(str(run))
    assert code == 1 and report["verdict"] == "damaged"
    assert report["corrupt"]["offset"] == damaged.offset
    assert report["corrupt"]["line"] == damaged.line == 11
    assert report["records"] == 10 and report["end"] == damaged.offset  # what precedes it
    human = journal_cli(str(run))
    assert human.exit_code == 1
    assert f"events.jsonl:11 (byte {damaged.offset})" in human.output


def test_a_mark_past_the_journal_is_a_problem_naming_the_checkpoint(
    finished_run: tuple[Path, RunConfig],
) -> None:
    run, _ = finished_run
    newest, position = max(marks(run).items())
    with open(run / "events.jsonl", "r+b") as handle:
        handle.truncate(position - 10)  # the journal lost synced records
    code, report = as_json(str(run))
    assert code == 1
    (mark,) = [m for m in report["snapshots"] if m["checkpoint"] == newest]
    assert f"position {position}" in mark["problem"]
    assert any(problem.startswith(f"checkpoint {newest}:") for problem in report["problems"])


def test_exit_2_for_what_is_not_a_run_and_for_bad_arguments(
    tmp_path: Path, finished_run: tuple[Path, RunConfig]
) -> None:
    result = journal_cli(str(tmp_path))
    assert result.exit_code == 2 and "not a rollout-recovery run directory" in result.output
    run, _ = finished_run
    unknown = journal_cli(str(run), "--from", "step_999999")
    assert unknown.exit_code == 2 and "no committed checkpoint 'step_999999'" in unknown.output
    assert journal_cli(str(run), "--type", "no_such_record").exit_code == 2
    assert journal_cli(str(run), "--limit", "-1").exit_code == 2
    (run / "events.jsonl").unlink()
    missing = journal_cli(str(run))
    assert missing.exit_code == 2 and "holds no journal" in missing.output


def test_every_record_type_is_accepted_by_type() -> None:
    assert set(RECORD_TYPES) >= {"sibling_sealed", "restored", "checkpoint_committed"}


@pytest.mark.slow
def test_restores_say_what_they_kept_and_discarded(
    tmp_path: Path, write_config: Callable[..., Path], run_cli_until: Cli, run_cli: Cli
) -> None:
    config = write_config({"checkpoint": {"every_steps": 50}})
    out = tmp_path / "run"
    killed = run_cli_until(
        ["--out", str(out), "--config", str(config), "--plain"],
        stop=lambda line, lines: line.startswith("step 3 ("),
    )
    assert killed.returncode == -9, killed.stdout
    with open(out / "events.jsonl", "ab") as handle:
        handle.write(TORN)  # and a power cut tore the last append
    finished = run_cli(["--out", str(out), "--config", str(config), "--plain"])
    assert finished.returncode == 0, finished.stdout
    (entry,) = [e for e in read_entries(out / "events.jsonl") if isinstance(e.record, Restored)]
    restored = entry.record
    assert isinstance(restored, Restored)
    code, report = as_json(str(out))
    assert code == 0
    (shown,) = report["restores"]
    assert shown["offset"] == entry.offset and shown["line"] == entry.line
    assert shown["checkpoint"] == restored.checkpoint == "step_000000"
    assert shown["torn_tail_bytes"] == len(TORN)
    assert shown["replayed_records"] == restored.replayed_records > 0
    assert shown["sealed_siblings_kept"] == restored.sealed_siblings_kept
    assert shown["rolled_back_steps"] == restored.rolled_back_steps
    assert shown["seals_lost"] == 0 and shown["discarded"] == []  # reuse = "all"
    human = journal_cli(str(out))
    assert "restores (1)" in human.output
    assert f"torn tail cut: {len(TORN)} bytes" in human.output
    assert f"{restored.sealed_siblings_kept} sealed siblings" in human.output
