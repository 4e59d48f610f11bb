"""The TRL example (``examples/trl/grpo_recovering.py``) as a child the tests kill and rerun.

    python trl_child.py --log FILE --run LABEL [--stop-at-step S --stop-after K] -- EXAMPLE ARGS

Logs every completion the rollout function makes to FILE (one JSON line, written before the
next one is generated). With ``--stop-at-step``, the K-th completion generated at TRL step S
prints ``STOPPED INSIDE A ROLLOUT`` and the child blocks on stdin until the parent kills it:
the kill lands inside that rollout, after exactly K of its completions.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "trl" / "grpo_recovering.py"
STOPPED = "STOPPED INSIDE A ROLLOUT"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grpo_recovering", EXAMPLE)
    assert spec is not None and spec.loader is not None, EXAMPLE
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--run", required=True, help="a label for this run's log lines")
    parser.add_argument("--stop-at-step", type=int)
    parser.add_argument("--stop-after", type=int, default=1)
    ours, example_argv = parser.parse_known_args()
    if example_argv[:1] == ["--"]:
        example_argv = example_argv[1:]
    example = load_example()
    log = os.open(ours.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    at_stop_step = 0

    def on_completion(completion: object) -> None:
        nonlocal at_stop_step
        line = {
            "run": ours.run,
            "row_id": completion.row_id,  # type: ignore[attr-defined]
            "generation_index": completion.generation_index,  # type: ignore[attr-defined]
            "global_step": completion.global_step,  # type: ignore[attr-defined]
            "completion_ids": completion.completion_ids,  # type: ignore[attr-defined]
        }
        # One write per line on an O_APPEND descriptor: a kill leaves whole lines only.
        os.write(log, (json.dumps(line) + "\n").encode())
        if completion.global_step == ours.stop_at_step:  # type: ignore[attr-defined]
            at_stop_step += 1
            if at_stop_step == ours.stop_after:
                print(STOPPED, flush=True)
                sys.stdin.read()  # the parent never writes: we wait here for its SIGKILL
                raise SystemExit("stdin closed while stopped inside a rollout")

    example.train(example.parse_args(example_argv), on_completion=on_completion)
    return 0


if __name__ == "__main__":
    sys.exit(main())
