"""``rollout-recovery audit DIR``: check a run's invariants from what it committed.

Read-only, and safe on a live run: the checkpoints, and the data plane's rows they are
checked against, are read under the checkpoint store's shared lock, so no checkpoint is
pruned (nor its rows deleted) and ``LATEST`` does not move while they are read. The
history is read whole (a live run's last line, if a write is in progress, is a torn tail
and left out). It checks DESIGN §5 invariants 1 to 6 from the history and the committed
checkpoints:

1-3. from the history (``_trail_check``), a proof: every record is checked against the
     records that established what it states (each trained row against its seal, its
     prompt and its group's publish; each seal against the round that dispatched it; each
     restore against a replay of the journal after its snapshot), and what survives must
     hold: the dataloader's positions contiguous; each group trained in exactly one step
     with exactly N rows; steps in order with the groups they still expected; no sibling
     or prompt trained twice; every prompt taken trained, dropped with a reason, or still
     in flight; every sealed sibling trained with its sealed rollout id unless a drop or a
     restore's discard says why not;
4.   in each committed checkpoint: the ledger and the replay index do not both own a group,
     and the data plane holds every staged row the ledger expects and every canonical row
     the index owns (checkpoints older than the last restore are superseded and skipped);
5-6. every ``step_*`` directory is complete and ``LATEST`` names a committed checkpoint;
     the history files are at least as long as the newest checkpoint recorded and hold the
     steps it trained, so an emptied or truncated trail cannot pass;
and for a dataset task, exactly once over the user's data (``_dataset_check``): the data
unchanged, each prompt the row the dataloader's order gives, no row trained twice in an
epoch.

A run that is still going (or was killed) is complete once its history trained every
step; until then, prompts and seals still in flight are not violations. Every problem is
a violation naming the file, ids and lines involved, never a traceback.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from .._settings import read_toml
from ..capture import CaptureWriter
from ..checkpoint import SidecarFormat
from ..dataplane import ReplayIndex, SqliteDataPlane
from ..errors import (
    CheckpointDirectoryError,
    ConfigError,
    NotARunDirectoryError,
    RolloutRecoveryError,
    TrailLineError,
)
from ..ledger import RolloutRecoveryLedger, parse_rollout_recovery_state
from ..rundir import CheckpointStore, LoadedCheckpoint, RunDirectory
from ._dataset_check import check_dataset
from ._journal import JournalCorruptError, scan_journal
from ._trail_check import check_trail
from ._trail_reader import read_entries
from .records import Restored

__all__ = ["AuditReport", "audit_run"]

REPLAY_FILE = CheckpointStore.FILES.replay_index


@dataclass(slots=True)
class AuditReport:
    """The verdict, the counts, and the first violations (each naming ids and lines)."""

    run_dir: Path
    complete: bool
    audited_through_step: int
    violations: list[str] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "verdict": "pass" if self.ok else "fail",
            "complete": self.complete,
            "audited_through_step": self.audited_through_step,
            "counts": dict(self.counts),
            "violations": list(self.violations),
        }


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    name: str
    step: int
    marks: dict[str, int]
    ledger: RolloutRecoveryLedger
    replay_groups: dict[str, list[str]]
    lineage: str


def audit_run(run_dir: Path) -> AuditReport:
    """Audit ``run_dir``; raises :class:`NotARunDirectoryError` if it is not a run."""
    run = RunDirectory(run_dir)
    if not run.root.is_dir() or not run.job_file.is_file():
        raise NotARunDirectoryError(
            f"{run_dir} is not a rollout-recovery run directory (no {run.job_file.name})"
        )
    try:
        job = read_toml(run.job_file)
    except ConfigError as error:
        raise NotARunDirectoryError(f"{run.job_file} is not a valid job file: {error}") from None
    violations: list[str] = []
    store = CheckpointStore(run.root, keep=1)
    with store.reading():
        checkpoints = _committed_checkpoints(store, violations)
        # Still under the lock: once it is released the job may commit the next
        # checkpoint, prune the oldest one read here and delete the rows it owned.
        restored_at = _last_restore_offset(run)
        _check_checkpoint_rows(run, checkpoints, restored_at, violations)
    newest = checkpoints[0] if checkpoints else None
    counts: dict[str, Any] = {
        "checkpoints": len(checkpoints),
        # Which lineage the sidecars were read as; a Gym-lineage one is a violation instead.
        "sidecar_lineage": ", ".join(sorted({c.lineage for c in checkpoints})) or None,
    }
    complete = False
    if newest is not None:
        complete = _audit_history(run, newest, violations, counts)
        if not violations:
            _audit_dataset(run, job, violations, counts)
    counts.setdefault("steps", newest.step if newest else 0)
    return AuditReport(
        run_dir=run_dir,
        complete=complete,
        audited_through_step=newest.step if newest else 0,
        violations=violations,
        counts=counts,
    )


def _audit_history(
    run: RunDirectory, newest: _Checkpoint, violations: list[str], counts: dict[str, Any]
) -> bool:
    """Check the history against itself and the newest checkpoint; True if complete."""
    for path in (run.events, run.metrics):
        mark = newest.marks.get(path.name)
        if mark is None:
            violations.append(f"checkpoint {newest.name} records no length for {path.name}")
            continue
        if not path.is_file():
            violations.append(
                f"{path.name} is missing, but checkpoint {newest.name} holds {mark} bytes of it"
            )
            continue
        length = path.stat().st_size
        if length < mark:
            violations.append(
                f"{path.name} is {length} bytes but checkpoint {newest.name} recorded {mark}: "
                "the trail lost history the checkpoint had synced"
            )
    if not run.events.is_file():
        return False
    trail = check_trail(run.events)
    violations.extend(trail.violations)
    if not trail.ok:
        return False
    position = newest.marks.get(run.events.name, 0)
    before = sum(1 for offset in trail.surviving_step_offsets if offset < position)
    if before != newest.step:
        violations.append(
            f"checkpoint {newest.name} is at step {newest.step} but {run.events.name} holds "
            f"{before} trained steps before its position {position}"
        )
    torn = scan_journal(run.events, start=min(position, run.events.stat().st_size)).torn_bytes
    rows = trail.counts.get("rows_trained", 0)
    # A step the trainer refused (another model's logprobs) trained none of its valid rows.
    valid = trail.counts.get("valid_rows_trained", 0) - trail.counts.get("valid_rows_refused", 0)
    counts.update(
        rows=rows,
        valid_rows=valid,
        valid_row_fraction=round(valid / rows, 4) if rows else None,
        steps_refused=trail.counts.get("steps_refused", 0),
        groups=trail.counts.get("groups_trained", 0),
        steps=len(trail.surviving_steps),
        prompts_taken=trail.counts.get("prompts_taken", 0),
        dropped=trail.counts.get("prompts_dropped", 0),
        seals=trail.counts.get("seals", 0),
        seals_trained=trail.counts.get("seals_trained", 0),
        seals_excused=trail.counts.get("seals_abandoned", 0),
        torn_tail_bytes=torn,
        restores=trail.counts.get("restores", 0),
        reused=trail.counts.get("restored_seals_kept", 0),
        regenerated=trail.counts.get("restored_seals_discarded", 0),
        replayed_records=trail.counts.get("replayed_records", 0),
    )
    return trail.complete


def _audit_dataset(
    run: RunDirectory, job: dict[str, Any], violations: list[str], counts: dict[str, Any]
) -> None:
    """A dataset task's journal against its data (``_dataset_check``)."""
    found, dataset_counts = check_dataset(
        job, read_entries(run.events), check_trail(run.events).rows, journal=run.events.name
    )
    violations.extend(found)
    counts.update(dataset_counts)


def _committed_checkpoints(store: CheckpointStore, violations: list[str]) -> list[_Checkpoint]:
    """Every published checkpoint, newest first; damaged ones become violations."""
    found: list[_Checkpoint] = []
    if store.directory.is_dir():
        for path in sorted(store.directory.iterdir()):
            if path.name.startswith("step_") and not (path / "COMMITTED").is_file():
                violations.append(f"checkpoint {path.name} is published without COMMITTED")
    for committed in store.committed():
        try:
            found.append(_decode(store.load(committed)))
        except (RolloutRecoveryError, ValueError, OSError) as error:
            violations.append(f"checkpoint {committed.name} is published but unusable: {error}")
    hint = store.latest_hint()
    names = {checkpoint.name for checkpoint in found}
    if hint is not None and hint not in names:
        violations.append(f"LATEST names {hint!r}, which is not a usable committed checkpoint")
    return found


def _decode(loaded: LoadedCheckpoint) -> _Checkpoint:
    names = [name for name in SidecarFormat.filenames() if name in loaded.files]
    if len(names) != 1:
        raise CheckpointDirectoryError(
            f"expected exactly one sidecar of {list(SidecarFormat.filenames())}, found {names}",
            directory=str(loaded.directory),
        )
    if REPLAY_FILE not in loaded.files:
        raise CheckpointDirectoryError(f"missing {REPLAY_FILE}", directory=str(loaded.directory))
    _, sidecar_state = SidecarFormat.decode(loaded.files[names[0]])
    lineage = SidecarFormat.lineage(sidecar_state)
    # Refuses a Gym-lineage sidecar, naming it: its attempts are never this run's.
    parsed = parse_rollout_recovery_state(sidecar_state)
    try:
        replay_state = msgspec.msgpack.decode(loaded.files[REPLAY_FILE], type=dict[str, Any])
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise CheckpointDirectoryError(
            f"unreadable {REPLAY_FILE}: {error}", directory=str(loaded.directory)
        ) from None
    replay_groups = ReplayIndex.saved_groups(replay_state)
    return _Checkpoint(
        name=loaded.name,
        step=loaded.step,
        marks=dict(loaded.marks),
        ledger=RolloutRecoveryLedger.from_state_dict(parsed.ledger_state),
        replay_groups={group_id: list(keys) for group_id, keys in replay_groups.items()},
        lineage=lineage.value,
    )


def _last_restore_offset(run: RunDirectory) -> int | None:
    """Where the last restore's record sits in the history (a byte offset), if any."""
    if not run.events.is_file():
        return None
    last = None
    try:
        for entry in read_entries(run.events):
            if isinstance(entry.record, Restored):
                last = entry.offset
    except (JournalCorruptError, TrailLineError):
        return None  # the history check reports the damaged line
    return last


def _check_checkpoint_rows(
    run: RunDirectory,
    checkpoints: list[_Checkpoint],
    restored_at: int | None,
    violations: list[str],
) -> None:
    if not checkpoints:
        return
    # The embedded store, or the Ray backend's shards: read straight from their files, so
    # the audit needs no cluster.
    files = run.data_plane_files()
    if not files:
        violations.append(f"{run.data_plane_file.name} is missing but checkpoints own rows in it")
        return
    staged: set[str] = set()
    canonical: set[str] = set()
    for path in files:
        try:
            with SqliteDataPlane(path) as store:
                staged.update(store.keys(CaptureWriter.staging_partition))
                canonical.update(store.keys(ReplayIndex.canonical_partition))
        except (RolloutRecoveryError, sqlite3.Error, OSError) as error:
            violations.append(f"{path.name} cannot be read as a data plane: {error}")
            return
    for checkpoint in checkpoints:
        where = f"checkpoint {checkpoint.name}"
        both = sorted(
            set(checkpoint.replay_groups) & {g.group_id for g in checkpoint.ledger.groups()}
        )
        if both:
            violations.append(f"{where}: groups owned by both ledger and replay index: {both[:10]}")
        if restored_at is not None and checkpoint.marks.get(run.events.name, 0) <= restored_at:
            # Superseded: a restore replayed past it and kept only the rows the state at
            # the end of the journal needs (the job itself verifies that on every start).
            continue
        missing_staged = sorted(checkpoint.ledger.expected_staging_keys() - staged)
        owned_rows = {key for keys in checkpoint.replay_groups.values() for key in keys}
        missing_canonical = sorted(owned_rows - canonical)
        if missing_staged:
            violations.append(
                f"{where}: staged rows the ledger expects are missing from the data plane: "
                f"{missing_staged[:10]} (total={len(missing_staged)})"
            )
        if missing_canonical:
            violations.append(
                f"{where}: canonical rows the replay index owns are missing: "
                f"{missing_canonical[:10]} (total={len(missing_canonical)})"
            )
