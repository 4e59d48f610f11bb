"""A test's worker extension for a real vLLM: the job's weight loader, plus slow steps.

Runs inside vLLM's worker (``--worker-extension-cls slow_steps_extension.SlowStepsLoader``,
this directory and the job's extension directory on the server's ``PYTHONPATH``). It is
the job's ``WeightLoader`` with one more method, callable through ``/collective_rpc``:

``rollout_recovery_test_slow_steps(seconds, steps)``: each of the next ``steps`` engine
steps (one decode step: a token of every running request) first sleeps ``seconds``, until
the next weight load ends it. A test that needs a push to land inside a request (issue 24
item 21: on a busy machine the tiny model's 480 tokens were done before the push reached
the server) so makes the request last as long as it likes *by the server's own clock*:
the server takes a new request between two steps, a pause or a load too, so the push
still lands at the next step, and once it has loaded, the rest runs at full speed.
"""

from __future__ import annotations

import time
from typing import Any

from rollout_recovery_vllm_extension import WeightLoader

__all__ = ["SlowStepsLoader"]


class SlowStepsLoader(WeightLoader):
    """Mixed into vLLM's worker class (``self`` is the worker)."""

    def rollout_recovery_test_slow_steps(self, seconds: str, steps: str) -> dict[str, Any]:
        worker: Any = self
        if not hasattr(worker, "_slow_execute"):
            # The engine calls the worker's execute_model for every step (through its
            # wrapper's attribute lookup): an attribute of the instance comes first.
            worker._slow_execute = worker.execute_model

            def execute_model(*args: Any, **kwargs: Any) -> Any:
                if worker._slow_steps > 0:
                    worker._slow_steps -= 1
                    time.sleep(worker._slow_seconds)
                return worker._slow_execute(*args, **kwargs)

            worker.execute_model = execute_model
        worker._slow_seconds = float(seconds)
        worker._slow_steps = int(steps)
        return {"seconds": worker._slow_seconds, "steps": worker._slow_steps}

    def rollout_recovery_load(self, path: str, version: str) -> dict[str, Any]:
        worker: Any = self
        worker._slow_steps = 0  # the push landed: full speed again
        return super().rollout_recovery_load(path, version)
