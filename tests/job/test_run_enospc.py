"""A full disk stops the run with an error that says so; after space is freed, the same
command resumes and the audit passes.

On a real size-limited tmpfs where the machine allows mounting one (root), and through an
injected ENOSPC at each write the issue names: a staging put, a checkpoint write and an
audit-trail append.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.control import RunConfig
from rollout_recovery.dataplane import SqliteDataPlane
from rollout_recovery.errors import StorageFullError
from rollout_recovery.history import _journal as _audit
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job
from rollout_recovery.rundir import CheckpointStore
from rollout_recovery.rundir import _checkpoint_store as _checkpoint_dir

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 400 KiB tmpfs (the fast job needs about 700 KiB), unmounted at the end."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount_point)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_real_full_disk_stops_the_run_and_the_same_command_resumes_after_space_is_freed(
    small_disk: Path,
    write_config: Callable[..., Path],
    run_cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    config = write_config()
    out = small_disk / "run"
    full = run_cli(["--out", str(out), "--config", str(config), "--plain"])
    assert full.returncode == 1, full.stdout
    assert "no space left on device" in full.stdout
    assert "Traceback" not in full.stdout
    # Whatever was committed before the disk filled is intact and loadable.
    committed = CheckpointStore(out, keep=3).committed()
    for checkpoint in committed:
        CheckpointStore(out, keep=3).load(checkpoint)

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    resumed = run_cli(["--out", str(out), "--config", str(config), "--plain"])
    assert resumed.returncode == 0, resumed.stdout
    report = audit_run(out)
    assert report.ok, report.violations
    assert report.complete


def _fail_after(count: int, error: Callable[[], BaseException]) -> Callable[..., Any]:
    """A replacement that raises ``error()`` from its ``count``-th call on."""
    calls = {"n": 0}

    def check() -> None:
        calls["n"] += 1
        if calls["n"] >= count:
            raise error()

    return check


def _resume_and_audit(out: Path, config: RunConfig) -> None:
    run_job(out, config)
    report = audit_run(out)
    assert report.ok, report.violations
    assert report.complete


def _newest_step(out: Path) -> int:
    committed = CheckpointStore(out, keep=3).committed()
    assert committed, "a checkpoint was committed before the disk filled"
    CheckpointStore(out, keep=3).load(committed[0])  # intact: sizes and sha256 match
    return committed[0].step


def test_enospc_in_a_staging_put_stops_the_run_and_resume_passes_the_audit(
    tmp_path: Path, fast_config: Callable[..., RunConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = fast_config()
    out = tmp_path / "run"
    original = SqliteDataPlane.put
    check = _fail_after(120, lambda: StorageFullError("writing the data plane (put)"))

    def put(self: SqliteDataPlane, partition: str, rows: Any, **kwargs: Any) -> None:
        if partition == "rollout_staging":
            check()
        original(self, partition, rows, **kwargs)

    monkeypatch.setattr(SqliteDataPlane, "put", put)
    with pytest.raises(StorageFullError, match="no space left on device"):
        run_job(out, config)
    assert _newest_step(out) < config.job.steps
    monkeypatch.setattr(SqliteDataPlane, "put", original)
    _resume_and_audit(out, config)


def test_enospc_in_a_checkpoint_write_keeps_the_previous_checkpoint(
    tmp_path: Path, fast_config: Callable[..., RunConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = fast_config()
    out = tmp_path / "run"
    original = _checkpoint_dir.write_new_file
    # Each checkpoint writes 4 files; fail inside the third checkpoint.
    check = _fail_after(10, lambda: OSError(errno.ENOSPC, "No space left on device"))

    def write(path: Path, data: bytes | memoryview, **options: Any) -> int:
        check()
        return original(path, data, **options)

    monkeypatch.setattr(_checkpoint_dir, "write_new_file", write)
    with pytest.raises(OSError) as raised:
        run_job(out, config)
    assert raised.value.errno == errno.ENOSPC
    assert _newest_step(out) < config.job.steps  # the last good one, intact
    leftovers = [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == []
    monkeypatch.setattr(_checkpoint_dir, "write_new_file", original)
    _resume_and_audit(out, config)


def test_a_short_audit_append_stops_the_run_instead_of_tearing_the_trail(
    tmp_path: Path, fast_config: Callable[..., RunConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = fast_config()
    out = tmp_path / "run"
    original = _audit._write
    calls = {"n": 0}

    def write(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] >= 150:  # the disk fills mid-line: only half of it lands
            return original(fd, data[: len(data) // 2])
        return original(fd, data)

    monkeypatch.setattr(_audit, "_write", write)
    with pytest.raises(StorageFullError, match="appending to"):
        run_job(out, config)
    monkeypatch.setattr(_audit, "_write", original)
    _resume_and_audit(out, config)
