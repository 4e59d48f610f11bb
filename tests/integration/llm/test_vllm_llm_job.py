"""The LLM job against real vLLM servers it launches (``bash .ci/vllm-integration``).

The torch trainer on the tiny Llama learns "emit token X" from samples vLLM generates,
every new version loaded into the server after its step (``vllm_llm_job.py``: the job
built from its config alone, ``[generation] backend = "http"`` with ``[http] weight_sync
= "vllm"``). The job is
SIGKILLed after a checkpoint: its servers outlive it on their lease (``[vllm]
adopt_within_s``), the rerun adopts them (the same guards, none started), loads the
restored weights into them before anything is sent, and finishes, ending them; the audit
passes and the reward rose from the first tenth to the last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rollout_recovery._crashpoints import CRASH_AT_ENV
from rollout_recovery.history import audit_run
from rollout_recovery.history._trail_reader import read_records
from rollout_recovery.history.records import (
    BackendEvent,
    GroupSealed,
    Restored,
    SiblingSealed,
    StepTrained,
)
from rollout_recovery.vllm._sync import SHARED_MEMORY, run_key

pytestmark = pytest.mark.vllm

JOB_SCRIPT = Path(__file__).with_name("vllm_llm_job.py")
#: Two server starts (a minute or two each on 2 busy cores) and 30 short steps.
CHILD_TIMEOUT_S = 1200.0
#: How long the killed job's servers may take to notice and shut down.
SERVERS_GONE_S = 120.0
STEPS = 30


def _run_child(
    args: list[str],
    *,
    kill_when: Callable[[str], bool] | None = None,
    crash_at: str | None = None,
) -> tuple[int, list[str]]:
    """The job script in its own process group; SIGKILL the group at the first line for
    which ``kill_when`` holds, or the job at crash point ``crash_at`` (``name:N``). A
    watchdog bounds its lifetime."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    if crash_at is not None:
        env[CRASH_AT_ENV] = crash_at
    child = subprocess.Popen(
        [sys.executable, str(JOB_SCRIPT), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    watchdog = threading.Timer(CHILD_TIMEOUT_S, lambda: os.killpg(child.pid, signal.SIGKILL))
    watchdog.start()
    lines: list[str] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.rstrip("\n"))
            if kill_when is not None and kill_when(line):
                os.killpg(child.pid, signal.SIGKILL)
                break
        return child.wait(), lines
    finally:
        watchdog.cancel()
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _guards(run: Path) -> list[int]:
    return [int(s["pid"]) for s in json.loads((run / "servers.json").read_text())["servers"]]


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process of group ``pgid`` is left."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _wait_gone(groups: list[int]) -> None:
    # Bounded polling of the OS's process table: another process's exit has no event here.
    deadline = time.monotonic() + SERVERS_GONE_S
    while any(_group_alive(pgid) for pgid in groups):
        assert time.monotonic() < deadline, f"server groups {groups} still alive"
        time.sleep(0.5)


def _seal_versions(record: object) -> list[int]:
    """The weight versions of the calls a seal record's attempts made."""
    if isinstance(record, SiblingSealed):
        return list(record.seal.weight_versions)
    if isinstance(record, GroupSealed):
        return [v for seal in record.seals for v in seal.weight_versions]
    return []


def _around_restore(run: Path) -> tuple[int, set[int], list[object]]:
    """The restored weight version, the versions the restore lost (trained after the
    snapshot), and the records journaled after the restore."""
    records = [record for _, record in read_records(run / "events.jsonl")]
    at = max(i for i, r in enumerate(records) if isinstance(r, Restored))
    restored = records[at]
    assert isinstance(restored, Restored)
    before = [r for r in records[:at] if isinstance(r, StepTrained)]
    kept = [r.weight_version for r in before if r.step == restored.step - 1]
    version = kept[-1] if kept else 0
    lost = {r.weight_version for r in before if r.weight_version > version}
    return version, lost, records[at + 1 :]


def test_the_llm_job_learns_on_vllm_servers_it_launches_and_survives_a_sigkill(
    vllm_python: str, vllm_model_dir: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    args = [
        str(run),
        "--vllm-python",
        vllm_python,
        "--model",
        str(vllm_model_dir),
        "--steps",
        str(STEPS),
    ]

    def three_steps_after_the_step_10_checkpoint(line: str) -> bool:
        # "step S reward R checkpoints C" after S steps; checkpoints every 5 steps, so at
        # S = 13 the newest holds step 10 and three trained steps are lost with the kill.
        parts = line.split()
        return len(parts) == 6 and parts[0] == "step" and int(parts[1]) >= 13

    code, lines = _run_child(args, kill_when=three_steps_after_the_step_10_checkpoint)
    assert code == -signal.SIGKILL, lines[-20:]
    killed = _guards(run)
    assert all(_group_alive(pgid) for pgid in killed)  # warm, on their lease

    code, lines = _run_child(args)
    assert code == 0, lines[-30:]
    assert _guards(run) == killed  # adopted: not one server started again
    assert any(line.startswith("resumed from") for line in lines), lines[:20]
    done = next(line for line in lines if line.startswith("done "))
    fields = dict(part.split("=") for part in done.split()[1:])
    assert int(fields["steps"]) == STEPS
    first, last = float(fields["first"]), float(fields["last"])
    assert first < 0.2 and last > 0.5 and last > first + 0.3, done
    _wait_gone(_guards(run))  # and the rerun's servers ended with the job

    report = audit_run(run)
    assert report.ok, report.violations[:10]
    assert report.complete

    # The weight files lived in shared memory, never in the run directory; the killed
    # job's were found by the rerun (same run) and removed with its own at its end.
    assert not (run / "servers" / "weights").exists()
    assert not (SHARED_MEMORY / f"rollout-recovery-{os.getuid()}" / run_key(run)).exists()

    # The adopted server was brought to the restored weights before anything was
    # sent: its first load after the restore is the restored version, every call after the
    # restore was generated by the restored weights or later ones, never by weights the
    # restore lost, and the calls before the first step trained after it by the restored.
    version, lost, after = _around_restore(run)
    assert lost  # the kill came after steps the checkpoint did not hold
    loads = [r for r in after if isinstance(r, BackendEvent) and r.kind == "weights_loaded"]
    assert loads and loads[0].detail["version"] == version
    generated = [v for r in after for v in _seal_versions(r)]
    assert generated and not set(generated) & lost and min(generated) >= version
    first_step = next(i for i, r in enumerate(after) if isinstance(r, StepTrained))
    assert {v for r in after[:first_step] for v in _seal_versions(r)} <= {version}

    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(STEPS))
    assert all(m["train/skipped"] == 0.0 for m in metrics)


def test_a_job_killed_in_the_middle_of_a_weight_push_resumes_and_the_audit_passes(
    vllm_python: str, vllm_model_dir: Path, tmp_path: Path
) -> None:
    """Issue 28: SIGKILL while a launched server holds a pushed version it is not yet
    named by (paused, "loading"), the 12th push (after step 10's checkpoint): the server
    stays warm on its lease, paused and naming no version; the rerun adopts it, loads the
    restored weights (and resumes it), finishes, and the audit passes; no weights file is
    left in the run or in shared memory."""
    run = tmp_path / "run"
    args = [str(run), "--vllm-python", vllm_python, "--model", str(vllm_model_dir)]
    args += ["--steps", "14"]
    code, lines = _run_child(args, crash_at="vllm.push_loaded:12")
    assert code == -signal.SIGKILL, lines[-20:]
    assert any("crash point vllm.push_loaded fired" in line for line in lines), lines[-20:]
    killed = _guards(run)
    assert all(_group_alive(pgid) for pgid in killed)  # warm, paused mid-push

    code, lines = _run_child(args)
    assert code == 0, lines[-30:]
    assert _guards(run) == killed  # adopted, not started again
    assert any(line.startswith("resumed from") for line in lines), lines[:20]
    _wait_gone(_guards(run))
    report = audit_run(run)
    assert report.ok, report.violations[:10]
    assert report.complete
    assert not (run / "servers" / "weights").exists()
    assert not (SHARED_MEMORY / f"rollout-recovery-{os.getuid()}" / run_key(run)).exists()
