"""The LLM job on real vLLM servers: steps per second and where a step's time goes.

Runs an example config (default ``examples/tiny-llama-vllm.toml``: "emit token X", the
torch trainer, ``[vllm] launch`` servers kept in sync by ``[http] weight_sync = "vllm"``)
through ``run_job`` as ``rollout-recovery run`` does, with clocks around the parts, and
splits each step's wall time as ``bench_llm.py`` does for the in-process job:

- training: ``train_step`` (the epochs' AdamW passes on the step's batch);
- weight sync: the trainer's snapshot of the new weights (``weights()``) and their push
  into the servers (``weights_loaded`` events: write the safetensors file, pause, load,
  name the version, resume; the slowest server's). On policy (staleness 0) a server gets
  no call at the new version before it has loaded it, so the push is on the step's path;
- checkpoint: the checkpoint writes inside the measured loop, spread over the steps;
- generation: the rest (sampling the step's attempts on the servers, staging, sealing).

Server start-up is reported on its own and not counted in the steps: the loop starts when
the controller starts (servers up), and ends with the last step. Run::

    python benchmarks/bench_vllm_job.py [--config FILE] [--steps 30] [--servers N]
        [--vllm-python PY] [--model SOURCE] [--json out.json]

``--vllm-python`` and ``--model`` override ``[vllm] python`` and ``[model] source``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from rollout_recovery.control import RunConfig, load_config
from rollout_recovery.dataplane import DataPlane
from rollout_recovery.history._trail_reader import read_records
from rollout_recovery.history.records import BackendEvent
from rollout_recovery.job import JobComponents, run_job
from rollout_recovery.job._components import default_components

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-llama-vllm.toml"

F = TypeVar("F", bound=Callable[..., Any])


class Clocks:
    """Durations per part (the trainer's step runs in a thread of its own)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds: dict[str, list[float]] = {}

    def timed(self, part: str, function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                with self.lock:
                    self.seconds.setdefault(part, []).append(time.perf_counter() - started)

        return wrapper  # type: ignore[return-value]


class TimedProgress:
    """When the controller started (servers up) and when each step ended."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.ends: list[float] = []
        self.rewards: list[float | None] = []

    def start(self, total_steps: int, resumed_from: int | None) -> None:
        self.started = time.perf_counter()

    def update(
        self,
        *,
        step: int,
        mean_reward: float | None,
        in_flight: int,
        retries: int,
        checkpoints: int,
    ) -> None:
        self.ends.append(time.perf_counter())
        self.rewards.append(mean_reward)
        print(f"step {step} reward {mean_reward}", flush=True)

    def log(self, message: str) -> None:
        print(message, flush=True)


def timed_components(clocks: Clocks) -> Callable[[RunConfig, DataPlane], JobComponents]:
    def build(config: RunConfig, data_plane: DataPlane) -> JobComponents:
        parts = default_components(config, data_plane)
        trainer: Any = parts.trainer
        # Instance attributes shadow the methods the job calls on them.
        trainer.train_step = clocks.timed("train_step", trainer.train_step)
        trainer.weights = clocks.timed("weights_snapshot", trainer.weights)
        trainer.state_files = clocks.timed("state_files", trainer.state_files)
        return parts

    return build


def _pushes(run: Path) -> dict[int, float]:
    """Seconds of each version's push into the servers (the slowest server's)."""
    pushes: dict[int, float] = {}
    for _, record in read_records(run / "events.jsonl"):
        if isinstance(record, BackendEvent) and record.kind == "weights_loaded":
            version, seconds = record.detail.get("version"), record.detail.get("seconds")
            if isinstance(version, int) and isinstance(seconds, int | float):
                pushes[version] = max(pushes.get(version, 0.0), float(seconds))
    return pushes


def _configured(args: argparse.Namespace) -> RunConfig:
    config = load_config(args.config)
    job = msgspec.structs.replace(config.job, steps=args.steps)
    vllm = config.vllm
    if args.servers is not None:
        vllm = msgspec.structs.replace(vllm, launch=args.servers)
    if args.vllm_python is not None:
        vllm = msgspec.structs.replace(vllm, python=args.vllm_python)
    model = config.model
    if args.model is not None:
        model = msgspec.structs.replace(model, source=args.model)
    return msgspec.structs.replace(config, job=job, vllm=vllm, model=model)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    config = _configured(args)
    out = Path(tempfile.mkdtemp(prefix="bench-vllm-job-")) / "run"
    clocks, progress = Clocks(), TimedProgress()
    began = time.perf_counter()
    cpu = time.process_time()
    result = run_job(
        out,
        config,
        progress=progress,
        components=timed_components(clocks),
        log=lambda message: print(message, flush=True),
    )
    cpu = time.process_time() - cpu
    assert progress.started is not None and progress.ends
    trained = len(progress.ends)
    loop = progress.ends[-1] - progress.started
    per_step = loop / trained
    pushes = _pushes(out)
    # Version 0 is pushed once the servers are up, before the first step; the push after
    # step s loads version s + 1 (a fresh run). All of them are inside the loop.
    push_total = sum(pushes.values())
    snapshots = sum(clocks.seconds.get("weights_snapshot", []))
    train = sum(clocks.seconds.get("train_step", [])) / trained
    sync = (push_total + snapshots) / trained
    inside = [c.write_s for c in result.checkpoints if 0 < c.step < trained]
    checkpoint = sum(inside) / trained
    generation = per_step - train - sync - checkpoint
    summary = result.summary
    return {
        "config": str(args.config),
        "model": config.model.source,
        "steps": trained,
        "servers": config.vllm.launch,
        "prompts_per_step": config.job.prompts_per_step,
        "generations_per_prompt": config.job.generations_per_prompt,
        "max_tokens": config.task.max_tokens,
        "startup_s": round(progress.started - began, 1),
        "steps_per_s": round(trained / loop, 4),
        "loop_wall_s": round(loop, 1),
        # The job's process only: the servers' CPU is not in it.
        "job_cpu_s_per_step": round(cpu / trained, 3),
        "per_step_wall_s": {
            "total": round(per_step, 3),
            "generation": round(generation, 3),
            "train_step": round(train, 3),
            "weight_sync": round(sync, 3),
            "checkpoint": round(checkpoint, 3),
        },
        "share": {
            "generation": round(generation / per_step, 3),
            "train_step": round(train / per_step, 3),
            "weight_sync": round(sync / per_step, 3),
            "checkpoint": round(checkpoint / per_step, 3),
        },
        "weight_push_s": {
            "median": round(statistics.median(pushes.values()), 3) if pushes else None,
            "max": round(max(pushes.values()), 3) if pushes else None,
            "count": len(pushes),
        },
        "weights_snapshot_ms_median": round(
            1e3 * statistics.median(clocks.seconds["weights_snapshot"]), 1
        ),
        "checkpoint": {
            "count": len(result.checkpoints),
            "inside_loop": len(inside),
            "write_s_median": round(statistics.median(c.write_s for c in result.checkpoints), 3),
        },
        "reward": {
            "first_tenth": summary.first_tenth_reward,
            "last_tenth": summary.last_tenth_reward,
        },
        "run_dir": str(out),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=EXAMPLE)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--servers", type=int, default=None)
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = measure(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
