"""Resume after kill -9 to the first trained step: warm vLLM servers adopted vs a cold start.

Runs an example config (default ``examples/tiny-llama-vllm.toml``) with
``rollout-recovery run`` as a user does, in three phases:

1. a fresh run, SIGKILLed (the job's process only: its servers are in groups of their own)
   once ``metrics.jsonl`` has step ``--kill-after``, or with ``--kill-after-commit`` once
   ``events.jsonl`` has the ``checkpoint_committed`` record of a checkpoint at or past that
   step (so the reruns restore it and retrain nothing: the measure is the resume alone);
   its run directory is copied at once;
2. the rerun on that directory: it adopts the servers the killed job left (their lease,
   ``[vllm] adopt_within_s``) and trains to the end;
3. the rerun on the copy, with adoption off (``adopt_within_s = 0``): the servers it lists
   were ended by phase 2, so it cold-starts new ones (what every resume did before).

For each rerun: the seconds from its process's start to the ``time/wall`` of the first
step it wrote in ``metrics.jsonl`` (the first trained step; before issue 28's third
pass, the first line past the killed run's, which follows any step it trained again:
still reported), against one warm step (the median
``time/step_s`` of phase 1's steps after its first); and what it restored (its
``restored`` record: the checkpoint, its step, the steps it rolled back) and the first
step it wrote, so a resume that retrained steps shows it. ``--crash-during-adoption`` adds a
kill -9 of phase 2 at the ``adopt.before_handover`` crash point (between the proof and the
hand-over) before it reruns, and every finished run is audited (``rollout-recovery
audit``). Afterwards no server of the benchmark may be left: it checks.

``--standby`` runs the first job with a warm standby (``[job] standby_within_s``) and adds
a phase before 2: the rerun runs in the standby (its imports done before the crash),
adopts the servers and is SIGKILLed once it has written a step (the servers and the
standby stay on their leases); phase 2 then runs with an environment variable the standby
was not started with (``BENCH_COLD_INTERPRETER``), so it does not use it (and the standby
ends) and imports everything itself, adopting the same servers: with and without the
standby, the same servers, one sitting. Run::

    flock /work/heavy.lock python benchmarks/bench_resume_adopt.py [--config FILE]
        [--steps 9] [--kill-after 5] [--kill-after-commit] [--crash-during-adoption]
        [--standby] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-llama-vllm.toml"
# How long a phase may take before the benchmark gives up (a cold vLLM start on 2 busy
# cores takes minutes).
PHASE_DEADLINE_S = 1200.0


def _override(text: str, section: str, key: str, value: str) -> str:
    """``text`` (TOML) with ``key = value`` in ``[section]``, replaced or added."""
    header = f"[{section}]\n"
    start = text.index(header) + len(header)
    following = re.search(r"^\[", text[start:], flags=re.MULTILINE)
    end = start + following.start() if following else len(text)
    body, pattern = text[start:end], re.compile(rf"^{re.escape(key)} = .*$", re.MULTILINE)
    body = (
        pattern.sub(f"{key} = {value}", body)
        if pattern.search(body)
        else f"{key} = {value}\n{body}"
    )
    return text[:start] + body + text[end:]


def _config(
    source: Path, target: Path, *, steps: int, adopt_within_s: float, standby_within_s: float = 0.0
) -> Path:
    text = _override(source.read_text(), "job", "steps", str(steps))
    text = _override(text, "job", "standby_within_s", repr(standby_within_s))
    target.write_text(_override(text, "vllm", "adopt_within_s", repr(adopt_within_s)))
    return target


def _steps(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    complete = lines if path.read_text().endswith("\n") else lines[:-1]
    return [record for record in map(json.loads, complete) if "time/wall" in record]


def committed_steps(out: Path) -> list[int]:
    """The steps of the ``checkpoint_committed`` records in ``out``'s journal (whole lines
    only: the job may be writing the next)."""
    try:
        text = (out / "events.jsonl").read_text()
    except OSError:
        return []
    records = map(json.loads, text.splitlines()[: text.count("\n")])
    return [r["step"] for r in records if r.get("event") == "checkpoint_committed"]


def restored_since(out: Path, offset: int) -> dict[str, Any] | None:
    """What the rerun that began appending to ``out``'s journal at byte ``offset``
    restored: its ``restored`` record's checkpoint, step and rolled-back steps (None: it
    restored nothing)."""
    with open(out / "events.jsonl", "rb") as journal:
        journal.seek(offset)
        tail = journal.read().decode()
    for line in tail.splitlines()[: tail.count("\n")]:
        record = json.loads(line)
        if record.get("event") == "restored":
            return {
                "checkpoint": record["checkpoint"],
                "step": record["step"],
                "rolled_back_steps": record["rolled_back_steps"],
            }
    return None


def _run(
    config: Path, out: Path, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as handle:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rollout_recovery",
                "run",
                "--plain",
                "--config",
                str(config),
                "--out",
                str(out),
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
        )


def _wait_for_step(
    job: subprocess.Popen[bytes], out: Path, count: int, *, committed: bool = False
) -> None:
    """Until ``out`` has step ``count`` (``committed``: a checkpoint of it committed)."""
    deadline = time.monotonic() + PHASE_DEADLINE_S
    while not (
        max(committed_steps(out), default=-1) >= count if committed else len(_steps(out)) >= count
    ):
        if job.poll() is not None:
            raise SystemExit(f"the job in {out} exited with {job.returncode} before step {count}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no step {count} in {out} after {PHASE_DEADLINE_S} s")
        time.sleep(0.01 if committed else 0.1)


def first_written(steps: list[dict[str, Any]], started: float) -> dict[str, Any]:
    """The first step in ``steps`` (``metrics.jsonl``) written after ``started``: the
    first step a rerun trained. Not the first line past the killed run's: a rerun cuts
    ``metrics.jsonl`` back to its checkpoint, so a step it trains again (rolled back)
    takes an earlier line, and the line after the killed run's is a later step."""
    return next(step for step in steps if float(step["time/wall"]) > started)


def _rerun(
    config: Path,
    out: Path,
    log: Path,
    *,
    env: dict[str, str] | None = None,
    kill_after_first: bool = False,
) -> tuple[float, dict[str, Any]]:
    """Rerun to the end (``kill_after_first``: SIGKILL it once it has written a step);
    the seconds from its start to the first step it trained, and
    that step's own ``time/*`` parts (its period starts when the controller starts: the
    rest is the process's start, the restore and the servers), with its number, what
    the rerun restored, and (the old measure) the seconds to the first step past the
    killed run's."""
    before = len(_steps(out))
    offset = (out / "events.jsonl").stat().st_size
    started = time.time()
    job = _run(config, out, log, env=env)
    if kill_after_first:
        deadline = time.monotonic() + PHASE_DEADLINE_S
        while not any(float(s["time/wall"]) > started for s in _steps(out)):
            if job.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the rerun in {out} wrote no step (see {log})")
            time.sleep(0.01)
        job.send_signal(signal.SIGKILL)
        job.wait()
    else:
        code = job.wait(timeout=PHASE_DEADLINE_S)
        if code != 0:
            raise SystemExit(f"the rerun in {out} exited with {code} (see {log})")
    steps = _steps(out)
    first = first_written(steps, started)
    parts: dict[str, Any] = {
        name.removeprefix("time/"): round(float(value), 3)
        for name, value in first.items()
        if name.startswith("time/") and name != "time/wall"
    }
    parts["step"] = first["step"]
    parts["restored"] = restored_since(out, offset)
    if len(steps) > before:
        past = steps[before]
        parts["first_step_past_the_killed_runs"] = past["step"]
        parts["to_it_s"] = round(float(past["time/wall"]) - started, 1)
    return float(first["time/wall"]) - started, parts


def _audit(out: Path) -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "rollout_recovery", "audit", str(out)], capture_output=True
    )
    return done.returncode == 0


def _guards(out: Path) -> set[int]:
    """The guards (process groups) of the servers ``out``'s ``servers.json`` lists."""
    try:
        listing = json.loads((out / "servers.json").read_text())["servers"]
    except OSError:
        return set()
    return {int(server["pid"]) for server in listing}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _servers_left(guards: set[int]) -> list[int]:
    """The guards of ``guards`` still alive a little after the last job ended (each
    ends its group before it exits)."""
    deadline = time.monotonic() + 60.0
    while any(map(_alive, guards)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return sorted(filter(_alive, guards))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=EXAMPLE)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--kill-after", type=int, default=5)
    parser.add_argument(
        "--kill-after-commit",
        action="store_true",
        help="kill once a checkpoint at or past --kill-after has committed (not at a step)",
    )
    parser.add_argument("--crash-during-adoption", action="store_true")
    parser.add_argument(
        "--standby",
        action="store_true",
        help="a warm standby in the first job; the rerun measured in it and without it",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-resume-adopt-"))
    guards: set[int] = set()
    try:
        result = _measure(root, args, guards)
    except SystemExit:
        for log in sorted(root.glob("log*.txt")):  # why, before the directory goes
            print(f"--- the end of {log.name}:", *log.read_text().splitlines()[-40:], sep="\n")
        raise
    finally:
        left = _servers_left(guards)
        shutil.rmtree(root, ignore_errors=True)
    result["servers_left"] = len(left)
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if left:
        raise SystemExit(f"servers left running: {left}")


def _measure(root: Path, args: argparse.Namespace, guards: set[int]) -> dict[str, Any]:
    standby_s = 300.0 if args.standby else 0.0
    first_config = _config(
        args.config,
        root / "first.toml",
        steps=args.steps,
        adopt_within_s=300.0,
        standby_within_s=standby_s,
    )
    adopting = _config(args.config, root / "adopt.toml", steps=args.steps, adopt_within_s=300.0)
    cold = _config(args.config, root / "cold.toml", steps=args.steps, adopt_within_s=0.0)
    out, copy, log = root / "run", root / "run-cold", root / "log.txt"
    started = time.monotonic()
    job = _run(first_config, out, log)
    _wait_for_step(job, out, args.kill_after, committed=args.kill_after_commit)
    guards |= _guards(out)
    job.send_signal(signal.SIGKILL)
    job.wait()
    shutil.copytree(out, copy)
    first_run = _steps(out)
    warm = statistics.median(float(s["time/step_s"]) for s in first_run[1:])
    result: dict[str, Any] = {
        "config": str(args.config),
        "killed_after_step": len(first_run),
        "newest_committed_checkpoint_at_kill": max(committed_steps(out), default=None),
        "first_run_s": round(time.monotonic() - started, 1),
        "warm_step_s": round(warm, 3),
    }
    if args.crash_during_adoption:
        env = {**os.environ, "ROLLOUT_RECOVERY_CRASH_AT": "adopt.before_handover"}
        crashed = _run(adopting, out, log, env=env)
        result["crash_during_adoption_exit"] = crashed.wait(timeout=PHASE_DEADLINE_S)
    without_standby = None
    if args.standby:
        in_standby, result["standby_first_step"] = _rerun(
            first_config, out, log, kill_after_first=True
        )
        guards |= _guards(out)
        result["standby_resume_to_first_step_s"] = round(in_standby, 1)
        result["standby_over_warm_step"] = round(in_standby / warm, 2)
        result["standby_log"] = [
            line for line in log.read_text().splitlines() if "warm standby" in line
        ]
        # Not the standby's environment: this rerun imports everything itself.
        without_standby = {**os.environ, "BENCH_COLD_INTERPRETER": "1"}
    adopted, result["adopted_first_step"] = _rerun(adopting, out, log, env=without_standby)
    guards |= _guards(out)
    result["adopted_resume_to_first_step_s"] = round(adopted, 1)
    result["adopted_audit_ok"] = _audit(out)
    result["adopted_log"] = [
        line for line in log.read_text().splitlines() if "adopted from the job before" in line
    ]
    coldly, result["cold_first_step"] = _rerun(cold, copy, root / "log-cold.txt")
    guards |= _guards(copy)
    result["cold_resume_to_first_step_s"] = round(coldly, 1)
    result["cold_audit_ok"] = _audit(copy)
    result["adopted_over_warm_step"] = round(adopted / warm, 2)
    result["cold_over_warm_step"] = round(coldly / warm, 2)
    return result


if __name__ == "__main__":
    main()
