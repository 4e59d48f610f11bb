"""A history that lost what a committed checkpoint synced, or that is damaged before its
end, is refused before anything is trained, changing nothing (issue 24, items 2 and 3).

Every committed checkpoint's manifest records how long ``events.jsonl`` and
``metrics.jsonl`` were when it synced them. A journal cut back between the two newest
checkpoints used to be accepted: the newest was skipped, the run resumed from the older
one, exited 0, pruned the newest and journaled the lost seals again under new ids. A byte
flipped before the snapshot's position used to pass the restore (which scans from the
snapshot), the run trained, then stopped at its end advising a rerun, forever. Now both
stop the run at once with "this run cannot continue", naming the positions or the line,
without the rerun advice, the directory as it was (only the lock file names the refused
process), and the same on every rerun.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollout_recovery._crashpoints import CRASH_AT_ENV
from rollout_recovery.control import RunConfig
from rollout_recovery.history._trail_reader import read_entries

Cli = Callable[..., subprocess.CompletedProcess[str]]
Snapshot = Callable[[Path], dict[str, Any]]

ADVICE = "rerun the same command"
STOPPED = "error: the run stopped: RunNotResumableError: this run cannot continue: "


def _synced(out: Path, name: str) -> dict[str, int]:
    """Each committed checkpoint's recorded length of ``name``, by checkpoint."""
    found = {}
    for manifest in sorted((out / "checkpoints").glob("step_*/COMMITTED")):
        found[manifest.parent.name] = json.loads(manifest.read_text())["marks"][name]
    return found


def _more_steps(out: Path) -> list[str]:
    """Arguments that resume ``out`` with two more steps: a run that could go on would
    train (and write metrics and checkpoints)."""
    job = out / "job.toml"
    job.write_text(job.read_text().replace("steps = 10\n", "steps = 12\n"))
    return ["--out", str(out), "--plain"]


def _without_lock(snapshot: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in snapshot.items() if name != ".lock"}


def _refused_twice(run_cli: Cli, args: list[str]) -> str:
    outputs = [run_cli(args) for _ in range(2)]
    for result in outputs:
        assert result.returncode == 1, result.stdout
        assert STOPPED in result.stdout, result.stdout
        assert ADVICE not in result.stdout
        assert "Traceback" not in result.stdout
    assert outputs[0].stdout == outputs[1].stdout
    return outputs[0].stdout


def test_a_journal_cut_back_between_the_two_newest_checkpoints_is_refused_naming_them(
    finished_run: tuple[Path, RunConfig], run_cli: Cli, dir_snapshot: Snapshot
) -> None:
    out, _ = finished_run
    events = out / "events.jsonl"
    synced = _synced(out, "events.jsonl")
    (previous, previous_at), (newest, newest_at) = sorted(synced.items())[-2:]
    # Cut at a record boundary between the two: the journal reads whole, only shorter.
    cut = next(
        e.offset for e in read_entries(events) if previous_at < e.offset < newest_at
    )
    os.truncate(events, cut)
    args = _more_steps(out)
    before = dir_snapshot(out)

    output = _refused_twice(run_cli, args)

    assert (
        f"events.jsonl is {cut} bytes, shorter than committed checkpoints synced it to "
        f"({newest} at byte {newest_at}): the history lost records that were synced"
    ) in output
    assert f"at least {newest_at} bytes" in output
    assert previous not in output.split("synced it to")[1].split(")")[0]
    assert _without_lock(dir_snapshot(out)) == _without_lock(before)


def test_metrics_shorter_than_a_checkpoint_synced_them_are_refused(
    finished_run: tuple[Path, RunConfig], run_cli: Cli, dir_snapshot: Snapshot
) -> None:
    out, _ = finished_run
    synced = _synced(out, "metrics.jsonl")
    newest, newest_at = max(synced.items())
    os.truncate(out / "metrics.jsonl", newest_at - 1)
    args = _more_steps(out)
    before = dir_snapshot(out)

    output = _refused_twice(run_cli, args)

    assert (
        f"metrics.jsonl is {newest_at - 1} bytes, shorter than the {newest_at} bytes "
        f"{newest} synced"
    ) in output
    assert _without_lock(dir_snapshot(out)) == _without_lock(before)


def test_a_fallback_that_cut_the_metrics_back_is_not_a_lost_history(
    finished_run: tuple[Path, RunConfig], run_cli: Cli
) -> None:
    """The newest checkpoint damaged: the restore falls back to the previous one and cuts
    the metrics back to its length. Killed before the next checkpoint prunes the damaged
    one, the rerun must not take the damaged checkpoint's longer metrics mark for lost
    lines (only the restored checkpoint vouches for the metrics)."""
    out, _ = finished_run
    *_, previous, newest = sorted((out / "checkpoints").glob("step_*"))
    victim = newest / "replay_index.msgpack"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    args = _more_steps(out)
    # Killed in the first step after the restore: a SIGKILL on the "resumed from" line
    # raced the steps after it (and the checkpoint that prunes the damaged one).
    killed = run_cli(args, env={CRASH_AT_ENV: "train.before_clear:1"})
    assert killed.returncode == -9 and f"resumed from {previous.name}" in killed.stdout
    assert (out / "metrics.jsonl").stat().st_size < _synced(out, "metrics.jsonl")[newest.name]

    finished = run_cli(args)

    assert finished.returncode == 0, finished.stdout
    assert f"skipping checkpoint {newest.name}" in finished.stdout


def test_a_byte_flipped_before_the_snapshot_is_refused_before_anything_trains(
    finished_run: tuple[Path, RunConfig], run_cli: Cli, dir_snapshot: Snapshot
) -> None:
    out, _ = finished_run
    events = out / "events.jsonl"
    oldest_at = min(_synced(out, "events.jsonl").values())
    entries = [e for e in read_entries(events) if e.offset < oldest_at]
    victim = entries[len(entries) // 3]  # long before every retained snapshot
    data = bytearray(events.read_bytes())
    data[victim.offset + 30] ^= 0x01
    events.write_bytes(bytes(data))
    args = _more_steps(out)
    before = dir_snapshot(out)

    output = _refused_twice(run_cli, args)

    assert f"events.jsonl:{victim.line} (byte {victim.offset}) is damaged" in output
    assert "Restore events.jsonl from a backup" in output
    # Nothing trained, nothing written: no metrics line, no checkpoint, no record.
    assert _without_lock(dir_snapshot(out)) == _without_lock(before)


def test_a_journal_damaged_to_its_end_from_before_a_synced_position_is_not_a_torn_tail(
    finished_run: tuple[Path, RunConfig], run_cli: Cli, dir_snapshot: Snapshot
) -> None:
    """Garbage from inside the synced history to the end of the file would look like a
    torn tail, which a restore cuts: but a checkpoint synced those bytes."""
    out, _ = finished_run
    events = out / "events.jsonl"
    newest, newest_at = max(_synced(out, "events.jsonl").items())
    entries = [e for e in read_entries(events) if e.offset < newest_at]
    victim = entries[-3]
    data = bytearray(events.read_bytes())
    data[victim.offset :] = b"\0" * (len(data) - victim.offset)
    events.write_bytes(bytes(data))
    args = _more_steps(out)
    before = dir_snapshot(out)

    output = _refused_twice(run_cli, args)

    assert f"events.jsonl:{victim.line} (byte {victim.offset}) is damaged (" in output
    assert f"from there to its end, before byte {newest_at}, which {newest} synced" in output
    assert _without_lock(dir_snapshot(out)) == _without_lock(before)
