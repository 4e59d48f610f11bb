"""Helpers of test_auditor.py: build a small real run, read its history, break it by hand.

History edits keep every byte offset meaningful (checkpoints record journal positions):
a record is *replaced* in place by another framed to the same length (padded with spaces
inside the JSON object, with its checksum recomputed), never inserted or deleted.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rollout_recovery.checkpoint._sidecar_io import SIDECAR_FILENAMES, decode_sidecar
from rollout_recovery.control import Controller, RunConfig
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.history import JournalEntry
from rollout_recovery.history._auditor import _decode
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.history.records import (
    AttemptsAbandoned,
    GroupSealed,
    HistoryRecord,
    SiblingSealed,
    StepTrained,
    TrainedRow,
    encode_record,
)
from rollout_recovery.ledger import (
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    parse_rollout_recovery_state,
)
from rollout_recovery.rundir import CheckpointStore

STEPS, PROMPTS, N = 6, 3, 3

#: Low fault rates: a drop needs 8 failed rounds in a row, so the counts are exact.
LOW_FAULTS: dict[str, Any] = {
    "attempt_failure_rate": 0.02,
    "straggler_rate": 0.05,
    "straggler_factor": 4.0,
    "hang_rate": 0.005,
    "capture_failure_rate": 0.01,
    "tamper_rate": 0.01,
    "worker_crash_rate": 0.002,
    "worker_restart_s": 0.05,
}


def small_config(*, keep: int, steps: int = STEPS) -> RunConfig:
    return config_from_builtins(
        {
            "job": {
                "steps": steps,
                "prompts_per_step": PROMPTS,
                "generations_per_prompt": N,
                "seed": 0,
            },
            # The default 2 s deadline: beside a CPU hog a 0.5 s one abandoned healthy
            # attempts round after round until step 0 lacked groups (StepShortfallError).
            "generation": {"call_latency_s": 0.002, "attempt_deadline_s": 2.0, "workers": 4},
            "retry": {"max_rounds": 8, "backoff_s": 0.001},
            "faults": dict(LOW_FAULTS),
            "checkpoint": {"every_steps": 2, "keep": keep},
            "liveness": {"step_timeout_s": 60.0},
        }
    )


# -- forcing interleavings --------------------------------------------------------------


@contextmanager
def checkpoints_wait_for_sealed_work(steps: set[int], timeout: float = 10.0) -> Iterator[None]:
    """Checkpoints at ``steps`` take their cut only once a held group (below) has a sealed
    sibling and the replay index a group ready for the next step (so the cut owns staged
    and canonical rows alike).

    Left to timing, a loaded machine can publish every group generated ahead before a
    slow trainer reaches the checkpoint, and then no sealed sibling ever comes. So this
    makes it certain: until checkpoint S (the next of ``steps``) has its cut, groups for
    steps after S are held back from publishing (their sealed siblings stay in the
    ledger); the groups of steps up to S publish unhindered. The checkpoint waits
    (polling on the event loop) for both kinds of rows, then releases the held groups
    just before it asks for its cut; the barrier makes them wait behind the cut.
    """
    real_take = Controller.checkpoint
    real_start = Controller.checkpoint_in_background
    real_publish = Controller._publish
    pending = sorted(steps)
    released: list[asyncio.Event] = []

    def release() -> asyncio.Event:
        if not released:
            released.append(asyncio.Event())
        return released[0]

    async def publish(controller: Any, group_id: str) -> None:
        target = controller.ledger.get_group(group_id).target_step
        while pending and target > pending[0]:
            await release().wait()
        await real_publish(controller, group_id)

    def held_sealed_work(controller: Any) -> bool:
        # Only a held group's sealed sibling is certain to still be staged at the cut: a
        # group of the next step may be inside its publish right now, and that publish
        # ends (clearing its staged rows) before the cut is taken.
        return any(
            group.target_step is not None
            and group.target_step > controller.step
            and any(
                sibling.current_attempt.status is RolloutAttemptStatus.SEALED
                and sibling.current_attempt.staging_keys
                for sibling in group.siblings
            )
            for group in controller.ledger.groups()
        )

    async def before_the_cut(controller: Any) -> None:
        if pending and controller.step == pending[0]:
            deadline = time.monotonic() + timeout
            while not (
                held_sealed_work(controller) and controller.replay.ready_groups(controller.step)
            ):
                if time.monotonic() > deadline:
                    step = controller.step
                    raise AssertionError(f"no sealed sibling or no ready group at step {step}")
                await asyncio.sleep(0)
            pending.pop(0)
            release().set()  # the held publishers wake behind this checkpoint's cut
            released.clear()

    async def take(controller: Any, *, delete_deferred: bool = True) -> Any:
        await before_the_cut(controller)
        return await real_take(controller, delete_deferred=delete_deferred)

    async def start(controller: Any) -> None:  # [checkpoint] background
        # The previous write first: the real start awaits it before its cut, and the
        # publishers released here would empty the staging meanwhile (a CI run's cut at
        # step 4 then owned no staged row).
        await controller.settle_checkpoint()
        await before_the_cut(controller)
        await real_start(controller)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Controller, "checkpoint", take)
        patch.setattr(Controller, "checkpoint_in_background", start)
        patch.setattr(Controller, "_publish", publish)
        yield


def ledger_of_files(files: dict[str, Any]) -> RolloutRecoveryLedger:
    """The ledger a checkpoint's files (as passed to ``CheckpointStore.save``) hold."""
    (name,) = [name for name in SIDECAR_FILENAMES if name in files]
    _, sidecar = decode_sidecar(bytes(files[name]))
    return RolloutRecoveryLedger.from_state_dict(parse_rollout_recovery_state(sidecar).ledger_state)


@dataclass
class SaveHeldUntilClear:
    """Holds the save of checkpoint ``step`` until the controller has asked, after that
    checkpoint's capture, to clear a staged row the checkpoint's ledger expects. Records
    what happened. (Captures are numbered from 1: the bootstrap checkpoint is 1.)"""

    step: int
    capture: int
    timeout: float = 10.0
    expected: set[str] = field(default_factory=set)
    cleared_while_writing: set[str] = field(default_factory=set)
    _writing: threading.Event = field(default_factory=threading.Event)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def wrap_captured(self, real: Callable[..., int]) -> Callable[..., int]:
        def captured(plane: Any) -> int:
            number = real(plane)
            if number == self.capture:
                self._writing.set()
            return number

        return captured

    def wrap_save(self, real: Callable[..., Path]) -> Callable[..., Path]:
        def save(store: CheckpointStore, step: int, files: dict[str, Any], **more: Any) -> Path:
            if step == self.step:
                self.expected = ledger_of_files(files).expected_staging_keys()
                with self._changed:
                    self._changed.wait_for(
                        lambda: self.cleared_while_writing & self.expected, self.timeout
                    )
                self.cleared_while_writing &= self.expected
                self._writing.clear()
            return real(store, step, files, **more)

        return save

    def wrap_clear(self, real: Callable[..., None]) -> Callable[..., None]:
        def clear(plane: Any, partition: str, keys: Any, *, cut: Any = None) -> None:
            keys = list(keys)
            real(plane, partition, keys, cut=cut)
            if self._writing.is_set():
                with self._changed:
                    self.cleared_while_writing.update(keys)
                    self._changed.notify_all()

        return clear


# -- reading and editing a run's history -------------------------------------------------


def reframe(record: HistoryRecord, width: int) -> bytes:
    """``record`` as a journal line of exactly ``width`` bytes (newline excluded), padded
    with spaces inside the JSON object, so every later offset stays where it was."""
    body = encode_record(record)
    for pad in range(width):
        padded = body[:-1] + b" " * pad + b"}"
        line = b'{"crc":"%08x",' % zlib.crc32(padded) + padded[1:]
        if len(line) == width:
            return line
        if len(line) > width:
            break
    raise AssertionError(f"{type(record).__name__} does not fit in {width} bytes")


@dataclass
class History:
    """A run's journal, indexed: entries, surviving steps, seals."""

    path: Path
    entries: list[JournalEntry]

    @classmethod
    def read(cls, run: Path) -> History:
        path = run / "events.jsonl"
        return cls(path, read_entries(path))

    def of(self, kind: type[Any]) -> list[JournalEntry]:
        return [entry for entry in self.entries if isinstance(entry.record, kind)]

    def steps(self) -> list[JournalEntry]:
        return self.of(StepTrained)

    def group_rows(self) -> dict[str, tuple[JournalEntry, list[TrainedRow]]]:
        found: dict[str, tuple[JournalEntry, list[TrainedRow]]] = {}
        for entry in self.steps():
            assert isinstance(entry.record, StepTrained)
            for row in entry.record.rows:
                found.setdefault(row.group_id, (entry, []))[1].append(row)
        return found

    def line_of(self, kind: type[Any], group_id: str) -> int:
        (line,) = [e.line for e in self.of(kind) if getattr(e.record, "group_id", None) == group_id]
        return line

    def seal_line(self, group_id: str, rollout_id: str) -> int:
        for entry in self.entries:
            record = entry.record
            seals = (
                [record.seal]
                if isinstance(record, SiblingSealed)
                else list(record.seals)
                if isinstance(record, GroupSealed)
                else []
            )
            if record_group(record) == group_id and any(s.rollout_id == rollout_id for s in seals):
                return entry.line
        raise AssertionError(f"no seal of {rollout_id}")

    def clean_group(self) -> str:
        """A trained group whose every row is its sealed rollout, none abandoned."""
        excused = {
            attempt.rollout_id
            for entry in self.of(AttemptsAbandoned)
            for attempt in entry.record.attempts  # type: ignore[attr-defined]
        }
        for group_id, (_, rows) in sorted(self.group_rows().items()):
            if len(rows) == N and all(r.rollout_id not in excused for r in rows):
                return group_id
        raise AssertionError("the run trained no clean group")

    def replace(self, entry: JournalEntry, record: HistoryRecord) -> None:
        """Replace one record in place, keeping its line's length."""
        data = bytearray(self.path.read_bytes())
        end = data.index(b"\n", entry.offset)
        data[entry.offset : end] = reframe(record, end - entry.offset)
        self.path.write_bytes(bytes(data))


def record_group(record: HistoryRecord) -> str | None:
    return getattr(record, "group_id", None)


def with_row(step: StepTrained, old: TrainedRow, new: TrainedRow) -> StepTrained:
    rows = [new if row == old else row for row in step.rows]
    return msgspec.structs.replace(step, rows=rows)


# -- checkpoints ------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointView:
    name: str
    step: int
    expected_staging: frozenset[str]
    replay_rows: dict[str, list[str]]


def checkpoints(run: Path, keep: int) -> list[CheckpointView]:
    """Every committed checkpoint, newest first, decoded as the auditor decodes it."""
    store = CheckpointStore(run, keep=keep)
    views = []
    for committed in store.committed():
        decoded = _decode(store.load(committed))
        views.append(
            CheckpointView(
                decoded.name,
                decoded.step,
                frozenset(decoded.ledger.expected_staging_keys()),
                decoded.replay_groups,
            )
        )
    return views


# -- asserting on violations ------------------------------------------------------------

_CITATION = re.compile(r"([a-z_]+\.jsonl):(\[[0-9, ]*\]|[0-9]+)")


def cited_lines(violation: str, file_name: str) -> set[int]:
    """Every line of ``file_name`` the violation cites (``file:7`` or ``file:[7, 8]``)."""
    found: set[int] = set()
    for name, where in _CITATION.findall(violation):
        if name == file_name:
            found.update(int(n) for n in re.findall(r"[0-9]+", where))
    return found


def the_violation(
    violations: list[str],
    *fragments: str,
    cites: dict[str, set[int]] | None = None,
) -> str:
    """The one violation holding every fragment (and citing those lines); fails otherwise."""
    matching = [v for v in violations if all(fragment in v for fragment in fragments)]
    assert matching, f"no violation with {fragments}; violations: {violations}"
    for violation in matching:
        if all(lines <= cited_lines(violation, name) for name, lines in (cites or {}).items()):
            return violation
    raise AssertionError(f"{matching} do not cite {cites}")
