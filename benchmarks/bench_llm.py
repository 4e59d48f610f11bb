"""The LLM job in process: steps per second and where a step's time goes (issue 19).

Runs an example config (default ``examples/tiny-llama-emit-token.toml``: the tiny Llama,
the torch trainer, transformers sampling in the job's process) through ``run_job`` as
``rollout-recovery run`` does, with clocks around the parts:

- generation: a step's wall time less the parts below (on policy, staleness 0, that is
  sampling the step's attempts, staging and sealing them); and each model call
  (``TransformersBackend.sample``, in worker threads: calls overlap, so their durations
  summed exceed the wall time they take);
- training: ``train_step`` (``epochs`` AdamW passes on the step's batch);
- weight sync: the trainer's snapshot of the new weights (``weights()``) and the backend
  building its model around them (``update_weights``), after every step;
- checkpoint: the trainer's safetensors + JSON (``state_files()``) and the whole
  checkpoint write.

Steps per second is trained steps over the wall time from the first model call to the
last step's end; CPU seconds per step (the whole process) is the machine-load-proof
number. Run: ``python benchmarks/bench_llm.py [--config FILE] [--steps 20]
[--cache-dir DIR] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from rollout_recovery.control import RunConfig, load_config
from rollout_recovery.dataplane import DataPlane
from rollout_recovery.job import JobComponents, run_job
from rollout_recovery.job._components import default_components

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-llama-emit-token.toml"

F = TypeVar("F", bound=Callable[..., Any])


class Clocks:
    """Durations per part, thread-safe (model calls run in worker threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds: dict[str, list[float]] = {}
        self.first_call: float | None = None
        self.last_step_end: float | None = None

    def add(self, part: str, seconds: float) -> None:
        with self.lock:
            self.seconds.setdefault(part, []).append(seconds)

    def timed(self, part: str, function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            if part == "generation_call":
                with self.lock:
                    if self.first_call is None:
                        self.first_call = started
            try:
                return function(*args, **kwargs)
            finally:
                ended = time.perf_counter()
                self.add(part, ended - started)
                if part == "train_step":
                    self.last_step_end = ended

        return wrapper  # type: ignore[return-value]


def timed_components(clocks: Clocks) -> Callable[[RunConfig, DataPlane], JobComponents]:
    def build(config: RunConfig, data_plane: DataPlane) -> JobComponents:
        parts = default_components(config, data_plane)
        trainer: Any = parts.trainer
        backend: Any = parts.backend
        # Instance attributes shadow the methods the job calls on them.
        trainer.train_step = clocks.timed("train_step", trainer.train_step)
        trainer.weights = clocks.timed("weights_snapshot", trainer.weights)
        trainer.state_files = clocks.timed("state_files", trainer.state_files)
        backend.update_weights = clocks.timed("update_weights", backend.update_weights)
        backend.sample = clocks.timed("generation_call", backend.sample)
        return parts

    return build


def bench(config_path: Path, steps: int, cache_dir: Path | None) -> dict[str, Any]:
    sections = tomllib.loads(config_path.read_text())
    config = load_config(config_path)
    job = msgspec.structs.replace(config.job, steps=steps)
    model = config.model
    if cache_dir is not None:
        model = msgspec.structs.replace(model, cache_dir=str(cache_dir))
    config = msgspec.structs.replace(config, job=job, model=model)
    clocks = Clocks()
    with tempfile.TemporaryDirectory(prefix="bench-llm-") as scratch:
        cpu = time.process_time()
        started = time.perf_counter()
        result = run_job(Path(scratch) / "run", config, components=timed_components(clocks))
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
    assert clocks.first_call is not None and clocks.last_step_end is not None
    loop = clocks.last_step_end - clocks.first_call
    trained = result.summary.steps
    per_step = loop / trained
    sums = {part: sum(values) for part, values in clocks.seconds.items()}
    train = sums.get("train_step", 0.0) / trained
    sync = (sums.get("weights_snapshot", 0.0) + sums.get("update_weights", 0.0)) / trained
    # Checkpoints inside the measured loop (the bootstrap one comes before the first call,
    # the last one after the last step).
    inside = [t.write_s for t in result.checkpoints if 0 < t.step < trained]
    checkpoint = sum(inside) / trained
    return {
        "config": str(config_path),
        "model": sections.get("model", {}).get("source", "tiny-llama"),
        "steps": trained,
        "prompts_per_step": config.job.prompts_per_step,
        "generations_per_prompt": config.job.generations_per_prompt,
        "max_tokens": config.task.max_tokens,
        "steps_per_s": trained / loop,
        "loop_wall_s": loop,
        "run_wall_s": wall,
        "cpu_s_per_step": cpu / trained,
        # Where a step's wall time goes; generation is the rest (sampling the next step's
        # attempts, staging, sealing, the controller), on policy never overlapping training.
        "per_step_wall_s": {
            "total": per_step,
            "generation": per_step - train - sync - checkpoint,
            "train_step": train,
            "weight_sync": sync,
            "checkpoint": checkpoint,
        },
        # The model calls' durations summed: more than their wall time, as they overlap.
        "generation_calls_summed_per_step_s": sums.get("generation_call", 0.0) / trained,
        "weight_sync_ms": {
            "weights_snapshot": 1e3 * statistics.median(clocks.seconds["weights_snapshot"]),
            "update_weights": 1e3 * statistics.median(clocks.seconds["update_weights"]),
        },
        "model_call_ms_median": 1e3 * statistics.median(clocks.seconds["generation_call"]),
        "checkpoint": {
            "count": len(result.checkpoints),
            "state_files_ms_median": 1e3 * statistics.median(clocks.seconds["state_files"]),
            "write_s_median": statistics.median(t.write_s for t in result.checkpoints),
        },
        "reward": {
            "first_tenth": result.summary.first_tenth_reward,
            "last_tenth": result.summary.last_tenth_reward,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=EXAMPLE)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    report = bench(args.config, args.steps, args.cache_dir)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
