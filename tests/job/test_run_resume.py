"""Call-level resume in the real job: a lost attempt's staged calls are continued, after a
worker death in the same run and after a SIGKILL and a restart; the switch turns it off.

Every test checks the history (``attempt_resumed`` records against what the seals used),
and the auditor passes the run.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery._crashpoints import CRASH_AT_ENV
from rollout_recovery.capture import CaptureWriter
from rollout_recovery.control import RunConfig
from rollout_recovery.dataplane import SqliteDataPlane
from rollout_recovery.history import audit_run
from rollout_recovery.history._trail_check import check_trail
from rollout_recovery.job import run_job
from rollout_recovery.rundir import RunDirectory

Cli = Callable[..., subprocess.CompletedProcess[str]]
ReadJsonl = Callable[[Path], list[dict[str, Any]]]
FaultConfig = Callable[..., RunConfig]

#: Four calls an episode (three thinking calls, then the answer), as in the default job.
EPISODE = {"task": {"thinking_calls": 3, "reasoning_tokens": 4}}


def seals(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for event in events:
        if event["event"] == "sibling_sealed":
            found.append(event["seal"])
        elif event["event"] == "group_sealed":
            found.extend(event["seals"])
    return found


def assert_audited(out: Path) -> None:
    report = audit_run(out)
    assert report.ok, report.violations[:10]
    trail = check_trail(out)
    assert trail.ok, trail.violations[:10]


def in_run(out: Path, config: RunConfig, read_jsonl: ReadJsonl) -> list[dict[str, Any]]:
    result = run_job(out, config)
    assert result.summary.steps == config.job.steps
    assert_audited(out)
    return read_jsonl(out / "events.jsonl")


def test_a_worker_death_costs_only_the_calls_in_flight(
    tmp_path: Path, fault_config: FaultConfig, read_jsonl: ReadJsonl
) -> None:
    """Attempts lost mid-episode (their worker crashed, or they failed after a call) are
    continued by their siblings' next attempts from the last call they staged."""
    config = fault_config(
        {"attempt_failure_rate": 0.25, "worker_crash_rate": 0.05, "worker_restart_s": 0.01},
        EPISODE,
    )
    events = in_run(tmp_path / "run", config, read_jsonl)

    resumed = [e for e in events if e["event"] == "attempt_resumed" and e["from_rollout_id"]]
    assert resumed, "no lost attempt was continued"
    handed = {e["rollout_id"]: e for e in resumed}
    abandoned = {
        a["rollout_id"] for e in events if e["event"] == "attempts_abandoned" for a in e["attempts"]
    }
    for record in resumed:
        assert record["from_rollout_id"] in abandoned
        assert all(k.startswith(record["from_rollout_id"] + "/") for k in record["calls"])
    inheriting = [s for s in seals(events) if s["inherited_calls"]]
    assert inheriting, "no seal continued an earlier attempt's calls"
    for seal in inheriting:
        given = handed[seal["rollout_id"]]
        assert seal["inherited_calls"] == len(given["calls"])
        assert seal["inherited_tokens"] == given["tokens"]
        # The receipt covers every call of the episode, inherited and new, in its own name.
        manifest = seal["receipt"]["manifest"]
        if not seal["receipt"]["capture_poisoned"]:
            assert len(manifest) == 4
        assert all(c["staging_key"].startswith(seal["rollout_id"] + "/") for c in manifest)
        assert seal["weight_versions"][: len(given["calls"])] == given["weight_versions"]


def test_resume_attempt_starts_every_lost_attempt_over(
    tmp_path: Path, fault_config: FaultConfig, read_jsonl: ReadJsonl
) -> None:
    config = fault_config(
        {"attempt_failure_rate": 0.25}, {**EPISODE, "recovery": {"resume": "attempt"}}
    )
    events = in_run(tmp_path / "run", config, read_jsonl)
    assert any(e["event"] == "attempts_abandoned" for e in events)
    assert not [e for e in events if e["event"] == "attempt_resumed"]
    assert not [s for s in seals(events) if s["inherited_calls"]]


def _staged_by_attempt(out: Path) -> dict[str, list[str]]:
    with SqliteDataPlane(RunDirectory(out).data_plane_file) as store:
        keys = store.keys(CaptureWriter.staging_partition)
    found: dict[str, list[str]] = {}
    for key in keys:
        found.setdefault(key.partition("/")[0], []).append(key)
    return found


#: Slower calls and no faults: at the kill many attempts are mid-episode, and every
#: attempt the restore abandons was lost to the kill alone.
KILLED_JOB: dict[str, dict[str, Any]] = {
    **EPISODE,
    "job": {"steps": 6},
    "generation": {"call_latency_s": 0.01},
}


@pytest.mark.slow
@pytest.mark.parametrize("reuse", ["all", "none"])
def test_after_a_sigkill_the_restart_continues_every_interrupted_episode(
    tmp_path: Path,
    write_config: Callable[..., Path],
    run_cli: Cli,
    read_jsonl: ReadJsonl,
    reuse: str,
) -> None:
    out = tmp_path / "run"
    layers = {**KILLED_JOB, "recovery": {"reuse": reuse}}
    args = ["--out", str(out), "--config", str(write_config(layers, faults_off=True)), "--plain"]
    # The child kills itself right after its 70th staged call (bootstrap checkpoint taken).
    killed = run_cli(args, env={CRASH_AT_ENV: "capture.before_ack:70"})
    assert killed.returncode == -9, killed.stdout
    at_kill = _staged_by_attempt(out)

    final = run_cli(args)
    assert final.returncode == 0, final.stdout
    assert_audited(out)
    events = read_jsonl(out / "events.jsonl")
    (restored,) = [e for e in events if e["event"] == "restored"]
    after = events[events.index(restored) :]
    interrupted = {
        a["rollout_id"]: group["group_id"]
        for group in after
        if group["event"] == "attempts_abandoned"
        for a in group["attempts"]
        if a["reason"] == "restart"
    }
    granularity = {e["group_id"]: e["granularity"] for e in events if e["event"] == "prompt_taken"}
    sibling_attempts = {
        rollout
        for rollout, group_id in interrupted.items()
        if rollout in at_kill and granularity[group_id] == "sibling"
    }
    assert sibling_attempts, "the kill interrupted no sibling's episode mid-way"
    resumed = {
        e["from_rollout_id"]: e
        for e in after
        if e["event"] == "attempt_resumed" and e["from_rollout_id"]
    }
    if reuse == "none":
        # Nothing generated after the snapshot is reused: every staged call is regenerated.
        assert restored["calls_resumable"] == 0 and not resumed
        assert restored["tokens_in_flight_lost"] > 0
        return
    assert restored["calls_resumable"] > 0
    # Only prompt-group cohorts lose staged work; every sibling episode is continued.
    assert restored["tokens_in_flight_lost"] == restored["cohort_tokens_in_flight_lost"]
    # Every interrupted sibling episode is continued, from its last staged call: every
    # call it had staged at the kill.
    assert sibling_attempts <= set(resumed), sibling_attempts - set(resumed)
    continued = sorted(sibling_attempts)
    for rollout in continued:
        assert sorted(resumed[rollout]["calls"]) == sorted(at_kill[rollout])
    inheriting = {s["rollout_id"] for s in seals(after) if s["inherited_calls"]}
    assert {resumed[r]["rollout_id"] for r in continued} <= inheriting
