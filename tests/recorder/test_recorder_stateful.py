"""The recorder against a model of what it promises, over random call sequences: take,
stage, seal, mark trained, checkpoint, close (or die) and reopen at any checkpoint.

The model: each key's sealed outputs (never lost, never changed), the staged calls of its
unsealed siblings (back after a reopen), and whether it is trained (rolled back to what it
was at the checkpoint the reopen resumes; a fresh trainer has trained nothing)."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rollout_recovery.errors import InvalidTransitionError
from rollout_recovery.history import audit_run
from rollout_recovery.recorder import Recorder, SiblingOutput, StagedCall

GROUP_SIZE = 2
KEYS = ["0:a", "0:b", "0:c", "1:a"]


@dataclass
class Model:
    sealed: dict[int, list[int]] = field(default_factory=dict)
    staged: dict[int, list[list[int]]] = field(default_factory=dict)
    trained: bool = False


class RecorderMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="recorder-machine-"))
        self.run_dir = self.directory / "run"
        self.rec = Recorder.open(self.run_dir, group_size=GROUP_SIZE)
        self.model: dict[str, Model] = {}
        self.groups: dict[str, str] = {}
        #: tag -> the keys trained when it was saved
        self.checkpoints: dict[str, set[str]] = {}
        self.counter = 0

    def teardown(self) -> None:
        try:
            self.rec.mark_checkpoint("teardown", step=0)
            self.rec.close()
            report = audit_run(self.run_dir)
            assert report.ok, report.violations
        finally:
            self.rec.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    def _check(self, key: str) -> None:
        taken = self.rec.take(key, {"prompt": key})
        model = self.model[key]
        assert taken.group_id == self.groups[key]
        assert {s: v.completion_token_ids for s, v in taken.sealed.items()} == model.sealed
        assert {
            s: [call.output_token_ids for call in calls] for s, calls in taken.staged.items()
        } == {s: calls for s, calls in model.staged.items() if calls}
        assert taken.trained is model.trained

    @rule(key=st.sampled_from(KEYS))
    def take(self, key: str) -> None:
        if key not in self.model:
            self.groups[key] = self.rec.take(key, {"prompt": key}).group_id
            self.model[key] = Model()
        self._check(key)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 500), min_size=1, max_size=3))
    def stage(self, data: st.DataObject, tokens: list[int]) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        sibling = data.draw(st.integers(0, GROUP_SIZE - 1))
        model = self.model[key]
        if sibling in model.sealed:
            return
        self.rec.stage_call(self.groups[key], sibling, StagedCall([1], tokens))
        model.staged.setdefault(sibling, []).append(tokens)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 500), min_size=1, max_size=3))
    def seal(self, data: st.DataObject, tokens: list[int]) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        sibling = data.draw(st.integers(0, GROUP_SIZE - 1))
        model = self.model[key]
        if sibling in model.sealed and model.sealed[sibling] != tokens:
            with pytest.raises(InvalidTransitionError, match="a sealed sibling never changes"):
                self.rec.seal(self.groups[key], sibling, SiblingOutput([1], tokens))
            return
        result = self.rec.seal(self.groups[key], sibling, SiblingOutput([1], tokens))
        assert result.completion_token_ids == tokens
        model.sealed[sibling] = tokens
        model.staged.pop(sibling, None)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def seal_the_rest(self, data: st.DataObject) -> None:
        """A whole group finishing (what most groups do)."""
        key = data.draw(st.sampled_from(sorted(self.model)))
        model = self.model[key]
        for sibling in range(GROUP_SIZE):
            if sibling not in model.sealed:
                tokens = [len(key), sibling]
                self.rec.seal(self.groups[key], sibling, SiblingOutput([1], tokens))
                model.sealed[sibling] = tokens
                model.staged.pop(sibling, None)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def mark_trained(self, data: st.DataObject) -> None:
        ready = [
            key
            for key, model in sorted(self.model.items())
            if len(model.sealed) == GROUP_SIZE and not model.trained
        ]
        if not ready:
            return
        keys = data.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True))
        self.rec.mark_trained([self.groups[key] for key in keys], step=self.counter)
        for key in keys:
            self.model[key].trained = True

    @rule()
    def checkpoint(self) -> None:
        self.counter += 1
        tag = f"checkpoint-{self.counter}"
        self.rec.mark_checkpoint(tag, step=self.counter)
        self.checkpoints[tag] = {key for key, model in self.model.items() if model.trained}

    @rule(data=st.data(), die=st.booleans())
    def reopen(self, data: st.DataObject, die: bool) -> None:
        tag = data.draw(st.sampled_from([None, *sorted(self.checkpoints)]))
        if die:
            self.rec._release()  # the process died: nothing closed in order
        else:
            self.rec.close()
        self.rec = Recorder.open(self.run_dir, group_size=GROUP_SIZE, resume_checkpoint=tag)
        trained = set() if tag is None else self.checkpoints[tag]
        for key, model in self.model.items():
            model.trained = key in trained

    @invariant()
    def every_key_reads_as_the_model_says(self) -> None:
        for key in self.model:
            self._check(key)


TestRecorderMachine = RecorderMachine.TestCase
TestRecorderMachine.settings = settings(max_examples=15, stateful_step_count=20)
