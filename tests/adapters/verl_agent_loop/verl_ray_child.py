"""One prompt group through verl's worker in two Ray actors, sharing the recorder's actor.

    python verl_ray_child.py --model DIR --log FILE --run LABEL --recover RUN_DIR
        --ray-temp DIR [--block] [--weight-version V] [--uid UID]

The multi-worker path of ``RecoveringAgentLoop``: verl runs agent loops in several worker
processes, and the journal has one writer, so the loops reach one recorder in a named Ray
actor (``recorder: ray``). Worker A runs siblings 0 and 1, worker B sibling 2, each through
verl's own ``AgentLoopWorker._run_agent_loop`` (built as in ``verl_group_child.py``). With
``--block``, B's generate call waits forever: the driver prints ``FINISHED <session>`` for
A's two siblings and ``BLOCKED`` once B is waiting, then waits on stdin for the parent's
SIGKILL of the whole process group (driver, Ray's daemons and actors).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from verl_group_child import (
    BLOCKED,
    FINISHED,
    RECOVERING,
    USER_LOOP,
    WEIGHT_VERSION,
    CountingServerManager,
    log_line,
    worker,
)

N = 3


def main() -> int:
    import ray

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--recover", required=True)
    parser.add_argument("--ray-temp", required=True)
    parser.add_argument("--block", action="store_true")
    parser.add_argument("--weight-version", type=int, default=WEIGHT_VERSION)
    parser.add_argument("--uid", default="uid-7")
    args = parser.parse_args()

    @ray.remote(num_cpus=0)
    class Signal:
        """Tells the driver that worker B waits in its generate call."""

        def __init__(self) -> None:
            self.event = asyncio.Event()

        async def set(self) -> None:
            self.event.set()

        async def wait(self) -> None:
            await self.event.wait()

    class BlockingServer(CountingServerManager):
        def __init__(self, log: int, signal: Any) -> None:
            super().__init__(log, args.run, None, args.weight_version)
            self.signal = signal

        async def generate(self, request_id: str, **kwargs: Any) -> Any:
            await self.signal.set.remote()
            await asyncio.Event().wait()  # until the parent's SIGKILL

    @ray.remote(num_cpus=1)
    class LoopWorker:
        """verl's AgentLoopWorker, as a Ray actor like verl's own agent-loop workers."""

        def __init__(self, block: bool, signal: Any) -> None:
            from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

            log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            server = (
                BlockingServer(log, signal)
                if block
                else CountingServerManager(log, args.run, None, args.weight_version)
            )
            self.worker = worker(Path(args.model), server, n=N)
            self.log = log
            _agent_loop_registry[RECOVERING] = {
                "_target_": "rollout_recovery.adapters.verl.RecoveringAgentLoop",
                "inner": USER_LOOP,
                "run_dir": args.recover,
                "recorder": "ray",
            }

        async def run_sibling(self, session: int) -> None:
            sample = {
                "raw_prompt": [{"role": "user", "content": "Count on from 7:"}],
                "extra_info": {"index": 7, "split": "train"},
                "index": 7,
                "uid": args.uid,
                "global_steps": 5,
            }
            trajectory = {"step": 5, "sample_index": 7, "rollout_n": session, "validate": False}
            output = await self.worker._run_agent_loop(
                {"temperature": 1.0}, trajectory, agent_name=RECOVERING, session_id=session,
                **sample,
            )  # fmt: skip
            tags = {k: output.extra_fields.get(k) for k in ("min_global_steps", "max_global_steps")}
            response = output.response_ids[0][: output.response_mask.shape[1]].tolist()
            log_line(self.log, event="finished", run=args.run, session=session,
                     response_tokens=int(output.response_mask.sum()), response=response,
                     **tags)  # fmt: skip

    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=args.ray_temp, log_to_driver=False)
    signal = Signal.remote()  # type: ignore[attr-defined]
    a = LoopWorker.remote(False, signal)  # type: ignore[attr-defined]
    b = LoopWorker.remote(args.block, signal)  # type: ignore[attr-defined]
    first_two = [a.run_sibling.remote(0), a.run_sibling.remote(1)]
    third = b.run_sibling.remote(2)
    for session, ref in enumerate(first_two):
        ray.get(ref)
        print(f"{FINISHED} {session}", flush=True)
    if args.block:
        ray.get(signal.wait.remote())
        print(BLOCKED, flush=True)
        sys.stdin.read()  # the parent never writes: its SIGKILL ends the group here
        raise SystemExit("stdin closed while blocked")
    ray.get(third)
    print(f"{FINISHED} 2", flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
