"""A torch job's start up to its restored trainer, with and without the checkpoint's read-ahead.

Times, in a fresh process each, what a resuming torch job does before its restore (import
the job's rooms, torch and transformers, the model's digest, the trainer built from its
files) and then the newest checkpoint's load (every file read and checked against its
sha256) with the trainer's state loaded from it; ``seq`` reads the checkpoint after the
build (as before), ``ahead`` starts ``CheckpointStore.read_ahead()`` first, as a resuming
job does now. ``RUN_DIR`` is a finished or killed run of a torch job (its ``job.toml`` and
``checkpoints/``, e.g. ``examples/smollm2-vllm.toml``'s: 1.6 GB of weights and moments);
nothing in it is changed. Run::

    flock /work/heavy.lock python benchmarks/bench_resume_read_ahead.py RUN_DIR [--repeat 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

_CHILD = """
import sys, time
started = time.perf_counter()
from pathlib import Path
from rollout_recovery.control import load_config
from rollout_recovery.control._checkpointing import CHECKPOINT_FILES
from rollout_recovery.job._llm_parts import resolve_model
from rollout_recovery.rundir import CheckpointStore
root, mode = Path(sys.argv[1]), sys.argv[2]
config = load_config(root / "job.toml")
store = CheckpointStore(root, keep=config.checkpoint.keep)
if mode == "ahead":
    store.read_ahead()
config = resolve_model(config)
parts = config.trainer.torch_parts(
    config.model, config.task, seed=config.job.seed, reward=config.reward
)
built = time.perf_counter() - started

def verify(loaded):
    names = CHECKPOINT_FILES.trainer_files(loaded.files)
    parts.trainer.load_state_files({own: loaded.files[name] for name, own in names.items()})
    return loaded.step

found = store.newest_loadable(verify)
print(f"{built:.2f} {time.perf_counter() - started:.2f} {found[1]}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print(f"{'mode':6} {'trainer built s':>16} {'state restored s':>17}  checkpoint step")
    for _ in range(args.repeat):
        for mode in ("seq", "ahead"):
            done = subprocess.run(
                [sys.executable, "-c", _CHILD, str(args.run_dir), mode],
                capture_output=True,
                text=True,
                check=True,
            )
            built, restored, step = done.stdout.split()
            print(f"{mode:6} {built:>16} {restored:>17}  {step}", flush=True)


if __name__ == "__main__":
    main()
