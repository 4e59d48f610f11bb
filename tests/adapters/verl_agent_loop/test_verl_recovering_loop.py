"""verl with the adapter: ``RecoveringAgentLoop`` answers the siblings sealed before a kill -9.

The same child and kill as the "without adapter" test (``test_verl_group_regeneration.py``):
verl's own ``AgentLoopWorker._run_agent_loop``, 3 siblings of one prompt, a fake server
manager that counts generate calls, a SIGKILL while the third sibling waits in its generate
call. Here the siblings run through ``RecoveringAgentLoop`` (wrapping verl's
``single_turn_agent``) with its recorder in the run directory. The rerun is the prompt
fetched again: a new ``uid`` and a server whose weights moved on (step 6), so the test also
shows the key is the dataset row, not the uid, and that the stored siblings keep the weight
versions they were generated with (what verl's off-policy filter reads).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from adapter_crash import python_argv, read_jsonl, run_and_kill_at, run_to_end
from verl_group_child import BLOCKED, FINISHED, TWO_TURNS, WEIGHT_VERSION

CHILD = Path(__file__).with_name("verl_group_child.py")
N = 3
LATER_WEIGHTS = WEIGHT_VERSION + 1

pytestmark = pytest.mark.slow


def finished(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith(f"{FINISHED} ")]


def events(log: Path, run: str, event: str) -> list[dict[str, Any]]:
    return [x for x in read_jsonl(log) if x["run"] == run and x["event"] == event]


def audit(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollout_recovery", "audit", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def child_env() -> dict[str, str]:
    return dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")


def test_a_kill_after_two_of_three_sealed_siblings_makes_one_generate_call_on_restart(
    tiny_llama: str, tmp_path: Path, child_env: dict[str, str]
) -> None:
    log, run_dir = tmp_path / "events.jsonl", tmp_path / "rollout_recovery"
    base = ["--model", tiny_llama, "--log", str(log), "--n", str(N), "--recover", str(run_dir)]

    killed = run_and_kill_at(
        python_argv(CHILD, *base, "--run", "first", "--block-after", "2"),
        until=lambda lines: len(finished(lines)) == 2 and BLOCKED in lines,
        env=child_env,
    )
    assert killed.killed, killed.output
    # FINISHED follows run(), which returns after the seal is durable: these two are sealed.
    before = {x["session"]: x for x in events(log, "first", "finished")}
    assert len(before) == 2 and len(events(log, "first", "generate")) == 2

    rerun = python_argv(CHILD, *base, "--run", "rerun", "--uid", "uid-7-refetched",
                        "--weight-version", str(LATER_WEIGHTS))  # fmt: skip
    run_to_end(rerun, env=child_env)
    calls = events(log, "rerun", "generate")
    after = {x["session"]: x for x in events(log, "rerun", "finished")}
    assert set(after) == set(range(N))
    regenerated = [after[s] for s in before if after[s]["response"] != before[s]["response"]]
    print(f"with the adapter: generate calls 2 before the kill, {len(calls)} on the rerun; "
          f"siblings finished before the kill and generated again: {len(regenerated)} "
          f"({sum(x['response_tokens'] for x in regenerated)} response tokens)")  # fmt: skip
    assert len(calls) == 1
    assert regenerated == []
    for session, old in before.items():
        # The stored sibling, with the weight versions it was generated with.
        assert after[session]["min_global_steps"] == WEIGHT_VERSION, after[session]
        assert after[session]["max_global_steps"] == WEIGHT_VERSION, after[session]
        assert after[session]["response_tokens"] == old["response_tokens"]
    (new,) = (after[s] for s in range(N) if s not in before)
    assert new["min_global_steps"] == new["max_global_steps"] == LATER_WEIGHTS

    audited = audit(run_dir)
    assert audited.returncode == 0, audited.stdout + audited.stderr


def test_an_unsealed_sibling_continues_after_its_staged_generate_call(
    tiny_llama: str, tmp_path: Path, child_env: dict[str, str]
) -> None:
    """A two-turn loop killed in its second generate call: the rerun answers the first call
    from the journal and makes only the second."""
    log, run_dir = tmp_path / "events.jsonl", tmp_path / "rollout_recovery"
    base = ["--model", tiny_llama, "--log", str(log), "--n", "1", "--recover", str(run_dir),
            "--loop", TWO_TURNS]  # fmt: skip

    killed = run_and_kill_at(
        python_argv(CHILD, *base, "--run", "first", "--block-after", "1"),
        until=lambda lines: BLOCKED in lines,
        env=child_env,
    )
    assert killed.killed, killed.output
    (first_turn,) = events(log, "first", "generate")

    run_to_end(python_argv(CHILD, *base, "--run", "rerun"), env=child_env)
    calls = events(log, "rerun", "generate")
    (done,) = events(log, "rerun", "finished")
    assert len(calls) == 1, calls
    # Both turns in the response: the staged first one, then the one generated now.
    assert done["response_tokens"] == first_turn["tokens"] + calls[0]["tokens"]

    audited = audit(run_dir)
    assert audited.returncode == 0, audited.stdout + audited.stderr


RAY_CHILD = Path(__file__).with_name("verl_ray_child.py")


@pytest.fixture
def ray_temp() -> Iterator[str]:
    """Ray's temp dir, short (its socket paths must fit 107 bytes) and removed after."""
    parent = os.environ.get("RAY_TMPDIR") or None
    path = tempfile.mkdtemp(prefix="rr-ray-", dir=parent)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_two_ray_workers_share_the_recorder_actor_across_a_kill(
    tiny_llama: str, tmp_path: Path, child_env: dict[str, str], ray_temp: str
) -> None:
    """verl's worker in two Ray actors, the recorder in its named actor: the same kill."""
    log, run_dir = tmp_path / "events.jsonl", tmp_path / "rollout_recovery"
    suite = str(Path(__file__).parent)
    env = dict(child_env, PYTHONPATH=os.pathsep.join([suite, child_env.get("PYTHONPATH", "")]))
    base = ["--model", tiny_llama, "--log", str(log), "--recover", str(run_dir),
            "--ray-temp", ray_temp]  # fmt: skip

    killed = run_and_kill_at(
        python_argv(RAY_CHILD, *base, "--run", "first", "--block"),
        until=lambda lines: len(finished(lines)) == 2 and BLOCKED in lines,
        env=env,
    )
    assert killed.killed, killed.output
    before = {x["session"]: x for x in events(log, "first", "finished")}
    assert set(before) == {0, 1} and len(events(log, "first", "generate")) == 2

    rerun = python_argv(RAY_CHILD, *base, "--run", "rerun", "--uid", "uid-7-refetched",
                        "--weight-version", str(LATER_WEIGHTS))  # fmt: skip
    run_to_end(rerun, env=env)
    after = {x["session"]: x for x in events(log, "rerun", "finished")}
    assert set(after) == set(range(N))
    assert len(events(log, "rerun", "generate")) == 1
    for session, old in before.items():
        assert after[session]["response"] == old["response"]
        assert after[session]["max_global_steps"] == WEIGHT_VERSION
    assert after[2]["max_global_steps"] == LATER_WEIGHTS

    audited = audit(run_dir)
    assert audited.returncode == 0, audited.stdout + audited.stderr
