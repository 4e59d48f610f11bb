"""Checkpointing is the controller's collaborator (issue 25, item 6): built with what it
reads, it never reads or sets the controller.

Two checks: no module of the package but the controller's own assigns to a controller's
attribute (an AST scan, with a test that it sees each kind of assignment), and the
collaborator takes and restores a checkpoint of a small ledger with no ``Controller``
anywhere: the test journals the records itself, as the controller would (apply the
record's transition, then append it), and applies what the restore returns.
"""

from __future__ import annotations

import ast
import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rollout_recovery
from rollout_recovery._cut import MutationCut
from rollout_recovery.capture import CaptureWriter
from rollout_recovery.capture._receipt import assemble_receipt
from rollout_recovery.control._checkpointing import ControllerCheckpoints, RestoredRun
from rollout_recovery.control._config import RunConfig, config_from_builtins
from rollout_recovery.control._deferred import DeferredDeletionDataPlane
from rollout_recovery.control._state import ControllerState
from rollout_recovery.control._transitions import Transitions
from rollout_recovery.dataplane import DataPlaneCheckpointBarrier, MemoryDataPlane, ReplayIndex
from rollout_recovery.history import AuditTrail
from rollout_recovery.history.records import (
    AttemptsAbandoned,
    BatchAdmitted,
    FreshAttempt,
    HistoryRecord,
    PromptTaken,
    Restored,
    RoundStarted,
    Seal,
    SiblingSealed,
)
from rollout_recovery.ledger import RolloutAttemptStatus, RolloutRecoveryLedger
from rollout_recovery.rewards import CaptureRewardSettings
from rollout_recovery.rollout import FailureReason
from rollout_recovery.rundir import CheckpointStore, RunDirectory

PACKAGE = Path(rollout_recovery.__file__).parent
CONTROLLER_MODULE = PACKAGE / "control" / "_controller.py"

# -- no assignment to a controller's attributes from outside it -----------------------------


def _names_a_controller(node: ast.expr) -> bool:
    """Whether ``node`` is (by its name) a controller: ``controller``,
    ``self.controller``, ``checkpoints.controller``, ``live_controller``, ..."""
    if isinstance(node, ast.Name):
        return "controller" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "controller" in node.attr.lower()
    return False


def _targets(node: ast.AST) -> Iterator[ast.expr]:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            yield from _flatten(target)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        yield from _flatten(node.target)
    elif isinstance(node, ast.Delete):
        for target in node.targets:
            yield from _flatten(target)


def _flatten(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _flatten(element)
    elif isinstance(target, ast.Starred):
        yield from _flatten(target.value)
    else:
        yield target


def controller_assignments(source: str, name: str) -> list[str]:
    """Every place ``source`` sets (assigns, augments, deletes, ``setattr``) an attribute
    of something named a controller, as ``name:line: code``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        hits = [
            target
            for target in _targets(node)
            if isinstance(target, ast.Attribute) and _names_a_controller(target.value)
        ]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"setattr", "delattr"}
            and node.args
            and _names_a_controller(node.args[0])
        ):
            hits.append(node.args[0])
        found.extend(f"{name}:{hit.lineno}: {ast.unparse(node)[:80]}" for hit in hits)
    return found


def test_nothing_outside_the_controller_assigns_its_attributes() -> None:
    """The controller's state changes only by its own methods: its collaborators
    (checkpointing above all) return what they did and the controller applies it."""
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == CONTROLLER_MODULE:
            continue
        found.extend(controller_assignments(path.read_text(), str(path.relative_to(PACKAGE))))
    assert not found, "assignments to a controller's attributes:\n" + "\n".join(found)


def test_the_scan_sees_every_kind_of_assignment() -> None:
    source = """
controller.state = state
self.controller.replay = replay
controller.in_flight += 1
controller.a, (controller.b, other) = 1, (2, 3)
controller.metrics: object = None
del controller.snapshots
setattr(controller, "samples", None)
controller.record(x)
self.state = state
"""
    lines = sorted(int(hit.split(":")[1]) for hit in controller_assignments(source, "x.py"))
    assert lines == [2, 3, 4, 5, 5, 6, 7, 8]


# -- the collaborator alone -------------------------------------------------------------------

N = 2  # siblings per group
BATCH = 2  # groups per step
CONFIG: RunConfig = config_from_builtins(
    {
        "job": {"steps": 4, "prompts_per_step": BATCH, "generations_per_prompt": N},
        "checkpoint": {"keep": 2},
    }
)


class _Cut:
    """The test is the only writer: every cut is live."""

    def require_live(self) -> None:
        return None


CUT: MutationCut = _Cut()


class VersionTrainer:
    """A trainer whose state is its weight version."""

    def __init__(self) -> None:
        self.weight_version = 0

    def weights(self) -> int:
        return self.weight_version

    def train_step(self, samples: Any, *, version: int) -> dict[str, float]:
        self.weight_version = version
        return {}

    def state(self) -> dict[str, np.ndarray[Any, Any]]:
        return {"version": np.array([self.weight_version], dtype=np.int64)}

    def load_state(self, state: Any) -> None:
        self.weight_version = int(state["version"][0])


class Process:
    """What one process of a run holds: the parts the collaborator is built from (no
    controller), over a run directory and a store that outlive it."""

    def __init__(self, root: Path, durable: MemoryDataPlane) -> None:
        self.history = AuditTrail(RunDirectory(root))
        self.history.journal.sync_in_thread = False
        self.ledger = RolloutRecoveryLedger()
        self.rows = DeferredDeletionDataPlane(durable, keep=CONFIG.checkpoint.keep)
        self.replay = ReplayIndex(data_plane=self.rows, group_size=N)
        self.state = ControllerState.initial(0)
        self.checkpoints = ControllerCheckpoints(
            store=CheckpointStore(root, keep=CONFIG.checkpoint.keep),
            config=CONFIG,
            ledger=self.ledger,
            rows=self.rows,
            trainer=VersionTrainer(),
            history=self.history,
            barrier=DataPlaneCheckpointBarrier(),
            settings=CaptureRewardSettings.from_configs(),
            dataset=[{"idx": idx, "task_name": None} for idx in range(BATCH)],
        )

    def record(self, record: HistoryRecord) -> None:
        """What the controller's ``record`` does: apply the transition, then append."""
        transitions = Transitions(
            ledger=self.ledger, replay=self.replay, state=self.state, rows=self.rows
        )
        transitions.apply(CUT, record)
        self.history.append(record)

    def apply(self, restored: RestoredRun) -> None:
        """What the controller's ``restore`` does with the collaborator's result."""
        self.replay, self.state = restored.replay, restored.state
        self.record(restored.record)
        for abandoned in restored.abandoned:
            self.record(abandoned)


def _attempt(group: str, index: int) -> str:
    return f"{group}_g{index}_a{uuid.uuid4().hex}"


def _seal(process: Process, group: str, index: int, rollout_id: str) -> SiblingSealed:
    """Stage one call of two generated tokens and seal it."""
    call = CaptureWriter(process.rows).stage_call(
        rollout_id=rollout_id,
        model_call_id="c0",
        parent=None,
        prompt_token_ids=[1, 2, 3],
        generated_token_ids=[7, 8],
        generated_logprobs=[-0.5, -0.5],
        weight_version=0,
    )
    receipt = assemble_receipt(rollout_id, [call], terminal_model_call_id="c0").to_dict()
    seal = Seal(
        generation_index=index,
        rollout_id=rollout_id,
        receipt=receipt,
        reward=1.0,
        mask_sample=False,
        tokens=2,
        weight_versions=[0],
    )
    return SiblingSealed(group_id=group, seal=seal)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[Process]]:
    made: list[Process] = []
    yield made
    for process in made:
        process.history.close()


def test_the_collaborator_takes_and_restores_a_checkpoint_without_a_controller(
    tmp_path: Path, processes: list[Process]
) -> None:
    """A batch of two groups, both dispatched; one sibling sealed before the checkpoint,
    one after. A second process restores: the ledger holds both seals (the one after the
    snapshot replayed from the journal), the two attempts still running are abandoned
    (reason ``restart``), and the ``restored`` record says what the restore kept."""
    durable = MemoryDataPlane()
    first = Process(tmp_path, durable)
    processes.append(first)
    groups = [f"g{position:07d}" for position in range(BATCH)]
    attempts = {group: [_attempt(group, i) for i in range(N)] for group in groups}
    for position, group in enumerate(groups):
        first.record(
            PromptTaken(
                group_id=group,
                prompt_idx=position,
                position=position,
                batch=0,
                attempts=attempts[group],
            )
        )
    first.record(BatchAdmitted(batch=0, group_ids=groups, target_step=0, weight_version=0))
    for group in groups:
        dispatched = [FreshAttempt(i, rollout) for i, rollout in enumerate(attempts[group])]
        first.record(RoundStarted(group_id=group, round=1, dispatched=dispatched, weight_version=0))
    first.record(_seal(first, groups[0], 0, attempts[groups[0]][0]))
    first.checkpoints.follow_journal(replay=first.replay, state=first.state)

    timing = asyncio.run(first.checkpoints.take())
    first.record(timing.committed())
    assert timing.name == "step_000000" and first.checkpoints.timings == [timing]
    first.record(_seal(first, groups[0], 1, attempts[groups[0]][1]))  # after the snapshot
    first.history.close()  # the crash: only the journal, the store and the rows remain

    second = Process(tmp_path, durable)
    processes.append(second)
    verified = second.checkpoints.newest_restorable()
    assert verified is not None and verified.name == timing.name
    assert second.checkpoints.skipped == []
    restored = second.checkpoints.restore(CUT, verified)
    second.apply(restored)

    record = restored.record
    assert isinstance(record, Restored)
    assert (record.checkpoint, record.step, record.snapshot_position) == (
        timing.name,
        0,
        timing.position,
    )
    assert record.replayed_records == 2  # checkpoint_committed and the later seal
    assert (record.groups_in_ledger, record.sealed_siblings_kept) == (BATCH, 2)
    assert record.tokens_reused == 4 and record.tokens_kept == 4
    assert record.tokens_regenerated == 0 and record.rows_kept(N) == 2
    assert [a.group_id for a in restored.abandoned] == [groups[1]]
    (abandoned,) = restored.abandoned
    assert isinstance(abandoned, AttemptsAbandoned)
    assert [(a.rollout_id, a.reason) for a in abandoned.attempts] == [
        (rollout, FailureReason.RESTART) for rollout in attempts[groups[1]]
    ]
    # Both seals are back; every attempt the crash interrupted was given back.
    group = second.ledger.get_group(groups[0])
    assert sorted(group.sealed_generation_indices) == [0, 1]
    assert {s.current_attempt.status for s in second.ledger.get_group(groups[1]).siblings} == {
        RolloutAttemptStatus.ABANDONED
    }
    assert second.state.counters.checkpoints == 1  # its commit, replayed
