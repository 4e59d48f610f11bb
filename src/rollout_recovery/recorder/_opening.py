"""Opening a recorder's run directory: a fresh start, or a restore.

Under the run directory's lock (held until the recorder closes), an existing run is
checked as the job checks one (``AuditTrail.require_synced_history``; a torn tail cut),
then restored to where the caller's trainer resumed: the state at the position of its
checkpoint's ``checkpoint_committed`` (``resume_checkpoint``; the journal's start for a
fresh trainer), built from the newest snapshot before it, with everything after it
replayed through the same transitions (``control.RecordedRun.restore``): training after
it is rolled back, every seal is kept, attempts in flight are abandoned (``restart``).
Each abandoned sibling gets a fresh attempt at once (``round_started``), handed the staged
calls of the lost one (``attempt_resumed``; the rows are copied under the new attempt's
keys first, so a second crash finds them under the attempt it continues; the lost
attempt's go with the next checkpoint's collection). Then
``run_started``, all in one write, and a checkpoint of the restored state tagged with the
caller's checkpoint: a newer snapshot of a timeline the caller abandoned is replaced by it.
"""

from __future__ import annotations

import os
import tomllib
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from .._durable import atomic_write_bytes
from ..capture import CaptureWriter
from ..control import RecordedRun
from ..dataplane import ReplayIndex, SqliteDataPlane
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, NotARunDirectoryError
from ..history import AuditTrail, JournalEntry, JournalScan, records
from ..ledger import PromptGroupStatus, RolloutAttemptStatus
from ..rundir import CheckpointStore, RunDirectory
from ._keys import KeyIndex, read_seal
from ._rows import DeferredClears, call_key, canonical_row, output_key, output_row, row_call
from ._values import StagedCall

if TYPE_CHECKING:
    from ._recorder import Recorder

__all__ = ["open_recorder"]

#: Snapshots kept: the newest, which owns every row the state owns when it is taken (rows
#: are deleted only then, ``_rows.DeferredClears``). A caller resuming an older checkpoint
#: is restored from the journal's start (slower, never wrong).
_KEEP = 1
_JOB_FILE_TABLE = "recorder"


def open_recorder(
    cls: type[Recorder], root: Path, *, group_size: int, resume_checkpoint: str | None
) -> Recorder:
    if type(group_size) is not int or group_size < 1:
        raise InvalidArgumentTypeError(f"group_size must be an int >= 1, got {group_size!r}")
    if resume_checkpoint is not None and (
        not isinstance(resume_checkpoint, str) or not resume_checkpoint
    ):
        raise InvalidArgumentTypeError(
            f"resume_checkpoint must be None or a checkpoint tag, got {resume_checkpoint!r}"
        )
    run = RunDirectory(root)
    with ExitStack() as stack:
        stack.enter_context(run.lock())
        _require_recorder_directory(run)
        store = CheckpointStore(run.root, keep=_KEEP)
        entries: list[JournalEntry] = []
        end = 0
        if run.events.exists():
            AuditTrail.require_synced_history(run, store)
            scan = JournalScan.read(run.events)
            if scan.torn_bytes:
                scan.cut_torn_tail(run.events)  # a write no call returned from
            entries, end = scan.entries, scan.end
        if not entries and resume_checkpoint is not None:
            raise InvalidArgumentError(
                f"{run.root} holds no recorder journal, so no checkpoint "
                f"{resume_checkpoint!r} to resume: open it with resume_checkpoint=None "
                "(a fresh trainer), or pass the run directory the checkpoint's run wrote"
            )
        position = 0
        if entries:
            _require_group_size(run, entries, group_size)
            position = _checkpoint_position(run, entries, resume_checkpoint)
        else:
            atomic_write_bytes(
                run.job_file,
                (
                    "# A rollout-recovery recorder's run (Recorder.open): events.jsonl is its "
                    f"journal.\n[{_JOB_FILE_TABLE}]\ngroup_size = {group_size}\n"
                ).encode(),
            )
        store.remove_stale()
        store_file = SqliteDataPlane(run.data_plane_file)
        stack.callback(store_file.close)
        rows = DeferredClears(store_file)
        trail = AuditTrail(run)
        stack.callback(trail.close)
        if not entries:
            state = RecordedRun.fresh(rows.as_data_plane(), group_size=group_size)
            index = KeyIndex()
            batch: list[records.HistoryRecord] = []
            resumed_from = None
        else:
            state, restore = RecordedRun.restore(
                journal=run.events,
                entries=entries,
                store=store,
                rows=rows.as_data_plane(),
                group_size=group_size,
                position=position,
                checkpoint=resume_checkpoint or "",
            )
            index = KeyIndex.from_journal(entries, end)
            _put_owned_rows(state, rows, index, run.events)
            for record in restore.records:
                state.apply(record)
            batch = [*restore.records, *_continue_interrupted(state, rows, restore.interrupted)]
            resumed_from = resume_checkpoint or ""
        started = records.RunStarted(
            pid=os.getpid(),
            resumed_from=resumed_from,
            step=state.state.step,
            steps=_OPEN_ENDED_STEPS,
            prompts_per_step=0,
            group_size=group_size,
        )
        state.apply(started)
        batch.append(started)
        trail.append_all(batch)
        trail.sync()
        for record in batch:
            if isinstance(record, records.AttemptResumed):
                index.fold(record, 0, 0)  # (no offsets: it is no seal)
        state.follow_journal(run.events, trail.position)
        recorder = cls(
            run=run,
            release=stack.pop_all().close,
            trail=trail,
            rows=rows,
            store=store,
            state=state,
            index=index,
            staged=_staged_calls(state, rows),
            group_size=group_size,
        )
    if entries:
        # The restored state as a checkpoint of the caller's: a snapshot of a timeline it
        # abandoned (newer than its checkpoint) is replaced, and the next resume from the
        # same checkpoint starts here.
        with recorder._lock:
            recorder._checkpoint(resume_checkpoint)
    return recorder


#: ``run_started.steps`` of a recorder's run: a foreign loop never says how long it runs,
#: so its history always reads as a run still going (the auditor allows prompts in flight
#: and seals not yet trained).
_OPEN_ENDED_STEPS = 2**62


def _require_recorder_directory(run: RunDirectory) -> None:
    if not run.job_file.exists():
        if run.events.exists():
            raise NotARunDirectoryError(
                f"{run.root} holds {run.events.name} but no {run.job_file.name}: not a "
                "recorder's run directory"
            )
        return
    try:
        table = tomllib.loads(run.job_file.read_text(encoding="utf-8")).get(_JOB_FILE_TABLE)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise NotARunDirectoryError(f"{run.job_file} cannot be read: {error}") from None
    if not isinstance(table, dict):
        raise NotARunDirectoryError(
            f"{run.root} is a rollout-recovery job's run directory ({run.job_file.name} has "
            f"no [{_JOB_FILE_TABLE}] table), not a recorder's: give the recorder its own"
        )


def _require_group_size(run: RunDirectory, entries: list[JournalEntry], group_size: int) -> None:
    recorded = None
    for entry in entries:
        if isinstance(entry.record, records.RunStarted):
            recorded = entry.record.group_size
    if recorded is not None and recorded != group_size:
        raise InvalidArgumentError(
            f"{run.root} was recorded with group_size={recorded}, not {group_size}: a "
            "prompt's group size never changes within a run"
        )


def _checkpoint_position(run: RunDirectory, entries: list[JournalEntry], tag: str | None) -> int:
    """Where the caller's trainer checkpoint ``tag`` stands in the journal (its newest
    ``checkpoint_committed``); 0 (everything trained rolled back) for a fresh trainer."""
    if tag is None:
        return 0
    found = None
    known: list[str] = []
    for entry in entries:
        record = entry.record
        if isinstance(record, records.CheckpointCommitted) and record.trainer_checkpoint:
            if record.trainer_checkpoint == tag:
                found = record.position
            known.append(record.trainer_checkpoint)
    if found is None:
        listed = ", ".join(repr(t) for t in dict.fromkeys(reversed(known))) or "none"
        raise InvalidArgumentError(
            f"{run.root} has no checkpoint {tag!r} (mark_checkpoint never recorded it; "
            f"newest first: {listed}): resume the trainer from one of those, or from none"
        )
    return found


def _put_owned_rows(
    state: RecordedRun, rows: DeferredClears, index: KeyIndex, journal: Path
) -> None:
    """Put back the rows the restored state owns that a checkpoint since collected: the
    canonical rows of groups it made trainable again, and the output rows of sealed
    siblings of groups it put back in the ledger. The journal holds every value."""
    present = set(rows.keys(ReplayIndex.canonical_partition))
    canonical = {}
    for group_id in state.replay.group_ids():
        entry = index.by_group[group_id]
        for sibling, key in enumerate(state.replay.group(group_id).row_keys):
            if key not in present:
                sealed = read_seal(journal, entry.seals[sibling], group_id=group_id)
                canonical[key] = canonical_row(
                    group_id=group_id, sibling=sibling, rollout_id=sealed.rollout_id
                )
    if canonical:
        rows.put(ReplayIndex.canonical_partition, canonical)
    staging = CaptureWriter.staging_partition
    missing = state.ledger.expected_staging_keys() - set(rows.keys(staging))
    outputs = {}
    for group in state.ledger.groups():
        entry = index.by_group[group.group_id]
        for sibling in range(group.expected_generations):
            key = output_key(group.gate_rollout_id(sibling))
            if key in missing:
                sealed = read_seal(journal, entry.seals[sibling], group_id=group.group_id)
                outputs[key] = output_row(sealed.output())
    if outputs:
        rows.put(staging, outputs)


def _continue_interrupted(
    state: RecordedRun, rows: DeferredClears, interrupted: list[tuple[str, int, str]]
) -> list[records.HistoryRecord]:
    """A fresh attempt for each sibling the restart abandoned, handed its staged calls."""
    staging = CaptureWriter.staging_partition
    keys = rows.keys(staging)
    by_group: dict[str, list[tuple[int, str]]] = {}
    for group_id, index, rollout_id in interrupted:
        by_group.setdefault(group_id, []).append((index, rollout_id))
    batch: list[records.HistoryRecord] = []
    for group_id, lost in by_group.items():
        start_version = state.ledger.get_group(group_id).start_weight_version
        fresh = {index: RecordedRun.new_rollout_id(group_id, index) for index, _ in lost}
        round_started = records.RoundStarted(
            group_id=group_id,
            round=state.state.rounds_used.get(group_id, 0) + 1,
            dispatched=[records.FreshAttempt(index, fresh[index]) for index, _ in lost],
            weight_version=state.state.weight_version,
        )
        state.apply(round_started)
        batch.append(round_started)
        for index, old in lost:
            old_keys = [key for key in keys if key.startswith(f"{old}/")]
            if not old_keys:
                continue
            calls = [row_call(row) for row in rows.get(staging, old_keys)]
            # Durable under the new attempt's keys before the journal names it.
            rows.put(
                staging,
                {
                    call_key(fresh[index], number): row
                    for number, row in enumerate(rows.get(staging, old_keys))
                },
            )
            resumed = records.AttemptResumed(
                group_id=group_id,
                generation_index=index,
                rollout_id=fresh[index],
                from_rollout_id=old,
                calls=old_keys,
                tokens=sum(len(call.output_token_ids) for call in calls),
                # In the run's numbering (the recorder's steps): the weights the group was
                # admitted under. The caller's own version tags stay in each call.
                weight_versions=[start_version] * len(calls),
            )
            state.apply(resumed)
            batch.append(resumed)
    return batch


def _staged_calls(
    state: RecordedRun, rows: DeferredClears
) -> dict[tuple[str, int], list[tuple[str, StagedCall]]]:
    """The staged calls of every attempt in flight, by (group id, sibling)."""
    staging = CaptureWriter.staging_partition
    keys = rows.keys(staging)
    found: dict[tuple[str, int], list[tuple[str, StagedCall]]] = {}
    for group in state.ledger.groups():
        if group.status is not PromptGroupStatus.GENERATING:
            continue
        for sibling in group.siblings:
            if sibling.current_attempt.status is not RolloutAttemptStatus.DISPATCHED:
                continue
            index = sibling.generation_index
            prefix = f"{group.gate_rollout_id(index)}/"
            own = [key for key in keys if key.startswith(prefix)]
            if own:
                found[(group.group_id, index)] = list(
                    zip(own, [row_call(row) for row in rows.get(staging, own)], strict=True)
                )
    return found
