"""TRL with the adapter: a kill -9 inside a rollout, a rerun, and no sealed completion made
again (issue 26, item 2).

The scenarios of ``test_trl_kill_resume.py`` (the "without" column), with the recorder
plugged in as ``examples/trl/grpo_recovering.py`` plugs it: every completion is sealed as it
is made (``seal_every=1``), the journal in ``DIR/rollout_recovery``. After the kill, the
journal says which completions were sealed; the rerun must generate none of them, in the
mid-block scenario either (TRL regenerates a block it already trained: the recorder answers
it from the journal). The one completion the kill interrupted (made, not yet sealed) is the
only one made twice. ``rollout-recovery audit`` passes on the journal after each run.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from adapter_crash import python_argv, read_jsonl, run_to_end
from test_trl_kill_resume import (
    CHILD,
    SCENARIOS,
    Scenario,
    checkpoints,
    example_args,
    key,
    kill_inside_the_rollout,
)

from rollout_recovery.history import AuditTrail, records
from rollout_recovery.rundir import RunDirectory

pytestmark = pytest.mark.slow


def sealed_completions(journal_dir: Path) -> dict[tuple[int, int], list[int]]:
    """(row id, generation index) -> completion tokens of every seal in the journal."""
    keys: dict[str, str] = {}
    sealed: dict[tuple[int, int], list[int]] = {}
    for record in AuditTrail.read_history(RunDirectory(journal_dir)):
        if isinstance(record, records.PromptTaken) and record.key is not None:
            keys[record.group_id] = record.key
        elif isinstance(record, records.SiblingSealed):
            row = int(keys[record.group_id].split(":")[0])
            output = record.seal.receipt["output"]
            sealed[(row, record.seal.generation_index)] = output["completion_token_ids"]
    return sealed


def audit(journal_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rollout_recovery", "audit", str(journal_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_a_kill_inside_a_rollout_regenerates_no_sealed_completion(
    scenario: Scenario, tmp_path: Path, model_cache: str, child_env: dict[str, str]
) -> None:
    out, log = tmp_path / "run", tmp_path / "completions.jsonl"
    journal = out / "rollout_recovery"
    args = example_args(scenario, out, model_cache)
    kill_inside_the_rollout(scenario, args, log, out, child_env)
    sealed = sealed_completions(journal)
    first = read_jsonl(log)
    made = {key(line): line["completion_ids"] for line in first}
    # Every completion made before the kill is sealed, but the one the kill interrupted.
    assert set(sealed) <= set(made)
    assert len(made) - len(sealed) == 1
    assert all(sealed[k] == made[k] for k in sealed)
    audit(journal)

    rerun = run_to_end(
        python_argv(CHILD, "--log", str(log), "--run", "rerun", "--", *args), env=child_env
    )
    assert f"resuming from {out / f'checkpoint-{scenario.newest_checkpoint}'}" in rerun.output
    assert max(checkpoints(out)) == scenario.max_steps
    again = [x for x in read_jsonl(log) if x["run"] == "rerun"]
    assert max(Counter(map(key, again)).values()) == 1
    regenerated = [x for x in again if key(x) in made]
    print(
        f"{scenario.name}: made before the kill {len(made)}, sealed {len(sealed)}; "
        f"rerun generated {len(again)}, of which made before the kill {len(regenerated)} "
        f"({sum(len(x['completion_ids']) for x in regenerated)} tokens); "
        f"without the adapter {scenario.regenerated}"
    )
    assert not {key(x) for x in again} & set(sealed), "a sealed completion was generated again"
    assert len(regenerated) == 1  # the one in flight when the kill landed
    # Every completion the run trained on is in the journal, each sealed once.
    final = sealed_completions(journal)
    assert set(final) >= set(sealed) and all(final[k] == sealed[k] for k in sealed)
    audit(journal)
