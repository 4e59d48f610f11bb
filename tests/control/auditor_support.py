"""Helpers of test_auditor.py: build a small real run, read its trail, break it by hand.

Trail edits keep every committed byte offset meaningful: the auditor reads only the
prefix of ``trained_rows.jsonl`` / ``events.jsonl`` that the newest checkpoint committed
(its ``audit_offsets``), so a line is *replaced* in place, padded with spaces to its old
length (JSON allows trailing whitespace), rather than inserted; deleting lines only
shortens a file, which the prefix read tolerates.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.checkpoint import SIDECAR_FILENAMES, decode_sidecar
from rollout_recovery.control import RunConfig
from rollout_recovery.control import _job as job_module
from rollout_recovery.control._audit import EVENTS, TRAINED_ROWS
from rollout_recovery.control._auditor import _decode
from rollout_recovery.control._checkpoint_dir import CheckpointStore
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.control._controller import Controller
from rollout_recovery.ledger import RolloutRecoveryLedger, parse_rollout_recovery_state

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
            "generation": {"call_latency_s": 0.002, "attempt_deadline_s": 0.5, "workers": 4},
            "retry": {"max_rounds": 8, "backoff_s": 0.001},
            "faults": dict(LOW_FAULTS),
            "checkpoint": {"every_steps": 2, "keep": keep},
            "liveness": {"step_timeout_s": 60.0},
        }
    )


# -- forcing interleavings --------------------------------------------------------------


@contextmanager
def checkpoints_wait_for_sealed_work(steps: set[int], timeout: float = 10.0) -> Iterator[None]:
    """Checkpoints at ``steps`` take their cut only once the ledger holds a sealed sibling
    and the replay index a group ready for the next step (so the cut owns staged and
    canonical rows alike).

    Left to timing, a loaded machine can publish every group generated ahead before a
    slow trainer reaches the checkpoint, and then no sealed sibling ever comes. So this
    makes it certain: until checkpoint S (the next of ``steps``) has its cut, groups for
    steps after S are held back from publishing (their sealed siblings stay in the
    ledger); the groups of steps up to S publish unhindered. The checkpoint waits
    (polling on the event loop) for both kinds of rows, then releases the held groups
    just before it asks for its cut; the barrier makes them wait behind the cut.
    """
    real_checkpoint = job_module.take_checkpoint
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

    async def take_checkpoint(controller: Any, store: CheckpointStore) -> Any:
        if pending and controller.step == pending[0]:
            deadline = time.monotonic() + timeout
            while not (
                controller.ledger.expected_staging_keys()
                and controller.replay.ready_groups(controller.step)
            ):
                if time.monotonic() > deadline:
                    step = controller.step
                    raise AssertionError(f"no sealed sibling or no ready group at step {step}")
                await asyncio.sleep(0)
            pending.pop(0)
            release().set()  # the held publishers wake behind this checkpoint's cut
            released.clear()
        return await real_checkpoint(controller, store)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(job_module, "take_checkpoint", take_checkpoint)
        patch.setattr(Controller, "_publish", publish)
        yield


def ledger_of_files(files: dict[str, Any]) -> RolloutRecoveryLedger:
    """The ledger a checkpoint's files (as passed to ``CheckpointStore.save``) hold."""
    (name,) = [name for name in SIDECAR_FILENAMES if name in files]
    _, sidecar = decode_sidecar(bytes(files[name]))
    return RolloutRecoveryLedger.from_state_dict(parse_rollout_recovery_state(sidecar).ledger_state)


@dataclass
class SaveHeldUntilClear:
    """Holds the save of checkpoint ``step`` (after its cut) until the controller asks to
    clear a staged row that checkpoint's ledger expects. Records what happened."""

    step: int
    timeout: float = 10.0
    expected: set[str] = field(default_factory=set)
    cleared_while_writing: set[str] = field(default_factory=set)
    _writing: threading.Event = field(default_factory=threading.Event)
    _cleared: threading.Event = field(default_factory=threading.Event)

    def wrap_save(self, real: Callable[..., Path]) -> Callable[..., Path]:
        def save(store: CheckpointStore, step: int, files: dict[str, Any]) -> Path:
            if step == self.step:
                self.expected = ledger_of_files(files).expected_staging_keys()
                self._writing.set()
                self._cleared.wait(self.timeout)
                self._writing.clear()
            return real(store, step, files)

        return save

    def wrap_clear(self, real: Callable[..., None]) -> Callable[..., None]:
        def clear(plane: Any, partition: str, keys: Any, *, cut: Any = None) -> None:
            keys = list(keys)
            real(plane, partition, keys, cut=cut)
            hit = set(keys) & self.expected
            if self._writing.is_set() and hit:
                self.cleared_while_writing |= hit
                self._cleared.set()

        return clear


# -- reading a run ----------------------------------------------------------------------


def jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number from 1, record)`` of every non-blank line."""
    lines = path.read_bytes().splitlines()
    return [(n, json.loads(line)) for n, line in enumerate(lines, start=1) if line.strip()]


@dataclass
class Trail:
    """A run's trail, indexed: trained rows per group, seals per sibling, events."""

    rows: list[tuple[int, dict[str, Any]]]
    events: list[tuple[int, dict[str, Any]]]

    @classmethod
    def read(cls, run: Path) -> Trail:
        return cls(jsonl(run / TRAINED_ROWS), jsonl(run / EVENTS))

    def group_rows(self) -> dict[str, list[tuple[int, dict[str, Any]]]]:
        found: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
        for number, row in self.rows:
            found[row["group_id"]].append((number, row))
        return dict(found)

    def lines_of_group(self, group_id: str) -> list[int]:
        return [number for number, _ in self.group_rows()[group_id]]

    def event_lines(self, kind: str, group_id: str | None = None) -> list[int]:
        return [
            n
            for n, e in self.events
            if e.get("event") == kind and (group_id is None or e.get("group_id") == group_id)
        ]

    def seal_line(self, group_id: str, index: int, rollout_id: str) -> int:
        (number,) = [
            n
            for n, e in self.events
            if e.get("event") == "sibling_sealed"
            and (e["group_id"], e["generation_index"], e["rollout_id"])
            == (group_id, index, rollout_id)
        ]
        return number

    def abandoned_rollouts(self) -> set[str]:
        found: set[str] = set()
        for _, event in self.events:
            if event.get("event") == "attempt_abandoned":
                found.update(
                    r for r in [event.get("rollout_id"), *(event.get("rollout_ids") or [])] if r
                )
        return found

    def clean_group(self) -> str:
        """A trained group with N rows in one step whose every row is its sealed rollout,
        none abandoned (a group the run handled without a retry)."""
        abandoned = self.abandoned_rollouts()
        sealed = {
            (e["group_id"], e["generation_index"], e["rollout_id"])
            for _, e in self.events
            if e.get("event") == "sibling_sealed"
        }
        for group_id, rows in sorted(self.group_rows().items()):
            if len(rows) == N and all(
                (r["group_id"], r["generation_index"], r["rollout_id"]) in sealed
                and r["rollout_id"] not in abandoned
                for _, r in rows
            ):
                return group_id
        raise AssertionError("the run trained no clean group")


def replace_line(path: Path, number: int, record: dict[str, Any]) -> None:
    """Replace line ``number`` (from 1) with ``record``, padded to the old length."""
    lines = path.read_bytes().splitlines(keepends=True)
    old = lines[number - 1]
    new = json.dumps(record, separators=(",", ":")).encode()
    width = len(old) - 1  # without its newline
    assert len(new) <= width, f"{record} does not fit in {path.name}:{number} ({width} bytes)"
    lines[number - 1] = new.ljust(width) + b"\n"
    path.write_bytes(b"".join(lines))


def delete_lines(path: Path, numbers: list[int]) -> None:
    doomed = set(numbers)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(line for n, line in enumerate(lines, start=1) if n not in doomed))


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
