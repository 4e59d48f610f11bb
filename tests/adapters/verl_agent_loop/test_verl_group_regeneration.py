"""verl without the adapter: a kill -9 with 2 of 3 siblings finished regenerates the group.

verl's V1 trainer re-issues a restored in-flight prompt whole: ``_reissue_inflight_prompts``
clears the prompt's ``{uid}_*`` trajectories and runs all ``rollout.n`` sessions again, so
siblings that had finished before the kill are generated again. The child drives verl's own
``AgentLoopWorker._run_agent_loop`` with the registered ``single_turn_agent`` loop and a fake
server manager that counts generate calls (``verl_group_child.py``). Measured and pinned here
as the "without" column of docs/benchmarks.md; the adapter's test will run the same kill
and expect the rerun to make exactly 1 generate call (the sibling that had not finished).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from adapter_crash import python_argv, read_jsonl, run_and_kill_at, run_to_end
from verl_group_child import BLOCKED, FINISHED

CHILD = Path(__file__).with_name("verl_group_child.py")
N = 3

pytestmark = pytest.mark.slow


def finished(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith(f"{FINISHED} ")]


def events(log: Path, run: str, event: str) -> list[dict[str, Any]]:
    return [x for x in read_jsonl(log) if x["run"] == run and x["event"] == event]


def test_a_kill_after_two_of_three_siblings_regenerates_all_three(
    tiny_llama: str, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    base = ["--model", tiny_llama, "--log", str(log), "--n", str(N)]

    killed = run_and_kill_at(
        python_argv(CHILD, *base, "--run", "first", "--block-after", "2"),
        until=lambda lines: len(finished(lines)) == 2 and BLOCKED in lines,
        env=env,
    )
    assert killed.killed, killed.output
    sealed = {x["session"]: x["response_tokens"] for x in events(log, "first", "finished")}
    assert len(sealed) == 2 and len(events(log, "first", "generate")) == 2

    run_to_end(python_argv(CHILD, *base, "--run", "rerun"), env=env)
    calls = events(log, "rerun", "generate")
    again = [x for x in events(log, "rerun", "finished") if x["session"] in sealed]
    assert {x["session"] for x in events(log, "rerun", "finished")} == set(range(N))
    # The whole group again: one generate call per sibling, the 2 finished ones included.
    print(f"generate calls: 2 before the kill, {len(calls)} on the rerun; siblings finished "
          f"before the kill and generated again: {len(again)} "
          f"({sum(x['response_tokens'] for x in again)} response tokens)")  # fmt: skip
    assert len(calls) == N
    assert len(again) == 2
