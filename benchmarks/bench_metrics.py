"""What each metrics sink costs (issue 19): import, open, reopen after a restart, per step.

1. Import: a fresh interpreter importing what the sink imports (median of ``--repeat``).
2. Open: ``MetricsConfig.open`` of that one sink in a new run directory; reopen: a second
   session at resume step ``--steps // 2`` after a first that logged ``--steps`` steps
   (W&B reads the first session's file back there).
3. Per step, with ``--keys`` scalars a step (the main job logs about 10; a 3-server HTTP
   job about 40): what ``log_step`` costs the caller (the train loop), and what the sink
   itself spends on a step (the W&B and MLflow sinks run on a worker thread, so the
   caller pays only a queue put; this column is their worker's time, measured on the
   sink without the thread).
4. Flush: one ``flush()`` after a step (a checkpoint's).

Last row: every installed sink at once (import and own cost left at 0).

Run: ``python benchmarks/bench_metrics.py [--steps 200] [--keys 20] [--repeat 5]
[--json out.json]``. Sinks whose extra is missing are skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rollout_recovery.metrics import MetricsConfig

_IMPORTS = {
    "jsonl": "import msgspec",
    "tensorboard": (
        "import tensorboard.compat.proto.event_pb2, tensorboard.plugins.text.metadata, "
        "tensorboard.summary.writer.event_file_writer"
    ),
    "wandb": "import wandb",
    "mlflow": "import mlflow.tracking, mlflow.entities",
}
_MODULE = {"jsonl": "msgspec", "tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def _import_seconds(sink: str, repeat: int) -> float:
    code = f"import time; t = time.perf_counter(); {_IMPORTS[sink]}; print(time.perf_counter() - t)"
    env = {"MLFLOW_ALLOW_FILE_STORE": "true", "PATH": "/usr/bin:/bin"}
    runs = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
            ).stdout
        )
        for _ in range(repeat)
    ]
    return statistics.median(runs)


def _values(step: int, keys: int) -> dict[str, float]:
    return {f"train/k{k}": step + k / 10 for k in range(keys)}


def _per_step(metrics: Any, steps: range, keys: int) -> tuple[float, float]:
    """Median caller seconds per log_step, and the CPU seconds per step of the process."""
    times = []
    cpu = time.process_time()
    for step in steps:
        values = _values(step, keys)
        started = time.perf_counter()
        metrics.log_step(step, values)
        times.append(time.perf_counter() - started)
    metrics.flush()
    return statistics.median(times), (time.process_time() - cpu) / len(steps)


def _sink_own_cost(sink: str, root: Path, steps: int, keys: int) -> float:
    """Median seconds the sink itself spends on one step (no worker thread)."""
    metrics = MetricsConfig(sinks=(sink,)).open(root, resume_step=0)
    inner = metrics.sink(sink)
    inner = getattr(inner, "sink", inner)  # unwrap BackgroundSink
    times = []
    for step in range(steps):
        values = _values(step, keys)
        started = time.perf_counter()
        inner.log_step(step, values)
        times.append(time.perf_counter() - started)
    metrics.close()
    return statistics.median(times)


def bench(sinks: tuple[Any, ...], args: argparse.Namespace) -> dict[str, float]:
    config = MetricsConfig(sinks=sinks)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        first, second, own = root / "a", root / "b", root / "c"
        for directory in (first, second, own):
            directory.mkdir()
        started = time.perf_counter()
        metrics = config.open(first, resume_step=0)
        open_s = time.perf_counter() - started
        caller_s, cpu_s = _per_step(metrics, range(args.steps), args.keys)
        flush_times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            metrics.flush()
            flush_times.append(time.perf_counter() - started)
        metrics.close()
        resume = args.steps // 2
        started = time.perf_counter()
        reopened = config.open(first, resume_step=resume)
        reopen_s = time.perf_counter() - started
        reopened.log_step(resume, _values(resume, args.keys))
        reopened.close()
        own_s = _sink_own_cost(sinks[0], own, args.steps, args.keys) if len(sinks) == 1 else 0
    return {
        "import_s": _import_seconds(sinks[0], args.repeat) if len(sinks) == 1 else 0,
        "open_s": open_s,
        "reopen_s": reopen_s,
        "log_step_caller_us": caller_s * 1e6,
        "process_cpu_per_step_us": cpu_s * 1e6,
        "sink_own_per_step_us": own_s * 1e6,
        "flush_ms": statistics.median(flush_times) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    for sink, module in _MODULE.items():
        if importlib.util.find_spec(module) is None:
            print(f"{sink}: skipped ({module} is not installed)")
            continue
        results[sink] = bench((sink,), args)
    # All of them at once: what the train loop pays with every sink on.
    results["all"] = bench(tuple(results), args)
    columns = list(next(iter(results.values())))
    print(f"{'sink':<12}" + "".join(f"{c:>26}" for c in columns))
    for sink, row in results.items():
        print(f"{sink:<12}" + "".join(f"{row[c]:>26.4g}" for c in columns))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
