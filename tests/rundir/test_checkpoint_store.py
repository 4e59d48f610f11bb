"""The checkpoint directory store: commit by rename, verify on load, fall back on damage.

The SIGKILL tests run a real child interpreter armed at each checkpoint crash point and
then inspect what it left behind from the parent, as a resuming job would.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery._crashpoints import CRASH_AT_ENV, reset_crash_points_for_tests
from rollout_recovery.errors import CheckpointDirectoryError, InvalidStateError
from rollout_recovery.rundir import _checkpoint_store as _checkpoint_dir
from rollout_recovery.rundir._checkpoint_store import (
    CheckpointStore,
    CommittedCheckpoint,
    LoadedCheckpoint,
    step_dirname,
)


def files_for(step: int) -> dict[str, bytes]:
    """Distinct content per step, so a test can tell which checkpoint it got back."""
    return {
        "rollout_recovery.pt": bytes(range(256)) * 8 + str(step).encode(),
        "data_plane.snapshot": f"snapshot of step {step}".encode() * 100,
        "empty": b"",
    }


def listing(store: CheckpointStore) -> list[str]:
    return sorted(entry.name for entry in store.directory.iterdir())


def steps(store: CheckpointStore) -> list[int]:
    return [checkpoint.step for checkpoint in store.committed()]


def latest(store: CheckpointStore) -> str:
    return (store.directory / "LATEST").read_text()


def accept(loaded: LoadedCheckpoint) -> int:
    return loaded.step


@pytest.fixture(autouse=True)
def _unarmed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # An armed variable inherited from the shell would SIGKILL pytest itself.
    monkeypatch.delenv(CRASH_AT_ENV, raising=False)
    reset_crash_points_for_tests()
    yield
    reset_crash_points_for_tests()


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "run", keep=3)


# -- writing ----------------------------------------------------------------------------


def test_round_trip_and_manifest(store: CheckpointStore) -> None:
    path = store.save(7, files_for(7))
    assert path == store.directory / "step_000007"
    assert listing(store) == ["LATEST", "step_000007"]
    assert sorted(p.name for p in path.iterdir()) == sorted([*files_for(7), "COMMITTED"])

    [committed] = store.committed()
    assert committed == CommittedCheckpoint(7, "step_000007", path)
    loaded = store.load(committed)
    assert (loaded.step, loaded.name, loaded.directory) == (7, "step_000007", path)
    assert loaded.files == files_for(7)

    manifest = json.loads((path / "COMMITTED").read_text())
    assert manifest == {
        "format": "rollout-recovery-checkpoint",
        "version": 2,
        "marks": {},
        "step": 7,
        "files": {
            name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for name, data in files_for(7).items()
        },
    }


def test_read_marks_reads_the_manifest_alone(store: CheckpointStore) -> None:
    path = store.save(3, files_for(3), marks={"events.jsonl": 1234, "metrics.jsonl": 56})
    [committed] = store.committed()
    # A damaged file fails load, but the manifest still says where the history ends.
    (path / "data_plane.snapshot").write_bytes(b"damaged")
    with pytest.raises(CheckpointDirectoryError, match="size mismatch"):
        store.load(committed)
    assert store.read_marks(committed) == {"events.jsonl": 1234, "metrics.jsonl": 56}
    (path / "COMMITTED").write_text('{"format": "rollout-recovery-checkpoint"}')
    with pytest.raises(CheckpointDirectoryError, match="manifest fields wrong"):
        store.read_marks(committed)
    (path / "COMMITTED").unlink()
    with pytest.raises(CheckpointDirectoryError, match="missing COMMITTED"):
        store.read_marks(committed)


def test_latest_names_the_newest_save(store: CheckpointStore) -> None:
    store.save(10, files_for(10))
    assert latest(store) == "step_000010\n"
    store.save(20, files_for(20))
    assert latest(store) == "step_000020\n"
    assert store.latest_hint() == "step_000020"


def test_pruning_keeps_the_newest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        store.save(step, files_for(step))
    assert steps(store) == [4, 3]
    assert listing(store) == ["LATEST", "step_000003", "step_000004"]


def test_step_names_sort_and_grow_past_six_digits(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=5)
    for step in (999_999, 1_000_000, 5):
        store.save(step, {"x": b"%d" % step})
    # Saving 5 after the millions abandons them (see test_saving_a_lower_step_...).
    assert steps(store) == [5]
    assert step_dirname(1_000_000) == "step_1000000"


def test_replacing_an_existing_step(store: CheckpointStore) -> None:
    store.save(1, files_for(1))
    store.save(2, {"a": b"old", "only_in_old": b"x"})
    path = store.save(2, {"a": b"new"})
    assert store.load(store.committed()[0]).files == {"a": b"new"}
    assert not (path / "only_in_old").exists()
    assert steps(store) == [2, 1]
    assert listing(store) == ["LATEST", "step_000001", "step_000002"]


def test_saving_a_lower_step_abandons_the_higher_ones(store: CheckpointStore) -> None:
    # A run that resumed from step 10 (step 20 was rejected) saves step 15: step 20 is a
    # dead timeline and must never be a candidate again.
    for step in (10, 20):
        store.save(step, files_for(step))
    store.save(15, files_for(15))
    assert steps(store) == [15, 10]
    assert latest(store) == "step_000015\n"


def test_pruning_removes_uncommitted_step_directories(store: CheckpointStore) -> None:
    store.save(1, files_for(1))
    store.save(2, files_for(2))
    (store.directory / "step_000002" / "COMMITTED").unlink()
    store.save(3, files_for(3))
    assert listing(store) == ["LATEST", "step_000001", "step_000003"]


@pytest.mark.parametrize("bad", ["", "a/b", "/abs", "COMMITTED", ".", "..", "nul\0", "b\\s"])
def test_refused_file_name_writes_nothing(tmp_path: Path, bad: str) -> None:
    store = CheckpointStore(tmp_path / "run", keep=2)
    with pytest.raises(ValueError) as caught:
        store.save(1, {"good": b"1", bad: b"2"})
    assert repr(bad) in str(caught.value)
    assert not (tmp_path / "run").exists()

    store.save(1, files_for(1))
    before = listing(store)
    with pytest.raises(ValueError):
        store.save(2, {"good": b"1", bad: b"2"})
    assert listing(store) == before


def test_bad_step_keep_and_content_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep"):
        CheckpointStore(tmp_path, keep=0)
    store = CheckpointStore(tmp_path / "run", keep=1)
    for step in (-1, True, 1.0):
        with pytest.raises(ValueError, match="step"):
            store.save(step, {"a": b""})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'a'"):
        store.save(1, {"a": "text"})  # type: ignore[dict-item]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("fail_on_write", [1, 2, 4])  # a data file, a later one, COMMITTED
def test_enospc_mid_save_leaves_the_previous_checkpoint(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, fail_on_write: int
) -> None:
    store.save(1, files_for(1))
    latest_before = latest(store)
    real_write = _checkpoint_dir.write_new_file
    calls: list[Path] = []

    def full_disk(path: Path, data: bytes | memoryview, **options: Any) -> int:
        calls.append(path)
        if len(calls) == fail_on_write:
            # Half the bytes land, as when the disk fills mid-write.
            with open(path, "xb") as handle:
                handle.write(bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(path, data, **options)

    monkeypatch.setattr(_checkpoint_dir, "write_new_file", full_disk)
    with pytest.raises(OSError) as caught:
        store.save(2, files_for(2))
    assert len(calls) == fail_on_write
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename is not None
    assert Path(caught.value.filename).name.startswith(".tmp-step_000002-")
    assert str(calls[0].parent) == caught.value.filename

    assert listing(store) == ["LATEST", "step_000001"]
    assert latest(store) == latest_before
    result = store.newest_loadable(accept)
    assert result is not None
    assert result[1] == 1
    assert result[0].files == files_for(1)
    assert result[2] == []


# -- reading and falling back ------------------------------------------------------------


def flip_byte(directory: Path) -> None:
    path = directory / "rollout_recovery.pt"
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(directory: Path) -> None:
    path = directory / "data_plane.snapshot"
    path.write_bytes(path.read_bytes()[:-1])


def remove_file(directory: Path) -> None:
    (directory / "empty").unlink()


def remove_committed(directory: Path) -> None:
    (directory / "COMMITTED").unlink()


def garble_manifest(directory: Path) -> None:
    path = directory / "COMMITTED"
    path.write_bytes(path.read_bytes()[:-20])


def edit_manifest(change: Callable[[dict[str, object]], None]) -> Callable[[Path], None]:
    def corrupt(directory: Path) -> None:
        path = directory / "COMMITTED"
        manifest = json.loads(path.read_text())
        change(manifest)
        path.write_text(json.dumps(manifest))

    return corrupt


def _set(key: str, value: object) -> Callable[[dict[str, object]], None]:
    return lambda manifest: manifest.__setitem__(key, value)


def _file_entry(field: str, value: object) -> Callable[[dict[str, object]], None]:
    def change(manifest: dict[str, object]) -> None:
        files = manifest["files"]
        assert isinstance(files, dict)
        files["empty"][field] = value

    return change


def _add_file(name: str) -> Callable[[dict[str, object]], None]:
    def change(manifest: dict[str, object]) -> None:
        files = manifest["files"]
        assert isinstance(files, dict)
        files[name] = {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}

    return change


CORRUPTIONS = {
    "flipped byte": (flip_byte, "rollout_recovery.pt: sha256 mismatch"),
    "truncated": (truncate, "data_plane.snapshot: size mismatch"),
    "missing file": (remove_file, "empty: missing"),
    "missing COMMITTED": (remove_committed, "missing COMMITTED marker"),
    "bad JSON": (garble_manifest, "COMMITTED is not valid JSON"),
    "not an object": (lambda d: (d / "COMMITTED").write_text("[]"), "must be a JSON object"),
    "wrong format": (edit_manifest(_set("format", "other")), "format is 'other'"),
    "wrong version": (edit_manifest(_set("version", 1)), "unsupported version 1"),
    "wrong step": (edit_manifest(_set("step", 1)), "step is 1, but the directory is step_000002"),
    "extra field": (edit_manifest(_set("note", 1)), "unexpected ['note']"),
    "files not object": (edit_manifest(_set("files", [])), "files must be an object"),
    "bad size": (edit_manifest(_file_entry("size", -1)), "files['empty'].size"),
    "bad sha256": (edit_manifest(_file_entry("sha256", "XYZ")), "files['empty'].sha256"),
    "escaping name": (edit_manifest(_add_file("../step_000001/empty")), "plain name"),
    "listed file absent": (edit_manifest(_add_file("ghost")), "ghost: missing"),
}


@pytest.mark.parametrize("read_ahead", [False, True], ids=["read", "read ahead"])
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corruption_is_detected_and_the_previous_checkpoint_wins(
    store: CheckpointStore, corruption: str, read_ahead: bool
) -> None:
    corrupt, expected = CORRUPTIONS[corruption]
    store.save(1, files_for(1))
    bad = store.save(2, files_for(2))
    corrupt(bad)

    with pytest.raises(CheckpointDirectoryError) as caught:
        store.load(CommittedCheckpoint(2, "step_000002", bad))
    assert caught.value.directory == str(bad)
    assert expected in str(caught.value)

    if read_ahead:  # a resuming job's: the damage is found the same way
        store.read_ahead()
    result = store.newest_loadable(accept)
    assert result is not None
    loaded, verdict, skipped = result
    assert (loaded.step, verdict) == (1, 1)
    assert loaded.files == files_for(1)
    assert [(s.name, s.step, s.directory) for s in skipped] == [("step_000002", 2, bad)]
    assert expected in skipped[0].reason
    assert str(bad) not in skipped[0].reason  # short enough for one log line
    assert isinstance(skipped[0].error, CheckpointDirectoryError)


def _counting_loads(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, loaded: threading.Event | None = None
) -> list[tuple[int, str]]:
    """Every ``store.load``, as (step, the thread it ran in); sets ``loaded`` after each."""
    loads: list[tuple[int, str]] = []
    load = store.load

    def counted(checkpoint: CommittedCheckpoint, **kwargs: object) -> LoadedCheckpoint:
        loads.append((checkpoint.step, threading.current_thread().name))
        try:
            return load(checkpoint, **kwargs)  # type: ignore[arg-type]
        finally:
            if loaded is not None:
                loaded.set()

    monkeypatch.setattr(store, "load", counted)
    return loads


def test_read_ahead_loads_the_newest_once_in_its_own_thread(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.save(1, files_for(1))
    store.save(2, files_for(2))
    loads = _counting_loads(store, monkeypatch)
    store.read_ahead()
    result = store.newest_loadable(accept)
    assert result is not None and result[0].files == files_for(2)
    # Read once, not in the caller's thread: the restore takes what was read ahead.
    [(step, thread)] = loads
    assert step == 2 and thread != threading.current_thread().name
    # Taken once: the next search reads again.
    store.newest_loadable(accept)
    assert [step for step, _ in loads] == [2, 2]


def _dropped(store: CheckpointStore, read: threading.Event) -> dict[str, bytes]:
    store.drop_read_ahead()  # a job stopping before its restore: no read goes on after it
    assert read.is_set()
    return files_for(1)


def _saved_again(store: CheckpointStore, read: threading.Event) -> dict[str, bytes]:
    read.wait()  # the old files are read; then the same step is saved again
    store.save(1, {"rollout_recovery.pt": b"saved again"})
    return {"rollout_recovery.pt": b"saved again"}


@pytest.mark.parametrize("then", [_dropped, _saved_again], ids=["dropped", "saved again"])
def test_a_read_ahead_dropped_or_of_a_directory_replaced_since_is_not_used(
    store: CheckpointStore,
    monkeypatch: pytest.MonkeyPatch,
    then: Callable[[CheckpointStore, threading.Event], dict[str, bytes]],
) -> None:
    store.save(1, files_for(1))
    read = threading.Event()
    loads = _counting_loads(store, monkeypatch, read)
    store.read_ahead()
    expected = then(store, read)
    result = store.newest_loadable(accept)
    assert result is not None and result[0].files == expected
    assert [step for step, _ in loads] == [1, 1]  # the read ahead, then read again


def test_a_read_ahead_of_an_older_checkpoint_is_not_used(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.save(1, files_for(1))
    loads = _counting_loads(store, monkeypatch)
    store.read_ahead()
    store.save(2, files_for(2))
    result = store.newest_loadable(accept)
    assert result is not None and result[0].files == files_for(2)
    assert [step for step, _ in loads] == [1, 2]


def test_committed_lists_marked_directories_newest_first(store: CheckpointStore) -> None:
    for step in (1, 3, 2):
        store.save(step, files_for(step))
    # Saving 2 after 3 abandoned 3, so save it again to get three.
    assert steps(store) == [2, 1]
    store.save(3, files_for(3))
    assert steps(store) == [3, 2, 1]
    remove_committed(store.directory / "step_000002")
    assert steps(store) == [3, 1]
    (store.directory / "step_01").mkdir()  # not a canonical name: ignored
    (store.directory / "step_0000004").mkdir()
    assert steps(store) == [3, 1]


def test_verify_rejection_falls_back(store: CheckpointStore) -> None:
    store.save(1, files_for(1))
    store.save(2, files_for(2))

    def verify(loaded: LoadedCheckpoint) -> str:
        if loaded.step == 2:
            raise InvalidStateError("job configuration differs")
        return "ok"

    result = store.newest_loadable(verify)
    assert result is not None
    assert (result[0].step, result[1]) == (1, "ok")
    [skip] = result[2]
    assert skip.reason == "rejected by verify: InvalidStateError: job configuration differs"
    assert str(skip) == f"step_000002: {skip.reason}"


def test_verify_bug_propagates(store: CheckpointStore) -> None:
    store.save(1, files_for(1))

    def broken(loaded: LoadedCheckpoint) -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        store.newest_loadable(broken)


def test_fresh_directory_has_nothing_to_resume(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "missing", keep=1).newest_loadable(accept) is None
    (tmp_path / "run" / "checkpoints" / ".tmp-step_000001-abc").mkdir(parents=True)
    assert CheckpointStore(tmp_path / "run", keep=1).newest_loadable(accept) is None


def test_nothing_usable_is_an_error_not_a_fresh_start(store: CheckpointStore) -> None:
    store.save(1, files_for(1))
    store.save(2, files_for(2))
    flip_byte(store.directory / "step_000002")
    remove_file(store.directory / "step_000001")
    with pytest.raises(CheckpointDirectoryError) as caught:
        store.newest_loadable(accept)
    message = str(caught.value)
    assert "no loadable checkpoint" in message
    assert "step_000002: rollout_recovery.pt: sha256 mismatch" in message
    assert "step_000001: empty: missing" in message


def test_latest_naming_a_missing_checkpoint_is_reported(store: CheckpointStore) -> None:
    store.save(1, files_for(1))
    (store.directory / "LATEST").write_text("step_000009\n")
    result = store.newest_loadable(accept)
    assert result is not None
    assert result[1] == 1
    [skip] = result[2]
    assert (skip.name, skip.step) == ("step_000009", 9)
    assert "LATEST names 'step_000009'" in skip.reason


def test_latest_alone_is_not_a_fresh_start(store: CheckpointStore) -> None:
    store.save(1, files_for(1))
    (store.directory / "step_000001" / "COMMITTED").unlink()
    os.rename(store.directory / "step_000001", store.directory / ".gone")
    with pytest.raises(CheckpointDirectoryError, match="LATEST names 'step_000001'"):
        store.newest_loadable(accept)


# -- leftovers of killed saves -------------------------------------------------------------


def test_remove_stale_restores_a_replaced_checkpoint_whose_successor_never_landed(
    store: CheckpointStore,
) -> None:
    # Killed between "old step aside" and "new step in place": the old one must come back.
    store.save(1, files_for(1))
    store.save(2, files_for(2))
    aside = store.directory / ".replaced-step_000002-0123abcd"
    os.rename(store.directory / "step_000002", aside)
    (store.directory / ".tmp-step_000002-feed").mkdir()
    (store.directory / ".LATEST.x1y2.tmp").write_text("step_000002\n")
    removed = store.remove_stale()
    assert sorted(p.name for p in removed) == [".LATEST.x1y2.tmp", ".tmp-step_000002-feed"]
    assert listing(store) == ["LATEST", "step_000001", "step_000002"]
    assert store.load(store.committed()[0]).files == files_for(2)


def test_put_back_replaced_only_puts_the_checkpoint_back_and_leaves_the_rest(
    store: CheckpointStore,
) -> None:
    """What a resuming job runs before it chooses the newest checkpoint: the swapped-out
    checkpoint is back, and a refused run leaves the other leftovers where they were."""
    store.save(1, files_for(1))
    store.save(2, files_for(2))
    os.rename(store.directory / "step_000002", store.directory / ".replaced-step_000002-0a1b")
    (store.directory / ".tmp-step_000003-feed").mkdir()
    (store.directory / ".trash-step_000001-0123abcd").mkdir()
    (store.directory / ".LATEST.x1y2.tmp").write_text("step_000002\n")
    assert store.put_back_replaced() == [store.directory / "step_000002"]
    assert listing(store) == [
        ".LATEST.x1y2.tmp",
        ".tmp-step_000003-feed",
        ".trash-step_000001-0123abcd",
        "LATEST",
        "step_000001",
        "step_000002",
    ]
    assert store.committed()[0].name == "step_000002"
    assert store.put_back_replaced() == []


def test_undo_put_back_sets_the_checkpoint_aside_again_until_the_run_is_accepted(
    store: CheckpointStore,
) -> None:
    """A run refused after the put-back leaves the directory as it found it; once a run is
    accepted (``remove_stale``), what was put back stays."""
    store.save(1, files_for(1))
    store.save(2, files_for(2))
    aside = store.directory / ".replaced-step_000002-0a1b"
    os.rename(store.directory / "step_000002", aside)
    before = listing(store)
    assert store.put_back_replaced() == [store.directory / "step_000002"]

    assert store.undo_put_back() == [aside]

    assert listing(store) == before
    assert store.undo_put_back() == []  # once
    assert store.put_back_replaced() == [store.directory / "step_000002"]
    store.remove_stale()
    assert store.undo_put_back() == []
    assert store.committed()[0].name == "step_000002"


def test_put_back_replaced_with_nothing_to_put_back_writes_nothing(
    store: CheckpointStore,
) -> None:
    """Not even the publication lock's file (a refused run changes nothing)."""
    store.save(1, files_for(1))
    lock = store.root / ".checkpoints.lock"
    lock.unlink()

    assert store.put_back_replaced() == []

    assert not lock.exists()


def test_remove_stale_drops_a_replaced_checkpoint_whose_successor_landed(
    store: CheckpointStore,
) -> None:
    store.save(2, files_for(2))
    (store.directory / ".replaced-step_000002-0123abcd").mkdir()
    (store.directory / ".trash-step_000001-0123abcd").mkdir()
    store.save(3, files_for(3))
    assert listing(store) == ["LATEST", "step_000002", "step_000003"]


CRASH_CHILD = """
import sys
from pathlib import Path
from rollout_recovery.rundir._checkpoint_store import CheckpointStore
store = CheckpointStore(Path(sys.argv[1]), keep=3)
store.save(2, {"rollout_recovery.pt": b"two" * 100000, "empty": b""})
print("saved", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "resumed_step"),
    [
        ("checkpoint.before_committed", 1),
        ("checkpoint.before_rename", 1),
        ("checkpoint.before_latest", 2),
    ],
)
def test_sigkill_at_each_checkpoint_crash_point(
    store: CheckpointStore, point: str, resumed_step: int
) -> None:
    store.save(1, files_for(1))
    env = dict(os.environ)
    env[CRASH_AT_ENV] = point
    child = subprocess.run(
        [sys.executable, "-c", CRASH_CHILD, str(store.root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert child.stderr == f"crash point {point} fired\n"
    assert child.stdout == ""

    # What the crash left: LATEST was never moved; a temporary exactly until the rename.
    assert latest(store) == "step_000001\n"
    temporaries = [name for name in listing(store) if name.startswith(".tmp-step_000002-")]
    assert len(temporaries) == (0 if resumed_step == 2 else 1)
    if temporaries:
        has_marker = (store.directory / temporaries[0] / "COMMITTED").exists()
        assert has_marker == (point == "checkpoint.before_rename")

    result = store.newest_loadable(accept)
    assert result is not None
    loaded, verdict, skipped = result
    assert verdict == resumed_step
    assert skipped == []
    if resumed_step == 2:
        assert loaded.files == {"rollout_recovery.pt": b"two" * 100000, "empty": b""}
    else:
        assert loaded.files == files_for(1)

    store.save(3, files_for(3))
    assert not [name for name in listing(store) if name.startswith(".")]
    assert latest(store) == "step_000003\n"


# -- marks and the read lock ----------------------------------------------------------------


def test_marks_are_saved_in_the_manifest_and_loaded(store: CheckpointStore) -> None:
    store.save(3, files_for(3), marks={"events.jsonl": 1234, "metrics.jsonl": 0})
    loaded = store.load(store.committed()[0])
    assert loaded.marks == {"events.jsonl": 1234, "metrics.jsonl": 0}


@pytest.mark.parametrize(
    "marks", [{"events.jsonl": -1}, {"events.jsonl": True}, {"a/b": 1}, {"": 2}]
)
def test_bad_marks_are_refused_before_anything_is_written(
    store: CheckpointStore, marks: dict[str, object]
) -> None:
    with pytest.raises(ValueError, match="mark"):
        store.save(3, files_for(3), marks=marks)  # type: ignore[arg-type]
    assert not store.directory.exists() or listing(store) == []


def test_a_save_waits_for_a_reader_holding_the_read_lock(store: CheckpointStore) -> None:
    store.save(1, files_for(1))
    saved = threading.Event()
    with store.reading():
        writer = threading.Thread(target=lambda: (store.save(2, files_for(2)), saved.set()))
        writer.start()
        # The save is blocked on the lock: what the reader sees does not change under it.
        assert not saved.wait(0.3)
        assert [c.step for c in store.committed()] == [1]
    writer.join(timeout=30)
    assert saved.is_set()
    assert next(c.step for c in store.committed()) == 2
