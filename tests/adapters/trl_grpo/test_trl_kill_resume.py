"""TRL without the adapter: what a kill -9 inside a rollout costs after ``resume_from_checkpoint``.

The example (``examples/trl/grpo_recovering.py``, a plain ``rollout_func`` generating with
the trainer's model) is killed after K completions of the rollout at TRL step 4, then rerun
with the same command, which resumes from the newest checkpoint. Completions are keyed by
content, (dataset row id, generation index): the key a journal keeps. Measured here, and
pinned, as the "without" column of docs/benchmarks.md:

- checkpoints on generation boundaries (``steps_per_generation=1``, ``save_steps=2``):
  the rerun regenerates the K completions the killed rollout had made;
- a checkpoint inside a generation block (``steps_per_generation=2``, ``save_steps=3``):
  the rerun also regenerates the whole block before it, which it had already trained on
  (TRL does not save its position inside a block).

``test_trl_recorder.py`` runs the same scenarios with the recorder plugged in: no completion
sealed before the kill is generated again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from adapter_crash import python_argv, read_jsonl, run_and_kill_at, run_to_end
from trl_child import STOPPED

CHILD = Path(__file__).with_name("trl_child.py")
#: The example's batch shape: 4 completions per step, 2 per prompt.
ROWS_PER_STEP = 4

pytestmark = pytest.mark.slow


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    steps_per_generation: int
    save_steps: int
    max_steps: int
    #: The rollout generated at this TRL step is killed after ``stop_after`` completions.
    stop_at_step: int
    stop_after: int
    #: The newest checkpoint when the kill lands (the rerun resumes from it).
    newest_checkpoint: int
    #: Completions made before the kill that the rerun makes again.
    regenerated: int
    #: Completions the rerun makes in all.
    rerun: int


SCENARIOS = [
    # Rollouts at every step; checkpoint-4 was saved just before the killed rollout, which
    # the rerun replays: its 2 pre-kill completions are made again.
    Scenario("block-boundary", 1, 2, 6, stop_at_step=4, stop_after=2, newest_checkpoint=4,
             regenerated=2, rerun=2 * ROWS_PER_STEP),
    # Rollouts at steps 0, 2, 4, 6 for two steps each; checkpoint-3 sits inside the block
    # generated at step 2. The rerun generates that block again (8 completions, one step of
    # which it had trained on), then the killed block (3 made before the kill), then the rest.
    Scenario("mid-block", 2, 3, 8, stop_at_step=4, stop_after=3, newest_checkpoint=3,
             regenerated=2 * ROWS_PER_STEP + 3, rerun=3 * 2 * ROWS_PER_STEP),
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Regeneration:
    """Completions (and their tokens) of the killed run and of the rerun, by content key."""

    before_kill: int
    rerun: int
    regenerated: int
    regenerated_tokens: int

    @classmethod
    def of(cls, first: list[dict[str, Any]], rerun: list[dict[str, Any]]) -> Regeneration:
        made = {key(line) for line in first}
        again = [line for line in rerun if key(line) in made]
        return cls(
            before_kill=len(first),
            rerun=len(rerun),
            regenerated=len(again),
            regenerated_tokens=sum(len(line["completion_ids"]) for line in again),
        )


def key(line: dict[str, Any]) -> tuple[int, int]:
    return (line["row_id"], line["generation_index"])


def example_args(scenario: Scenario, output_dir: Path, model_cache: str) -> list[str]:
    return [
        "--output-dir", str(output_dir),
        "--max-steps", str(scenario.max_steps),
        "--save-steps", str(scenario.save_steps),
        "--steps-per-generation", str(scenario.steps_per_generation),
        "--model-cache", model_cache,
    ]  # fmt: skip


def checkpoints(output_dir: Path) -> list[int]:
    return sorted(int(path.name.split("-")[1]) for path in output_dir.glob("checkpoint-*"))


def kill_inside_the_rollout(
    scenario: Scenario, args: list[str], log: Path, out: Path, env: dict[str, str]
) -> None:
    """Run the example until the rollout at ``scenario.stop_at_step`` has made
    ``stop_after`` completions, and SIGKILL it there."""
    stop = ["--stop-at-step", str(scenario.stop_at_step), "--stop-after", str(scenario.stop_after)]
    killed = run_and_kill_at(
        python_argv(CHILD, "--log", str(log), "--run", "first", *stop, "--", *args),
        until=lambda lines: lines[-1] == STOPPED,
        env=env,
    )
    assert killed.killed, killed.output
    assert max(checkpoints(out)) == scenario.newest_checkpoint


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_a_kill_inside_a_rollout_regenerates_completions_made_before_it(
    scenario: Scenario, tmp_path: Path, model_cache: str, child_env: dict[str, str]
) -> None:
    out, log = tmp_path / "run", tmp_path / "completions.jsonl"
    args = [*example_args(scenario, out, model_cache), "--no-recorder"]
    kill_inside_the_rollout(scenario, args, log, out, child_env)
    first = read_jsonl(log)
    killed_rollout = [line for line in first if line["global_step"] == scenario.stop_at_step]
    assert len(killed_rollout) == scenario.stop_after

    rerun = run_to_end(
        python_argv(CHILD, "--log", str(log), "--run", "rerun", "--", *args), env=child_env
    )
    assert f"resuming from {out / f'checkpoint-{scenario.newest_checkpoint}'}" in rerun.output
    lines = read_jsonl(log)
    first = [x for x in lines if x["run"] == "first"]
    again = [x for x in lines if x["run"] == "rerun"]
    assert max(checkpoints(out)) == scenario.max_steps

    # Each completion of a run is made once: (row id, generation index) is a content key.
    assert max(Counter(map(key, first)).values()) == 1
    assert max(Counter(map(key, again)).values()) == 1
    # The rerun remade every completion of the killed rollout (the same rows: TRL's
    # sampler is seeded), and the pinned count of other completions made before the kill.
    assert {key(x) for x in killed_rollout} <= {key(x) for x in again}
    report = Regeneration.of(first, again)
    print(f"{scenario.name}: {report}")
    assert (report.regenerated, report.rerun) == (scenario.regenerated, scenario.rerun), report
