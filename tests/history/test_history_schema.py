"""The history's schema and its version: a change to a record is a change of
``HISTORY_VERSION``; a reader reads every version it says it reads and refuses others by
name.

``tests/fixtures/history/v1/events.jsonl`` is a real run's journal written by history
version 1 (commit add37de), kept byte for byte: version 2 only added, so it reads and
audits as it is.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from trail_builders import started, write_trail

from rollout_recovery.errors import RunNotResumableError, TrailLineError
from rollout_recovery.history import AuditTrail, JournalReport
from rollout_recovery.history._trail_check import check_trail
from rollout_recovery.history.records import (
    HISTORY_VERSION,
    READABLE_HISTORY_VERSIONS,
    HistoryRecord,
    Restored,
    RunStarted,
)
from rollout_recovery.rundir import CheckpointStore, RunDirectory

V1 = Path(__file__).parents[1] / "fixtures" / "history" / "v1" / "events.jsonl"

#: The digest of each released (or to be released) history version's schema: the msgspec
#: JSON schema of ``HistoryRecord``, docstrings left out.
PINNED = {2: "acd5bc4f336c6054256494130246b1a82cc09b522ffc13d64b604a41b010c6b5"}


def _without_descriptions(value: Any) -> Any:
    # A docstring is not the format: only what a reader decodes is.
    if isinstance(value, dict):
        return {k: _without_descriptions(v) for k, v in value.items() if k != "description"}
    if isinstance(value, list):
        return [_without_descriptions(v) for v in value]
    return value


def schema_digest() -> str:
    schema = _without_descriptions(msgspec.json.schema(HistoryRecord))
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_history_schema_changes_only_with_its_version() -> None:
    digest = schema_digest()
    assert PINNED.get(HISTORY_VERSION) == digest, (
        f"the history schema (src/rollout_recovery/history/records.py) is not the one "
        f"pinned for HISTORY_VERSION {HISTORY_VERSION}: its digest is now {digest}. If "
        f"version {HISTORY_VERSION} was released (a tag or a published wheel wrote it), "
        f"this is a new version: set HISTORY_VERSION to {HISTORY_VERSION + 1} in "
        "src/rollout_recovery/history/records.py, pin this digest for it in PINNED "
        "(tests/history/test_history_schema.py), and read the old version or refuse it by "
        "name (READABLE_HISTORY_VERSIONS, docs/journal.md 'Versioning'). If version "
        f"{HISTORY_VERSION} was never released, keep the version and update its digest in "
        "PINNED (tests/history/test_history_schema.py) to the one above."
    )


def test_the_digest_sees_a_changed_field() -> None:
    """The pin must be able to fail: a new field with a default changes the digest."""

    class Extra(RunStarted, tag="run_started", frozen=True, kw_only=True):
        extra: int = 0

    changed = _without_descriptions(msgspec.json.schema(Extra))
    same = _without_descriptions(msgspec.json.schema(RunStarted))
    assert changed != same


def test_the_version_is_written_in_every_run_started() -> None:
    assert started().version == HISTORY_VERSION
    assert {1, HISTORY_VERSION} <= READABLE_HISTORY_VERSIONS


def test_a_version_1_history_reads_and_audits_complete() -> None:
    first = msgspec.json.decode(V1.read_bytes().splitlines()[0])
    assert first["version"] == 1, "the fixture must stay the version-1 journal it was"
    report = check_trail(V1)
    assert report.ok, report.violations
    assert report.complete and report.counts["rows_trained"] == 4 * 2 * 2
    records = AuditTrail.read_history(RunDirectory(V1.parent))
    assert any(isinstance(r, Restored) for r in records), "it holds a restore"


def test_a_version_1_history_resumed_by_this_version_reads_on(tmp_path: Path) -> None:
    path = tmp_path / "run" / "events.jsonl"
    path.parent.mkdir()
    path.write_bytes(V1.read_bytes())
    write_trail(tmp_path / "run", [msgspec.structs.replace(started(steps=4), step=4)])
    records = AuditTrail.read_history(RunDirectory(tmp_path / "run"))
    versions = [r.version for r in records if isinstance(r, RunStarted)]
    assert versions == [1, 1, HISTORY_VERSION]


def _journal_with_versions(tmp_path: Path, *versions: int) -> Path:
    """A run directory whose journal holds one ``run_started`` per version."""
    records: list[HistoryRecord] = [
        msgspec.structs.replace(started(), version=version) for version in versions
    ]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "job.toml").write_text("")
    return write_trail(tmp_path / "run", records)


@pytest.mark.parametrize("version", [0, HISTORY_VERSION + 1])
def test_a_history_of_a_version_it_does_not_read_is_refused_by_name(
    tmp_path: Path, version: int
) -> None:
    path = _journal_with_versions(tmp_path, HISTORY_VERSION, version)
    (violation,) = check_trail(path).violations
    assert "events.jsonl:2 (byte " in violation
    assert f"history version {version}; this rollout-recovery reads versions 1 and 2" in violation
    with pytest.raises(TrailLineError, match=f"history version {version};"):
        AuditTrail.read_history(RunDirectory(tmp_path / "run"))
    report = JournalReport.inspect(tmp_path / "run")
    assert not report.ok
    assert any(f"history version {version};" in problem for problem in report.problems)


def test_an_older_version_appended_after_a_newer_one_is_refused(tmp_path: Path) -> None:
    path = _journal_with_versions(tmp_path, HISTORY_VERSION, 1)
    (violation,) = check_trail(path).violations
    assert f"history version 1, after version {HISTORY_VERSION} at line 1" in violation
    assert "an older rollout-recovery appended to this history" in violation


@pytest.mark.parametrize("versions", [(HISTORY_VERSION + 1,), (HISTORY_VERSION, 1)])
def test_a_job_refuses_to_resume_a_history_it_does_not_read_changing_nothing(
    tmp_path: Path, versions: tuple[int, ...]
) -> None:
    path = _journal_with_versions(tmp_path, *versions)
    before = path.read_bytes()
    run = RunDirectory(tmp_path / "run")
    with pytest.raises(RunNotResumableError, match=f"history version {versions[-1]}") as caught:
        AuditTrail.require_synced_history(run, CheckpointStore(run.root, keep=1))
    assert caught.value.rerun_resumes is False
    assert path.read_bytes() == before


def test_a_job_resumes_a_version_1_history(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    run.root.mkdir()
    run.events.write_bytes(V1.read_bytes())
    AuditTrail.require_synced_history(run, CheckpointStore(run.root, keep=1))
