"""The staging buffers background checkpoints copy the trainer's moments into, reused by
every capture (``llm/_staging.py``): whatever the order of stages, reads, drops and
changes to the live tensors, a read gives exactly the tensors of its own stage or refuses,
and a stage is refused exactly while the previous one is leased."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rollout_recovery.errors import InvalidOperationError, InvalidStateError
from rollout_recovery.llm._staging import StagedTensors, StagingBuffers

SHAPES = {"a": (3,), "b": (2, 2), "c": ()}


class StagingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.buffers = StagingBuffers()
        self.live = {name: torch.zeros(shape) for name, shape in SHAPES.items()}
        #: Every stage handed out (None once dropped), with the values it copied.
        self.stages: list[tuple[StagedTensors | None, dict[str, torch.Tensor]]] = []
        self.leased: int | None = None  # the index of the leased stage, if any

    @rule(value=st.floats(-4, 4, width=32), name=st.sampled_from(sorted(SHAPES)))
    def train(self, value: float, name: str) -> None:
        self.live[name].fill_(value)

    @rule(names=st.sets(st.sampled_from(sorted(SHAPES)), min_size=1))
    def stage(self, names: set[str]) -> None:
        tensors = {name: self.live[name] for name in sorted(names)}
        if self.leased is not None:
            before = [dict(t) for t in self._readable()]
            try:
                self.buffers.stage(tensors)
            except InvalidOperationError:
                assert [dict(t) for t in self._readable()] == before
                return
            raise AssertionError("a stage while another is leased went ahead")
        staged = self.buffers.stage(tensors)
        self.stages.append((staged, {name: t.clone() for name, t in tensors.items()}))
        self.leased = len(self.stages) - 1

    @precondition(lambda self: self.stages)
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.stages) - 1))
        staged, expected = self.stages[index]
        if staged is None:
            return
        newest = index == len(self.stages) - 1
        try:
            got = staged.read(lambda tensors: {n: t.clone() for n, t in tensors.items()})
        except InvalidStateError:
            assert not newest, "the newest stage refused to be read"
            return
        assert newest, "a stage overwritten by a later one was read"
        assert got.keys() == expected.keys()
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor)
        self.leased = None

    @precondition(lambda self: self.stages)
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.stages) - 1))
        self.stages[index] = (None, self.stages[index][1])
        if index == self.leased:
            self.leased = None

    def _readable(self) -> list[dict[str, torch.Tensor]]:
        return [
            staged.read(lambda tensors: {n: t.clone() for n, t in tensors.items()})
            for staged, _ in self.stages[-1:]
            if staged is not None and self.leased is None
        ]

    @invariant()
    def leased_as_modelled(self) -> None:
        assert self.buffers.leased == (self.leased is not None)


TestStagingMachine = StagingMachine.TestCase
TestStagingMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_a_stage_is_refused_while_the_previous_one_is_being_read() -> None:
    """The lease ends when a read returns, not when it starts: a capture asked for while
    the copy is being encoded is refused and overwrites nothing (another thread's waits
    for the read on the buffers' lock; this one, already holding it, is refused)."""
    buffers = StagingBuffers()
    staged = buffers.stage({"a": torch.ones(4)}, reserve={"b": torch.ones(2)})

    def read_and_stage(tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        with pytest.raises(InvalidOperationError):
            buffers.stage({"a": torch.zeros(4)})
        return tensors["a"].clone()

    assert torch.equal(staged.read(read_and_stage), torch.ones(4))
    staged_again = buffers.stage({"a": torch.zeros(4), "b": torch.zeros(2)})
    assert staged_again.read(lambda tensors: sorted(tensors)) == ["a", "b"]
