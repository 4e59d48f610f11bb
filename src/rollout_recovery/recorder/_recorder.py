"""The recorder: the controller's journal, driven from a loop the controller does not run.

A foreign trainer (TRL's ``GRPOTrainer``, verl's agent loops) owns its loop; it calls the
recorder from inside it: take a prompt under its own dataset identity, stage each model
call, seal each sibling, mark rows trained and checkpoints saved. Each call builds the
controller's own history records (``prompt_taken``, ``round_started``, ``sibling_sealed``,
``group_published``, ``step_trained``, ``checkpoint_committed``, ``restored``), applies
them through the one transition of each (``control.RecordedRun``) and only then appends
them, so ``rollout-recovery audit``, ``journal`` and ``inspect`` read its run directory as
any run's. The rules are the controller's:

- a refused call changes nothing and writes nothing (everything is checked before the
  first record is applied);
- a seal returns only once an ``fdatasync`` covered its line (group commit: a thread that
  finds its line already covered does not sync again);
- a staged call is a durable data-plane row before :meth:`Recorder.stage_call` returns;
- one lock serializes every call (the recorder's cut); the seal's sync runs outside it.

How a foreign loop maps onto the records: each key is one prompt group (``prompt_taken``,
then ``batch_admitted`` and a first ``round_started`` for all its siblings, in one write);
a group is published when it is first marked trained, and every ``mark_trained`` is one
``step_trained``, numbered by the recorder (contiguous from 0, as the auditor expects; the
caller's own step is only checked). A checkpoint is a snapshot of the journal, named by the
caller's tag in ``checkpoint_committed.trainer_checkpoint``. Opening an existing run is a
restore to the tag the caller's trainer resumed from (see :mod:`._opening`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._checks import refuse_bare_string
from .._lifecycle import Resource
from ..capture import CaptureWriter
from ..control import RecordedRun
from ..dataplane import Row
from ..errors import (
    ClosedResourceError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidOperationError,
    InvalidTransitionError,
    UnknownGroupError,
)
from ..history import AuditTrail, records
from ..ledger import PromptGroupStatus, RolloutAttemptStatus
from ..rundir import CheckpointStore, RunDirectory
from ._keys import KeyEntry, KeyIndex, read_seal, read_seal_version
from ._opening import open_recorder
from ._rows import (
    DeferredClears,
    call_key,
    call_row,
    canonical_key,
    canonical_row,
    output_key,
    output_row,
)
from ._values import (
    SealedSibling,
    SiblingOutput,
    StagedCall,
    TakenPrompt,
    canonical_digest,
    check_output,
    check_staged_call,
    output_to_plain,
)

__all__ = ["Recorder"]


class Recorder(Resource):
    """One run directory's journal, driven by a foreign loop. Build with :meth:`open`."""

    def __init__(
        self,
        *,
        run: RunDirectory,
        release: Any,
        trail: AuditTrail,
        rows: DeferredClears,
        store: CheckpointStore,
        state: RecordedRun,
        index: KeyIndex,
        staged: dict[tuple[str, int], list[tuple[str, StagedCall]]],
        group_size: int,
    ) -> None:
        self._run = run
        self._release = release
        self._trail = trail
        self._rows = rows
        self._store = store
        self._state = state
        self._index = index
        self._staged = staged
        self.group_size = group_size
        self._lock = threading.Lock()
        self._closed = False

    # -- opening and closing (the work is in _opening) ----------------------------------

    @classmethod
    def open(
        cls,
        run_dir: str | os.PathLike[str],
        *,
        group_size: int,
        resume_checkpoint: str | None = None,
    ) -> Recorder:
        """Create ``run_dir`` or restore it, holding its lock until :meth:`close`.

        ``resume_checkpoint``: the tag (see :meth:`mark_checkpoint`) of the trainer
        checkpoint the caller restored; None for a fresh trainer. Rows marked trained
        after it are trainable again; every sealed output stays.
        """
        return open_recorder(
            cls, Path(run_dir), group_size=group_size, resume_checkpoint=resume_checkpoint
        )

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._release()  # the journal, the data plane, then the run's lock

    @property
    def run_dir(self) -> Path:
        return self._run.root

    def _require_open(self) -> None:
        if self._closed:
            raise ClosedResourceError(f"the recorder of {self._run.root} is closed")

    # -- take ---------------------------------------------------------------------------

    def take(self, key: str, prompt: object, *, aliases: Sequence[str] = ()) -> TakenPrompt:
        """The group of the caller's dataset identity ``key``, reserved on first take.

        Taking a key again returns the same group (its sealed siblings and the staged calls
        of the others) and records ``aliases`` it did not have. ``prompt`` must be JSON and
        the same as the first time (its canonical sha256 is compared).
        """
        if not isinstance(key, str) or not key:
            raise InvalidArgumentTypeError(f"key must be a non-empty str, got {key!r}")
        refuse_bare_string(aliases, what="aliases", operation="take")
        names = list(aliases)
        if not all(isinstance(alias, str) and alias for alias in names):
            raise InvalidArgumentTypeError(
                f"aliases of key {key!r} must be non-empty strs, got {names!r}"
            )
        digest = canonical_digest(prompt, what=f"the prompt of key {key!r}")
        with self._lock:
            self._require_open()
            entry = self._index.by_key.get(key)
            if entry is None:
                entry = self._reserve(key, digest, list(dict.fromkeys(names)))
            else:
                if entry.digest != digest:
                    raise InvalidArgumentError(
                        f"key {key!r} (group {entry.group_id!r}) was taken with prompt digest "
                        f"{entry.digest}, now {digest}: one key is one prompt; key by the "
                        "dataset row (and epoch), never by position"
                    )
                new = [name for name in dict.fromkeys(names) if name not in entry.aliases]
                if new:
                    self._append(
                        [records.PromptAliased(group_id=entry.group_id, key=key, aliases=new)]
                    )
                    entry.aliases.extend(new)
            return self._taken(entry)

    def _reserve(self, key: str, digest: str, aliases: list[str]) -> KeyEntry:
        state = self._state.state
        position = state.prompts_taken
        group_id = f"g{position:08d}"
        attempts = [RecordedRun.new_rollout_id(group_id, index) for index in range(self.group_size)]
        version = state.weight_version
        self._append(
            [
                records.PromptTaken(
                    group_id=group_id,
                    prompt_idx=position,
                    position=position,
                    batch=position,
                    weight_version=version,
                    attempts=attempts,
                    key=key,
                    prompt_digest=digest,
                    aliases=aliases,
                ),
                records.BatchAdmitted(
                    batch=position,
                    group_ids=[group_id],
                    target_step=state.step,
                    weight_version=version,
                ),
                records.RoundStarted(
                    group_id=group_id,
                    round=1,
                    dispatched=[
                        records.FreshAttempt(index, rollout_id)
                        for index, rollout_id in enumerate(attempts)
                    ],
                    weight_version=version,
                ),
            ]
        )
        entry = KeyEntry(
            key=key, group_id=group_id, prompt_idx=position, digest=digest, aliases=aliases
        )
        self._index.add(entry)
        return entry

    def _taken(self, entry: KeyEntry) -> TakenPrompt:
        sealed = {
            index: read_seal(self._run.events, where, group_id=entry.group_id)
            for index, where in sorted(entry.seals.items())
        }
        staged = {
            index: [call for _, call in self._staged.get((entry.group_id, index), [])]
            for index in range(self.group_size)
            if index not in sealed and self._staged.get((entry.group_id, index))
        }
        return TakenPrompt(
            group_id=entry.group_id,
            key=entry.key,
            sealed=sealed,
            staged=staged,
            aliases=tuple(entry.aliases),
            group_size=self.group_size,
            trained=self._trained(entry.group_id),
        )

    def _trained(self, group_id: str) -> bool:
        """Marked trained, and not made trainable again by a restore."""
        replay = self._state.replay
        if group_id in self._state.ledger:
            return False
        return group_id not in replay or replay.group(group_id).claimed_step is not None

    # -- stage and seal -----------------------------------------------------------------

    def _entry(self, group_id: object, sibling: object) -> KeyEntry:
        if not isinstance(group_id, str):
            raise InvalidArgumentTypeError(f"group_id must be a str, got {group_id!r}")
        entry = self._index.by_group.get(group_id)
        if entry is None:
            raise UnknownGroupError(
                f"no group {group_id!r} in {self._run.root.name}: use the group_id take() returned",
                group_id=group_id,
            )
        if type(sibling) is not int or not 0 <= sibling < self.group_size:
            raise InvalidArgumentError(
                f"group {group_id!r} (key {entry.key!r}) has siblings 0..{self.group_size - 1}, "
                f"not {sibling!r}"
            )
        return entry

    def _current_attempt(self, entry: KeyEntry, sibling: int) -> str:
        """The rollout id of ``sibling``'s attempt in flight; refuses a sealed sibling."""
        where = f"sibling {sibling} of group {entry.group_id!r} (key {entry.key!r})"
        if sibling in entry.seals:
            raise InvalidTransitionError(f"{where} is sealed", group_id=entry.group_id)
        ledger = self._state.ledger
        group = ledger.get_group(entry.group_id) if entry.group_id in ledger else None
        if (
            group is None
            or group.siblings[sibling].current_attempt.status is not RolloutAttemptStatus.DISPATCHED
        ):
            raise InvalidTransitionError(
                f"{where} has no attempt in flight", group_id=entry.group_id
            )
        return group.gate_rollout_id(sibling)

    def stage_call(self, group_id: str, sibling: int, call: StagedCall) -> None:
        """Store one model call of an unsealed sibling (durable when this returns); after a
        crash, :meth:`take` hands the sibling's staged calls back to continue from."""
        with self._lock:
            self._require_open()
            entry = self._entry(group_id, sibling)
            checked = check_staged_call(
                call, where=f"sibling {sibling} of group {group_id!r} (key {entry.key!r})"
            )
            rollout_id = self._current_attempt(entry, sibling)
            calls = self._staged.setdefault((group_id, sibling), [])
            key = call_key(rollout_id, len(calls))
            self._rows.put(CaptureWriter.staging_partition, {key: call_row(checked)})
            calls.append((key, checked))

    def seal(self, group_id: str, sibling: int, output: SiblingOutput) -> SealedSibling:
        """Seal ``sibling`` with ``output``: durable (an ``fdatasync`` covered it) before it
        returns. Sealing it again with the same output returns the stored seal."""
        with self._lock:
            self._require_open()
            entry = self._entry(group_id, sibling)
            where = f"sibling {sibling} of group {group_id!r} (key {entry.key!r})"
            checked = check_output(output, where=where)
            plain = output_to_plain(checked)
            digest = canonical_digest(plain, what=where)
            if sibling in entry.seals:
                stored = read_seal(self._run.events, entry.seals[sibling], group_id=group_id)
                stored_digest = canonical_digest(output_to_plain(stored.output()), what=where)
                if stored_digest != digest:
                    raise InvalidTransitionError(
                        f"{where} is sealed as {stored.rollout_id} with output digest "
                        f"{stored_digest}, not {digest}: a sealed sibling never changes",
                        group_id=group_id,
                    )
                end = entry.seals[sibling][1]
                sealed = stored
            else:
                rollout_id = self._current_attempt(entry, sibling)
                calls = self._staged.get((group_id, sibling), [])
                inherited_calls, inherited_tokens = self._index.inherited.get(rollout_id, (0, 0))
                # The run's own weight version (the recorder's steps), in force now; the
                # caller's tags stay in the output and each staged call.
                version = self._state.state.weight_version
                key = output_key(rollout_id)
                # Durable before the journal names it (the ledger owns it once sealed).
                self._rows.put(CaptureWriter.staging_partition, {key: output_row(checked)})
                seal = records.Seal(
                    generation_index=sibling,
                    rollout_id=rollout_id,
                    # The output is the receipt's: the journal keeps what the caller
                    # trains on (and the output row, the manifest's one entry). Its staged
                    # calls were only the way to it: the manifest owns none of them (they
                    # go with the next checkpoint's collection); "calls" names them.
                    receipt={
                        "rollout_id": rollout_id,
                        "manifest": [{"staging_key": key, "weight_version": version}],
                        "calls": [staged for staged, _ in calls],
                        "output": plain,
                    },
                    reward=0.0 if checked.reward is None else checked.reward,
                    mask_sample=False,
                    tokens=len(checked.completion_token_ids),
                    weight_versions=[version],
                    inherited_calls=min(inherited_calls, len(calls)),
                    inherited_tokens=inherited_tokens if inherited_calls else 0,
                )
                start = self._trail.position
                end = self._append([records.SiblingSealed(group_id=group_id, seal=seal)])
                entry.seals[sibling] = (start, end)
                self._staged.pop((group_id, sibling), None)
                sealed = SealedSibling(
                    sibling=sibling,
                    rollout_id=rollout_id,
                    prompt_token_ids=checked.prompt_token_ids,
                    completion_token_ids=checked.completion_token_ids,
                    logprobs=checked.logprobs,
                    reward=checked.reward,
                    weight_version=checked.weight_version,
                    extra=checked.extra,
                )
            journal = self._trail.journal
        # Outside the lock, so other calls go on while the disk works (group commit).
        if journal.durable_position < end:
            journal.sync()
        return sealed

    # -- training and checkpoints ---------------------------------------------------------

    def mark_trained(self, group_ids: Sequence[str], *, step: int) -> None:
        """The caller's trainer trained every sibling of ``group_ids`` (its step ``step``).

        One ``step_trained`` record, numbered by the recorder; a group is published the
        first time it is marked. A group marked trained is refused again until a restore
        to an earlier checkpoint makes it trainable again.
        """
        refuse_bare_string(group_ids, what="group_ids", operation="mark_trained")
        ids = list(group_ids)
        if type(step) is not int or step < 0:
            raise InvalidArgumentTypeError(f"step must be an int >= 0, got {step!r}")
        if not ids:
            raise InvalidArgumentError(f"mark_trained(step={step}) names no group")
        if len(set(ids)) != len(ids):
            raise InvalidArgumentError(f"mark_trained(step={step}) names a group twice: {ids}")
        with self._lock:
            self._require_open()
            ledger = self._state.ledger
            entries = [self._entry(group_id, 0) for group_id in ids]
            to_publish: list[KeyEntry] = []
            for entry in entries:
                group_id = entry.group_id
                if group_id in ledger:
                    missing = [i for i in range(self.group_size) if i not in entry.seals]
                    if missing or ledger.get_group(group_id).status is not (
                        PromptGroupStatus.READY_TO_FINALIZE
                    ):
                        raise InvalidTransitionError(
                            f"group {group_id!r} (key {entry.key!r}) cannot be trained at "
                            f"step {step}: siblings {missing} are not sealed",
                            group_id=group_id,
                        )
                    to_publish.append(entry)
                elif self._trained(group_id):
                    raise InvalidTransitionError(
                        f"group {group_id!r} (key {entry.key!r}) is trained already; it "
                        "trains again only after a restore to a checkpoint before it "
                        "(Recorder.open(..., resume_checkpoint=tag))",
                        group_id=group_id,
                    )
            seals = {
                entry.group_id: [
                    read_seal(self._run.events, entry.seals[i], group_id=entry.group_id)
                    for i in range(self.group_size)
                ]
                for entry in entries
            }
            state = self._state.state
            published: list[tuple[records.HistoryRecord, dict[str, Row]]] = []
            versions = {entry.group_id: self._seal_versions(entry) for entry in entries}
            for entry in to_publish:
                outputs = seals[entry.group_id]
                keys = [canonical_key(entry.group_id, s.sibling) for s in outputs]
                published.append(
                    (
                        records.GroupPublished(
                            group_id=entry.group_id,
                            target_step=_target_step(ledger.get_group(entry.group_id)),
                            row_keys=keys,
                            valid_rows=self.group_size,
                            min_weight_version=min(versions[entry.group_id]),
                            max_weight_version=max(versions[entry.group_id]),
                        ),
                        {
                            key: canonical_row(
                                group_id=entry.group_id, sibling=s.sibling, rollout_id=s.rollout_id
                            )
                            for key, s in zip(keys, outputs, strict=True)
                        },
                    )
                )
            rows = [
                records.TrainedRow(
                    group_id=entry.group_id,
                    generation_index=s.sibling,
                    prompt_idx=entry.prompt_idx,
                    rollout_id=s.rollout_id,
                    valid=True,
                    reward=0.0 if s.reward is None else s.reward,
                    weight_version=min(versions[entry.group_id]),
                    weight_version_spans=[
                        (
                            versions[entry.group_id][s.sibling],
                            len(s.prompt_token_ids),
                            len(s.prompt_token_ids) + len(s.completion_token_ids),
                        )
                    ]
                    if s.completion_token_ids
                    else [],
                )
                for entry in entries
                for s in seals[entry.group_id]
            ]
            trained = records.StepTrained(
                step=state.step,
                weight_version=state.highest_weight_version + 1,
                group_ids=ids,
                rows=rows,
                valid_rows=len(rows),
                mean_reward=sum(row.reward for row in rows) / len(rows),
            )
            for record, canonical in published:
                self._state.apply(record, canonical_rows=canonical)
            self._state.apply(trained)
            self._trail.append_all([record for record, _ in published] + [trained])
            self._trail.journal.sync()

    def _seal_versions(self, entry: KeyEntry) -> list[int]:
        """The run's weight version each sibling of ``entry`` was sealed at."""
        return [
            read_seal_version(self._run.events, entry.seals[i], group_id=entry.group_id)
            for i in range(self.group_size)
        ]

    def mark_checkpoint(self, tag: str, *, step: int) -> None:
        """The caller's trainer saved its checkpoint ``tag`` (at its step ``step``): the
        journal is snapshotted here, and ``open(..., resume_checkpoint=tag)`` restores to
        this point (trained rows after it become trainable again)."""
        if not isinstance(tag, str) or not tag:
            raise InvalidArgumentTypeError(f"checkpoint tag must be a non-empty str, got {tag!r}")
        if type(step) is not int or step < 0:
            raise InvalidArgumentTypeError(f"step must be an int >= 0, got {step!r}")
        with self._lock:
            self._require_open()
            self._checkpoint(tag)

    def _checkpoint(self, tag: str | None) -> None:
        trail = self._trail
        position = trail.position
        marks = trail.marks()
        trail.sync()  # the snapshot's history is durable before it is published
        snapshot = self._state.snapshot(position)
        saved = self._store.save(snapshot.step, RecordedRun.snapshot_files(snapshot), marks=marks)
        # Rows nothing at this position owns go now: the checkpoint just saved is the one
        # kept, and it owns exactly what the state owns.
        self._rows.collect(
            staged=[
                *(key for calls in self._staged.values() for key, _ in calls),
                *self._state.ledger.expected_staging_keys(),
            ],
            canonical=self._state.replay.row_keys(),
        )
        self._append(
            [
                records.CheckpointCommitted(
                    step=snapshot.step,
                    name=saved.name,
                    position=position,
                    trainer_checkpoint=tag,
                )
            ]
        )
        trail.journal.sync()

    # -- the one way records reach the state and the journal ----------------------------

    def _append(self, batch: Sequence[records.HistoryRecord]) -> int:
        """Apply ``batch`` (one call's records) through their transitions, then append it
        in one write; returns the journal position after it."""
        for record in batch:
            self._state.apply(record)
        return self._trail.append_all(batch)


def _target_step(group: Any) -> int:
    target = group.target_step
    if target is None:
        raise InvalidOperationError(f"group {group.group_id!r} was never admitted")
    return int(target)
