"""Generation throughput through each backend, side by side in one run (issue 10).

The same workload for every backend: ``--attempts`` two-call agent episodes of the task
(4 reasoning tokens, then the 2-token answer), ``--concurrency`` in flight, every call
staged through a ``CaptureWriter``. Columns:

- ``in-process``: ``SimulatedAgentBackend`` with no latency and no faults (numpy sampling);
- ``serve/http``: ``HttpGenerationBackend`` against ``--servers`` local
  ``rollout-recovery serve`` processes (no artificial latency);
- ``vllm/http``: the same backend against a real vLLM 0.32 (``--vllm-python`` and
  ``--vllm-model``, as ``.ci/vllm-integration`` prepares them; skipped when absent).

For each: attempts per second, generated tokens per second, and the capture overhead per
call: the time ``stage_call`` takes (token deltas, three SHA-256 digests, the row put) as a
share of the call's whole time (request, reply cross-checks and staging), once with an
in-memory store and once with the durable SQLite store the main job uses (one fsync per
put).

Run: ``python benchmarks/bench_generation.py [--attempts 400] [--concurrency 16]
[--vllm-python P --vllm-model DIR] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.capture._records import CallRecord
from rollout_recovery.dataplane import DataPlane, MemoryDataPlane, SqliteDataPlane
from rollout_recovery.policy import NumpyGRPOTrainer, TaskConfig, TaskSet
from rollout_recovery.rollout import (
    AttemptRequest,
    AttemptResult,
    DigitTask,
    FaultsConfig,
    GenerationBackend,
    GenerationConfig,
    HttpConfig,
    HttpGenerationBackend,
    SimulatedAgentBackend,
)

TASKS = TaskSet(4096, seed=0, prompt_group_every=4)


class TimedWriter(CaptureWriter):
    """A CaptureWriter that adds up the time spent staging."""

    def __init__(self, data_plane: DataPlane) -> None:
        super().__init__(data_plane)
        self.seconds = 0.0
        self.calls = 0

    def stage_call(self, **call: Any) -> CallRecord:
        started = time.perf_counter()
        try:
            return super().stage_call(**call)
        finally:
            self.seconds += time.perf_counter() - started
            self.calls += 1


class TimedTransport(httpx.AsyncHTTPTransport):
    """Adds up the time generation requests spend on the wire and in the server."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        response = await super().handle_async_request(request)
        await response.aread()
        if request.url.path.endswith(("completions", "generate")):
            self.seconds += time.perf_counter() - started
        return response


async def _drive(
    backend: GenerationBackend, writer: CaptureWriter, attempts: int, concurrency: int
) -> tuple[float, int]:
    slots = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(i: int) -> None:
        nonlocal tokens
        async with slots:
            request = AttemptRequest(
                group_id=f"g{i}",
                generation_index=0,
                rollout_id=f"g{i}_g0_a0",
                prompt=TASKS[i % len(TASKS)],
                weight_version=0,
            )
            result = await backend.run_attempt(request, writer)
            if not isinstance(result, AttemptResult):  # faults are off: nothing may fail
                raise RuntimeError(f"attempt {request.rollout_id} failed: {result}")
            tokens += result.generated_tokens

    started = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(attempts)))
    finally:
        await backend.aclose()
    return time.perf_counter() - started, tokens


def _store(kind: str, scratch: Path) -> DataPlane:
    if kind == "memory":
        return MemoryDataPlane()
    return SqliteDataPlane(scratch / f"bench-{time.monotonic_ns()}.sqlite")


def _measure(
    name: str,
    make: Any,
    *,
    store_kind: str,
    attempts: int,
    concurrency: int,
    scratch: Path,
) -> dict[str, Any]:
    store = _store(store_kind, scratch)
    writer = TimedWriter(store)
    transport = TimedTransport()
    backend = make(transport, store_kind == "sqlite")
    wall, tokens = asyncio.run(_drive(backend, writer, attempts, concurrency))
    store.close()
    request_s = transport.seconds
    call_s = request_s + writer.seconds if request_s else wall * concurrency / writer.calls
    row = {
        "backend": name,
        "store": store_kind,
        "attempts_per_s": attempts / wall,
        "tokens_per_s": tokens / wall,
        "stage_ms_per_call": 1000 * writer.seconds / writer.calls,
        # The share of a call's time spent staging: for HTTP, staging over request +
        # staging; in process (no request), staging over the attempt's share of wall time.
        "capture_share": writer.seconds / (request_s + writer.seconds)
        if request_s
        else writer.seconds / (wall * min(concurrency, attempts)),
        "call_ms": 1000 * (request_s / writer.calls if request_s else call_s),
    }
    return row


def _simulated(transport: httpx.AsyncBaseTransport, threaded: bool) -> GenerationBackend:
    trainer = NumpyGRPOTrainer(seed=0)
    return SimulatedAgentBackend(
        GenerationConfig(workers=16, call_latency_s=0.0, latency_jitter=0.0),
        faults=FaultsConfig.only(),
        # Two calls an episode (a thought, the answer), as before issue 25.
        episodes=DigitTask(TASKS, TaskConfig(thinking_calls=1, reasoning_tokens=4)),
        seed=0,
        initial_weights=trainer.weights(),
        data_plane=MemoryDataPlane(),  # read only by the tamper fault, which is off
        stage_in_thread=threaded,
    )


def _http(urls: list[str], model: str, sync: str) -> Any:
    def make(transport: httpx.AsyncBaseTransport, threaded: bool) -> GenerationBackend:
        trainer = NumpyGRPOTrainer(seed=0)
        return HttpGenerationBackend(
            HttpConfig(
                servers=tuple(urls),
                weight_sync=sync,  # type: ignore[arg-type]
                model=model,
                per_server_concurrency=64,
                probe_interval_s=1.0,
                request_timeout_s=120.0,
            ),
            generation=GenerationConfig(),
            # [task]'s default episode (three thinking calls), as before issue 25.
            episodes=DigitTask(TASKS, TaskConfig()),
            vocab_size=trainer.vocab_size,
            stage_in_thread=threaded,
            initial_version=0,
            initial_weights=trainer.weights(),
            client=httpx.AsyncClient(transport=transport),
        )

    return make


@contextlib.contextmanager
def _serve(count: int, scratch: Path) -> Iterator[list[str]]:
    processes: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for i in range(count):
            ready = scratch / f"serve-{i}.json"
            processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "rollout_recovery",
                        "serve",
                        "--port",
                        "0",
                        "--ready-file",
                        str(ready),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            deadline = time.monotonic() + 30
            while not ready.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("serve did not start")
                time.sleep(0.02)
            urls.append(json.loads(ready.read_text())["url"])
        yield urls
    finally:
        _kill(processes)


@contextlib.contextmanager
def _vllm(python: str, model: str, scratch: Path) -> Iterator[str]:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    log = open(scratch / "vllm.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--served-model-name",
            "tiny",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "512",
            "--max-num-seqs",
            "16",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vLLM did not start; see {scratch / 'vllm.log'}")
            time.sleep(0.5)
        yield url
    finally:
        _kill([process])
        log.close()


def _kill(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--vllm-python", default=os.environ.get("ROLLOUT_RECOVERY_VLLM_PYTHON"))
    parser.add_argument("--vllm-model", default=os.environ.get("ROLLOUT_RECOVERY_VLLM_MODEL"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        common = {"attempts": args.attempts, "concurrency": args.concurrency, "scratch": scratch}
        for store in ("memory", "sqlite"):
            rows.append(_measure("in-process", _simulated, store_kind=store, **common))
        with _serve(args.servers, scratch) as urls:
            for store in ("memory", "sqlite"):
                rows.append(
                    _measure(
                        f"serve/http x{args.servers}",
                        _http(urls, "rollout-recovery-numpy", "policy"),
                        store_kind=store,
                        **common,
                    )
                )
        if args.vllm_python and args.vllm_model:
            with _vllm(args.vllm_python, args.vllm_model, scratch) as url:
                for store in ("memory", "sqlite"):
                    rows.append(
                        _measure(
                            "vllm/http x1",
                            _http([url], "tiny", "none"),
                            store_kind=store,
                            **common,
                        )
                    )
        else:
            print("vllm/http: skipped (pass --vllm-python and --vllm-model)")
    base = rows[0]["attempts_per_s"]
    header = (
        f"{'backend':<16} {'store':<7} {'attempts/s':>10} {'x in-proc':>9} {'tokens/s':>9} "
        f"{'call ms':>8} {'stage ms':>8} {'capture share':>13}"
    )
    print(header)
    for row in rows:
        print(
            f"{row['backend']:<16} {row['store']:<7} {row['attempts_per_s']:>10.1f} "
            f"{row['attempts_per_s'] / base:>9.3f} {row['tokens_per_s']:>9.0f} "
            f"{row['call_ms']:>8.2f} {row['stage_ms_per_call']:>8.3f} "
            f"{100 * row['capture_share']:>12.1f}%"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
