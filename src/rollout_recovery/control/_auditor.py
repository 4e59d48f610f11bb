"""``rollout-recovery audit DIR``: check a run's invariants from what it committed.

Read-only. It checks DESIGN §5 invariants 1 to 6 from the audit trail and the committed
checkpoints:

1-3. from the trail (``_trail_check``): each group trained in exactly one step with
     exactly N rows; no sibling or prompt trained twice; every prompt taken is trained,
     dropped with a reason, or still owned by the newest checkpoint; every sealed sibling
     trained with its sealed rollout id unless an abandon or drop event says why not;
4.   in each committed checkpoint: the ledger and the replay index do not both own a
     group, and the data plane
     holds every staged row the ledger expects and every canonical row the index owns.
     (The store is live and shared by the retained checkpoints, so it holds a superset:
     exactness is enforced when a checkpoint is restored, by the inventory pass.) Only
     checkpoints at or after the last restore are held to this: a restore deletes rows
     only older checkpoints referenced, which makes those superseded, not broken;
5-6. every ``step_*`` directory is complete (``COMMITTED`` manifest, sizes, sha256) and
     ``LATEST`` names a committed checkpoint; temporary directories are never published.

A run that is still going (or was killed) is audited up to its newest committed
checkpoint: the trail's committed prefix, plus what that checkpoint still owns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..capture import STAGING_PARTITION
from ..dataplane import CANONICAL_PARTITION, SqliteDataPlane
from ..errors import NotARunDirectoryError, RolloutRecoveryError
from ..ledger import RolloutAttemptStatus, RolloutRecoveryLedger
from ._audit import EVENTS
from ._checkpoint_dir import CheckpointStore, LoadedCheckpoint
from ._checkpointing import decode_checkpoint_files
from ._config import load_config
from ._layout import DATA_PLANE_FILE, JOB_FILE, RUN_LOG, SHARDS_DIR
from ._state import ControllerState
from ._trail_check import CommittedOwnership, TrailLineError, _lines, check_trail

__all__ = ["AuditReport", "audit_run"]


@dataclass(slots=True)
class AuditReport:
    """The verdict, the counts, and the first violations (each naming ids and lines)."""

    run_dir: Path
    complete: bool
    audited_through_step: int
    violations: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

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
    state: ControllerState
    ledger: RolloutRecoveryLedger
    replay_groups: dict[str, list[str]]


def audit_run(run_dir: Path) -> AuditReport:
    """Audit ``run_dir``; raises :class:`NotARunDirectoryError` if it is not a run."""
    job_file = run_dir / JOB_FILE
    if not run_dir.is_dir() or not job_file.is_file():
        raise NotARunDirectoryError(
            f"{run_dir} is not a rollout-recovery run directory (no {JOB_FILE})"
        )
    try:
        config = load_config(job_file)
    except RolloutRecoveryError as error:
        raise NotARunDirectoryError(f"{job_file} is not a valid job file: {error}") from None
    store = CheckpointStore(run_dir, keep=config.checkpoint.keep)
    violations: list[str] = []
    checkpoints = _committed_checkpoints(store, violations)
    newest = checkpoints[0] if checkpoints else None
    complete = newest is not None and newest.step == config.job.steps
    try:
        restored_step = _last_restore_step(run_dir)
    except TrailLineError as error:
        violations.append(str(error))
        restored_step = None
    _check_checkpoint_rows(run_dir, checkpoints, restored_step, violations)

    committed = None
    if newest is not None and not complete:
        committed = _ownership(newest)
    if newest is None:
        # Nothing committed yet: nothing of the trail is part of any history.
        trail_counts: dict[str, int] = {}
    else:
        trail = check_trail(
            run_dir,
            group_size=config.job.generations_per_prompt,
            complete=complete,
            committed=committed if committed is not None else _ownership_offsets(newest),
        )
        violations.extend(trail.violations)
        trail_counts = trail.counts
    counts = {
        "rows": trail_counts.get("rows_trained", 0),
        "groups": trail_counts.get("groups_trained", 0),
        "steps": newest.step if newest else 0,
        "prompts_taken": trail_counts.get("prompts_taken", 0),
        "dropped": trail_counts.get("prompts_dropped", 0),
        "checkpoints": len(checkpoints),
        **_restore_counts(run_dir, newest, violations),
    }
    return AuditReport(
        run_dir=run_dir,
        complete=complete,
        audited_through_step=newest.step if newest else 0,
        violations=violations,
        counts=counts,
    )


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
    files = decode_checkpoint_files(loaded)
    return _Checkpoint(
        name=loaded.name,
        step=loaded.step,
        state=files.controller_state,
        ledger=RolloutRecoveryLedger.from_state_dict(files.parsed.ledger_state),
        replay_groups={
            group["group_id"]: list(group["row_keys"]) for group in files.replay_state["groups"]
        },
    )


def _ownership(checkpoint: _Checkpoint) -> CommittedOwnership:
    return CommittedOwnership(
        ledger_groups={
            group.group_id: {
                sibling.generation_index: group.gate_rollout_id(sibling.generation_index)
                for sibling in group.siblings
                if sibling.current_attempt.status is RolloutAttemptStatus.SEALED
            }
            for group in checkpoint.ledger.groups()
        },
        replay_groups=frozenset(checkpoint.replay_groups),
        offsets=dict(checkpoint.state.audit_offsets),
    )


def _ownership_offsets(checkpoint: _Checkpoint) -> CommittedOwnership:
    """A finished run: only the committed prefix, with nothing left owned."""
    return CommittedOwnership(
        ledger_groups={}, replay_groups=frozenset(), offsets=dict(checkpoint.state.audit_offsets)
    )


def _last_restore_step(run_dir: Path) -> int | None:
    """The step of the checkpoint the last resume restored (``run_log.jsonl``), if any."""
    last = None
    if (run_dir / RUN_LOG).is_file():
        for _, line in _lines(run_dir / RUN_LOG):
            if line.get("event") == "resume":
                last = int(line["step"])
    return last


def _check_checkpoint_rows(
    run_dir: Path,
    checkpoints: list[_Checkpoint],
    restored_step: int | None,
    violations: list[str],
) -> None:
    if not checkpoints:
        return
    # The embedded store, or the Ray backend's shards: read straight from their files, so
    # the audit needs no cluster.
    files = [run_dir / DATA_PLANE_FILE] if (run_dir / DATA_PLANE_FILE).is_file() else []
    files += sorted((run_dir / SHARDS_DIR).glob("shard-*.sqlite"))
    if not files:
        violations.append(f"{DATA_PLANE_FILE} is missing but checkpoints own rows in it")
        return
    staged: set[str] = set()
    canonical: set[str] = set()
    for path in files:
        with SqliteDataPlane(path) as store:
            staged.update(store.keys(STAGING_PARTITION))
            canonical.update(store.keys(CANONICAL_PARTITION))
    for checkpoint in checkpoints:
        where = f"checkpoint {checkpoint.name}"
        both = sorted(
            set(checkpoint.replay_groups) & {g.group_id for g in checkpoint.ledger.groups()}
        )
        if both:
            violations.append(f"{where}: groups owned by both ledger and replay index: {both[:10]}")
        if restored_step is not None and checkpoint.step < restored_step:
            continue  # superseded by a restore from a newer checkpoint
        missing_staged = sorted(checkpoint.ledger.expected_staging_keys() - staged)
        owned_rows = {key for keys in checkpoint.replay_groups.values() for key in keys}
        missing_canonical = sorted(owned_rows - canonical)
        if missing_staged:
            violations.append(
                f"{where}: staged rows the ledger expects are missing from {DATA_PLANE_FILE}: "
                f"{missing_staged[:10]} (total={len(missing_staged)})"
            )
        if missing_canonical:
            violations.append(
                f"{where}: canonical rows the replay index owns are missing: "
                f"{missing_canonical[:10]} (total={len(missing_canonical)})"
            )


def _restore_counts(
    run_dir: Path, newest: _Checkpoint | None, violations: list[str]
) -> dict[str, int]:
    """Resumes (``run_log.jsonl``); siblings reused and regenerated by committed restores.

    A damaged line is reported once (the trail check or the restore scan already named it).
    """
    try:
        return _count_restores(run_dir, newest)
    except TrailLineError as error:
        if str(error) not in violations:
            violations.append(str(error))
        return {"restores": 0, "reused": 0, "regenerated": 0}


def _count_restores(run_dir: Path, newest: _Checkpoint | None) -> dict[str, int]:
    restores = reused = regenerated = 0
    if (run_dir / RUN_LOG).is_file():
        restores = sum(1 for _, line in _lines(run_dir / RUN_LOG) if line["event"] == "resume")
    if newest is not None and (run_dir / EVENTS).is_file():
        for _, event in _lines(run_dir / EVENTS, newest.state.audit_offsets.get(EVENTS)):
            if event.get("event") == "restored":
                reused += int(event.get("sealed_siblings_kept") or 0)
                regenerated += int(event.get("seals_lost") or 0)
    return {"restores": restores, "reused": reused, "regenerated": regenerated}
