"""The recovering rollout_func against a stand-in trainer: keys, reuse, blocks, checkpoints.

No training here (seconds): the attributes of ``GRPOTrainer`` the adapter reads, and a
rollout function that counts what it is asked to generate. The kill-and-rerun tests with
TRL's real trainer are ``test_trl_recorder.py``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rollout_recovery.adapters.trl import RecoveringRollout, resumed_tag
from rollout_recovery.errors import InvalidArgumentError
from rollout_recovery.recorder import Recorder

G = 2


def trainer(step: int = 0, *, spg: int = 1, micro: int = 0, training: bool = True) -> Any:
    return SimpleNamespace(
        model=SimpleNamespace(training=training),
        num_generations=G,
        num_iterations=1,
        args=SimpleNamespace(steps_per_generation=spg),
        state=SimpleNamespace(global_step=step),
        _step=micro,
    )


def prompts(*rows: int) -> list[Any]:
    return [[{"role": "user", "content": f"row {r}", "row_id": r}] for r in rows for _ in range(G)]


class Counting:
    """A rollout function: completion = [row, sibling, call number]."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    def __call__(self, batch: list[Any], trainer: Any) -> dict[str, Any]:
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        out["env_mask"] = []
        for prompt in batch:
            row, sibling = prompt[0]["row_id"], prompt[0].get("generation_index", -1)
            self.asked.append((row, sibling))
            out["prompt_ids"].append([1, row])
            out["completion_ids"].append([row, sibling, len(self.asked)])
            out["logprobs"].append([-0.5, -0.5, -0.5])
            out["env_mask"].append([1, 1, 1])
        return out


@pytest.fixture
def recorder(tmp_path: Path) -> Any:
    with Recorder.open(tmp_path / "rollout_recovery", group_size=G) as rec:
        yield rec


def test_sealed_rows_are_answered_from_the_journal(recorder: Recorder) -> None:
    inner = Counting()
    rollout = RecoveringRollout(recorder, inner)
    first = rollout(prompts(1, 2), trainer())
    assert inner.asked == [(1, 0), (1, 1), (2, 0), (2, 1)]
    again = rollout(prompts(1, 2), trainer(3))  # TRL regenerating after a resume
    assert again == first and len(inner.asked) == 4
    assert first["env_mask"] == [[1, 1, 1]] * 4
    assert (rollout.generated, rollout.reused) == (4, 4)


def test_a_trained_row_coming_back_is_its_next_occurrence(recorder: Recorder) -> None:
    inner = Counting()
    rollout = RecoveringRollout(recorder, inner)
    trained = trainer()
    rollout(prompts(1), trained)
    trained._step = 1
    rollout.callback().on_step_end(None, SimpleNamespace(global_step=1), _control())
    second = rollout(prompts(1), trainer(1, micro=1))  # the next epoch
    assert len(inner.asked) == 4 and second["completion_ids"][0] == [1, 0, 3]
    taken = [recorder.take(f"1:{n}", prompts(1)[0]) for n in (0, 1)]
    assert taken[0].group_id != taken[1].group_id and taken[0].trained and not taken[1].trained


def test_blocks_are_marked_once_trained_and_checkpoints_as_tags(recorder: Recorder) -> None:
    rollout = RecoveringRollout(recorder, Counting())
    callback = rollout.callback()
    state = trainer(spg=2)
    rollout(prompts(1, 2), state)
    state._step = 1
    callback.on_step_end(None, SimpleNamespace(global_step=1), _control(save=True))
    assert not recorder.take("1:0", prompts(1)[0]).trained  # half the block trained
    state._step = 2
    callback.on_step_end(None, SimpleNamespace(global_step=2), _control(save=True))
    assert recorder.take("1:0", prompts(1)[0]).trained
    assert resumed_tag("/out/checkpoint-2") == "checkpoint-2"
    run_dir = recorder.run_dir
    recorder.close()
    # TRL resumed checkpoint-1, inside the block: the block is trainable again, and sealed.
    with Recorder.open(run_dir, group_size=G, resume_checkpoint="checkpoint-1") as again:
        inner = Counting()
        RecoveringRollout(again, inner)(prompts(1, 2), trainer(1))
        assert inner.asked == []
        assert not again.take("1:0", prompts(1)[0]).trained


def test_evaluation_and_a_wrong_group_size(recorder: Recorder) -> None:
    inner = Counting()
    rollout = RecoveringRollout(recorder, inner)
    rollout(prompts(5), trainer(training=False))
    assert inner.asked == [(5, -1), (5, -1)]  # passed through whole, not recorded
    assert recorder.take("5:0", prompts(5)[0]).group_id == "g00000000"  # the first group
    with pytest.raises(InvalidArgumentError, match="group_size=num_generations"):
        rollout(prompts(1)[:1], trainer())


def _control(save: bool = False) -> Any:
    return SimpleNamespace(should_save=save)
