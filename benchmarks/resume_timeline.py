"""Where a resume's time goes: the phases of one ``rollout-recovery run`` up to its first step.

Runs the command line in this process (``python benchmarks/resume_timeline.py run --plain
--config FILE --out DIR``, the arguments of ``rollout-recovery``) with a wall-clock stamp at
the entry and exit of the functions that make up a start (imports, the model's digest, the
lock and the checks, the servers' adoption, the trainer's build, the checkpoint's read and
verification, the restore, the push of the restored weights, each step's generation and
training). Once ``metrics.jsonl`` has a step written by this process it prints the
timeline on stderr (seconds from the process's start, in the order the phases began; a
phase in another thread, the checkpoint's read-ahead, named with it) and ends itself with
SIGKILL, as a crash would: launched vLLM servers stay on their lease for the next rerun to
adopt, so one killed run directory can be measured again and again without a new server
start. Run it on a directory a killed job left, under ``flock /work/heavy.lock`` when it
has servers.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import inspect
import json
import os
import runpy
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

#: The functions stamped, by module: each is wrapped once its module has been imported,
#: so the imports themselves are timed as they happen.
STAMPED: dict[str, list[str]] = {
    "rollout_recovery.job._run_job": ["run_job", "_open_job", "_run_installed"],
    "rollout_recovery.job._llm_parts": ["resolve_model"],
    "rollout_recovery.vllm._fleet": ["VllmFleet.start"],
    "rollout_recovery.control._backends": ["Backend.build"],
    "rollout_recovery.llm._trainer": ["TorchGRPOTrainer.__init__", "TorchGRPOTrainer.train_step"],
    "rollout_recovery.rundir._checkpoint_store": ["CheckpointStore.load"],
    "rollout_recovery.control._checkpointing": [
        "ControllerCheckpoints.newest_restorable",
        "ControllerCheckpoints.restore",
    ],
    "rollout_recovery.control._controller": [
        "Controller.restore",
        "Controller.run",
        "Controller._generate",
        "Controller._train_step",
    ],
    "rollout_recovery.vllm._sync": ["VllmWeightSync.push"],
}

_events: list[tuple[float, str, str, str]] = []  # (time, "enter"/"exit", name, thread)


def _process_start() -> float:
    """This process's start (wall clock, to a clock tick), from /proc: the interpreter's own
    start counted. Its start time there counts from the boot, as CLOCK_BOOTTIME does."""
    ticks = os.sysconf("SC_CLK_TCK")
    since_boot = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def _stamped(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def note(kind: str) -> None:
        _events.append((time.time(), kind, name, threading.current_thread().name))

    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def coroutine(*args: Any, **kwargs: Any) -> Any:
            note("enter")
            try:
                return await function(*args, **kwargs)
            finally:
                note("exit")

        return coroutine

    @functools.wraps(function)
    def plain(*args: Any, **kwargs: Any) -> Any:
        note("enter")
        try:
            return function(*args, **kwargs)
        finally:
            note("exit")

    return plain


def _stamp(module: ModuleType, attributes: Sequence[str]) -> None:
    for dotted in attributes:
        owner: Any = module
        *path, leaf = dotted.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, leaf, _stamped(dotted, getattr(owner, leaf)))


class _StampOnImport(importlib.abc.MetaPathFinder):
    """Wraps :data:`STAMPED`'s functions right after their module is executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if name not in STAMPED:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _stamp(module, STAMPED[name])

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _trained_since(metrics: Path, start: float) -> dict[str, Any] | None:
    """The first step in ``metrics`` this process wrote (its ``time/wall`` after ``start``)."""
    try:
        text = metrics.read_text()
    except OSError:
        return None
    for line in text.splitlines()[: text.count("\n")]:
        record = json.loads(line)
        if "time/wall" in record and record["time/wall"] > start:
            return dict(record)
    return None


def _report(start: float, first: dict[str, Any]) -> None:
    """Every stamped call that began before the first step was written, in the order
    they began: when (seconds from the process's start) and for how long."""
    wall = float(first["time/wall"])
    entered: dict[tuple[str, str], list[float]] = {}
    rows: list[tuple[float, str]] = []
    for when, kind, name, thread in list(_events):
        if kind == "enter":
            entered.setdefault((name, thread), []).append(when)
            continue
        began = entered[(name, thread)].pop()
        where = "" if thread == "MainThread" else f"  [{thread}]"
        rows.append((began, f"{when - began:7.3f}  {name}{where}"))
    for (name, thread), opened in entered.items():
        where = "" if thread == "MainThread" else f"  [{thread}]"
        rows += [(began, f"{'open':>7}  {name}{where}") for began in opened]
    rows.append((wall, f"{'':>7}  the first step is written (its time/wall)"))
    print(f"{'s from start':>12}  {'took s':>7}  phase", file=sys.stderr)
    for began, text in sorted(rows):
        if began <= wall:
            print(f"{began - start:12.3f}  {text}", file=sys.stderr)
    parts = {k: v for k, v in first.items() if k.startswith("time/") and k != "time/wall"}
    print("its time/* fields:", json.dumps(parts), file=sys.stderr)


def _report_restored(out: Path, first: dict[str, Any]) -> None:
    """What this process restored (the journal's last ``restored`` record: this process
    wrote it before its first step) and the step it wrote: a rolled-back step is
    trained again, inside the measure."""
    text = (out / "events.jsonl").read_text()
    restored = [
        record
        for record in map(json.loads, text.splitlines()[: text.count("\n")])
        if record.get("event") == "restored"
    ]
    if restored:
        last = restored[-1]
        print(
            f"restored {last['checkpoint']} (step {last['step']}, rolled back "
            f"{last['rolled_back_steps']}); first step written: {first.get('step')}",
            file=sys.stderr,
        )


def main() -> None:
    start = _process_start()
    if "--out" not in sys.argv[1:-1] or {"-h", "--help"} & set(sys.argv[1:]):
        # The arguments are rollout-recovery's own; this script needs only --out's value.
        print(
            "usage: resume_timeline.py run [--plain] --config FILE --out DIR\n\n"
            + (__doc__ or "").split("\n\n")[0]
        )
        sys.exit(0 if {"-h", "--help"} & set(sys.argv[1:]) else 2)
    out = Path(sys.argv[sys.argv.index("--out") + 1])

    def watch() -> None:
        while (first := _trained_since(out / "metrics.jsonl", start)) is None:
            time.sleep(0.01)
        _report(start, first)
        _report_restored(out, first)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    sys.meta_path.insert(0, _StampOnImport())
    threading.Thread(target=watch, name="timeline", daemon=True).start()
    sys.argv = ["rollout_recovery", *sys.argv[1:]]
    runpy.run_module("rollout_recovery", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
