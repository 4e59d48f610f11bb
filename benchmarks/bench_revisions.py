"""Two revisions of this repository side by side: did a refactor cost speed?

Checks out ``--before`` (default: the commit before the redesign of issue 16) into a
temporary git worktree and runs each measurement on both trees, interleaved (before,
after, before, after, ...), each tree's own code on ``PYTHONPATH`` and each tree's own
benchmark script, so a slow minute of a shared machine hits both columns alike. The
ratio after / before of the medians is what to read; single runs move with the machine's
load (``--json`` keeps every run's value as well, to see the spread).

Measurements (``--only`` picks some):

- ``ledger``: ``bench_ledger.py`` (5,000 groups x 16 siblings): ``state_dict``, a restore
  (``from_state_dict`` + rebinding every prompt), sidecar build + parse.
- ``job``: the default job (``rollout-recovery run``, fresh, 100 steps), steps per second.
  The default job of the two trees need not be the same job: compare ``job`` against the
  job each tree ships, and ``job-same`` for the same job.
- ``job-same``: the after tree's job shaped like ``e894b17``'s default (``[task]
  thinking_calls = 1``: two calls an episode; ``[generation] call_latency_s = 0.08``);
  the before tree runs its default.
- ``http``: ``bench_generation.py`` (the simulated backend and two local ``serve``
  processes), attempts per second of each backend.
- ``ray`` (not in the default set: it needs the ``[ray]`` extra): ``bench_ray.py``, each
  tree's own local Ray cluster (``num_cpus=2``), attempts per second and staged MB/s of
  the Ray backend and of the embedded one, the longest checkpoint hold of a 20-step job
  with each, the controller's cost per seal, ``ray/embedded`` (each tree's Ray backend
  against its own embedded one in the same run) and ``seconds`` (one run's wall time).

Every command runs in a session of its own; whatever it leaves running when it ends (a
local Ray cluster's processes) is killed. Each measurement's wall time goes to stderr.

Run: ``python benchmarks/bench_revisions.py [--before REV] [--repeat 2] [--only ledger,job]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The last commit before the rooms were redesigned (issue 16) and the journal added.
DEFAULT_BEFORE = "e894b17"
# The after tree's job shaped like e894b17's default job.
SAME_JOB = "[task]\nthinking_calls = 1\n[generation]\ncall_latency_s = 0.08\n"


def _run(
    tree: Path, command: list[str], *, env: dict[str, str] | None = None, timeout: float = 1800
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), **(env or {})}
    # Output to files, not pipes: a process left behind holding a pipe would block the read.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(
            command, cwd=tree, env=env, stdout=out, stderr=err, text=True, start_new_session=True
        )
        try:
            returncode = child.wait(timeout=timeout)
        finally:
            _end_session(child.pid)
            child.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, returncode, out.read(), err.read())


def _end_session(session: int) -> None:
    """Kill every process left in ``session`` (the command's own: Ray workers run in
    process groups of their own, but stay in the session of the driver that started them)."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # it ended while we looked
            continue
        # After the command's name: state, ppid, pgrp, session.
        pid = int(stat.parent.name)
        if int(fields[3]) == session and pid != session:
            left.append(pid)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        print(f"killed {len(left)} processes left behind by the run", file=sys.stderr, flush=True)


def _ledger(tree: Path, scratch: Path) -> dict[str, float]:
    out = scratch / f"ledger-{tree.name}.json"
    done = _run(
        tree, [sys.executable, "benchmarks/bench_ledger.py", "--repeat", "3", "--json", str(out)]
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench_ledger failed in {tree}: {done.stderr[-2000:]}")
    data = json.loads(out.read_text())
    return _numbers(data)


def _numbers(data: Any, prefix: str = "") -> dict[str, float]:
    """Every number of a nested JSON document, by its dotted path."""
    found: dict[str, float] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            found.update(_numbers(value, f"{prefix}{key}."))
    elif isinstance(data, int | float) and not isinstance(data, bool):
        found[prefix.rstrip(".")] = float(data)
    return found


def _job(tree: Path, scratch: Path, config: str | None) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(dir=scratch)) / "run"
    command = [sys.executable, "-m", "rollout_recovery", "run", "--out", str(out), "--plain"]
    if config is not None:
        path = out.parent / "job.toml"
        path.write_text(config)
        command += ["--config", str(path)]
    started = time.monotonic()
    done = _run(tree, command)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"the job failed in {tree}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return {"steps_per_second": 100 / seconds, "seconds": seconds}


def _http(tree: Path, scratch: Path) -> dict[str, float]:
    out = scratch / f"generation-{tree.name}.json"
    done = _run(tree, [sys.executable, "benchmarks/bench_generation.py", "--json", str(out)])
    if done.returncode != 0:
        raise RuntimeError(f"bench_generation failed in {tree}: {done.stderr[-2000:]}")
    # One row per backend and store.
    rows = json.loads(out.read_text())
    return _numbers({f"{row['backend']} {row['store']}": row for row in rows})


def _ray(tree: Path, scratch: Path) -> dict[str, float]:
    out = scratch / f"ray-{tree.name}.json"
    started = time.monotonic()
    # RAY_ADDRESS=local: always a fresh cluster of the run's own, never one found running.
    done = _run(
        tree,
        [sys.executable, "benchmarks/bench_ray.py", "--json", str(out)],
        env={"RAY_ADDRESS": "local"},
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(
            f"bench_ray failed in {tree}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    data = json.loads(out.read_text())
    numbers = _numbers(data)
    for what in ("attempts/s", "staged MB/s", "longest hold ms"):
        numbers[f"ray/embedded {what}"] = data[f"ray {what}"] / data[f"embedded {what}"]
    numbers["seconds"] = seconds
    return numbers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=DEFAULT_BEFORE)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", default="ledger,job,job-same,http")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    wanted = args.only.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        before = scratch / "before"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(before), args.before],
            check=True,
        )
        try:
            after = REPO
            measures: dict[str, Callable[[Path], dict[str, float]]] = {
                "ledger": lambda tree: _ledger(tree, scratch),
                "job": lambda tree: _job(tree, scratch, None),
                "job-same": lambda tree: _job(tree, scratch, None if tree == before else SAME_JOB),
                "http": lambda tree: _http(tree, scratch),
                "ray": lambda tree: _ray(tree, scratch),
            }
            results: dict[str, dict[str, dict[str, list[float]]]] = {}
            seconds: dict[str, float] = {}
            for name in wanted:
                started = time.monotonic()
                results[name] = {"before": {}, "after": {}}
                for _ in range(args.repeat):
                    for label, tree in (("before", before), ("after", after)):
                        for key, value in measures[name](tree).items():
                            results[name][label].setdefault(key, []).append(value)
                        print(f"{name} {label}: done", file=sys.stderr, flush=True)
                seconds[name] = time.monotonic() - started
                print(f"{name}: {seconds[name]:.0f} s in all", file=sys.stderr, flush=True)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], check=False
            )
    table: dict[str, dict[str, Any]] = {}
    print(f"{'measurement':<58}{'before':>12}{'after':>12}{'after/before':>14}")
    for name, sides in results.items():
        for key in sorted(set(sides["before"]) & set(sides["after"])):
            b = statistics.median(sides["before"][key])
            a = statistics.median(sides["after"][key])
            ratio = a / b if b else float("nan")
            table[f"{name}.{key}"] = {
                "before": b,
                "after": a,
                "ratio": ratio,
                # Every run's value, in run order: the spread is the noise to read against.
                "before_runs": sides["before"][key],
                "after_runs": sides["after"][key],
            }
            print(f"{name + '.' + key:<58}{b:>12.4g}{a:>12.4g}{ratio:>14.3f}")
    if args.json:
        args.json.write_text(
            json.dumps({"before": args.before, "results": table, "seconds": seconds}, indent=2)
        )


if __name__ == "__main__":
    main()
