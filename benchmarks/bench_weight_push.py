"""One weight push into a real vLLM server, before and after issue 28's changes, side by side.

Starts one vLLM 0.32 CPU server (its own process group, killed at the end) from a model
directory, then pushes the same weights as new versions again and again, alternating:

- **before**: the sync as it was up to commit ``9198587``: the safetensors file built as
  one ``bytes`` object, written with ``atomic_write_bytes`` (fsynced, directory fsynced)
  into a weights directory on disk, then seven requests: ``/pause?mode=wait&clear_cache=
  true``, ``/update_weight_version loading``, ``/collective_rpc`` load,
  ``/update_weight_version N``, ``/reset_prefix_cache``, ``/resume``, ``/weight_info``;
- **main**: ``VllmWeightSync`` as ``main`` had it at ``fc2d50e``: the same sync, but each
  version's file a fresh one whose pages are faulted in one by one as the cast reaches
  them;
- **after**: ``VllmWeightSync`` as it is now (the file serialized straight into shared
  memory, never fsynced, into the superseded version's file with its pages faulted in
  at once; the requests it sends), the worker loading it with the extension's direct
  load where it can;
- **reload**: the same, but the worker loads through vLLM's own reload (and the tied
  ``lm_head`` re-pack), as ``main`` did up to the direct load (the load call asks for
  it: ``rollout_recovery_load(path, version, "reload")``);
- **placed**: the trainer's snapshot *is* the file (``TorchWeights.capture_into``, what
  the job does for a torch trainer): written straight from the live parameters and
  viewed read-only, where ``after`` takes the snapshot as a copy (``capture``) and then
  writes the file from it. Where the server's dtype is not fp32 the two are the same
  (the file is a cast: the snapshot stays a copy). The version before is held while the
  next is placed, as the job's server pool holds it.

``snapshot`` is the trainer's snapshot of the live weights (``after``, ``reload``: the
copy; ``placed``: the file's write, so its ``file`` is 0); ``snapshot + push`` is what a
version costs on the step's path on policy.

The worker extension is the current one for all four: only ``reload`` asks for vLLM's
reload.

Each request's latency is timed at the transport, and the file's preparation apart, so
the table says where a push's time goes. The weights are the model's own in fp32 (as the
trainer holds them), written in the server's dtype. Run (heavy: under the lock)::

    flock /work/heavy.lock python benchmarks/bench_weight_push.py \
        [--model DIR] [--pushes 10] [--dtype bfloat16] [--json out.json]

``--model`` defaults to the tiny Llama the LLM examples build
(``~/.cache/rollout-recovery/models/tiny-llama-*``); SmolLM2-135M converted by ``[model]
source = "smollm2"`` lives in ``~/.cache/rollout-recovery/models/smollm2-135m-instruct-bf16``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import mmap
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors.torch import load_file

from rollout_recovery._durable import atomic_write_bytes
from rollout_recovery.llm import _weights
from rollout_recovery.llm._weights import TorchWeights
from rollout_recovery.vllm import VllmConfig
from rollout_recovery.vllm._fleet import server_command, server_environment
from rollout_recovery.vllm._sync import LOAD_METHOD, VllmWeightSync, shared_memory_dir

CACHE = Path.home() / ".cache" / "rollout-recovery"
VARIANTS = ("before", "main", "after", "reload", "placed")
PYTHON = CACHE / "vllm" / "venv" / "bin" / "python"
READY_S = 600.0


class TimedTransport(httpx.AsyncHTTPTransport):
    """Times every request (headers and the small JSON body arrive together); with
    ``how``, each weight load asks the worker for that load."""

    def __init__(self, how: str | None = None) -> None:
        super().__init__()
        self.times: list[tuple[str, float]] = []
        self.how = how

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.how is not None and request.url.path == "/collective_rpc":
            body = json.loads(request.content)
            body["args"] = [*body["args"], self.how]
            request = httpx.Request(request.method, request.url, json=body)
        started = time.perf_counter()
        response = await super().handle_async_request(request)
        await response.aread()
        self.times.append((request.url.path, time.perf_counter() - started))
        return response


def shared_memory_of(pgid: int) -> set[Path]:
    """The /dev/shm files the processes of group ``pgid`` have mapped."""
    found: set[Path] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            if os.getpgid(int(maps.parent.name)) != pgid:
                continue
            for line in maps.read_text().splitlines():
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                    found.add(Path(parts[5].removesuffix(" (deleted)")))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(model: Path, dtype: str, logs: Path) -> tuple[subprocess.Popen[bytes], str]:
    config = VllmConfig(
        python=str(PYTHON),
        model=str(model),
        dtype=dtype,  # type: ignore[arg-type]
        max_model_len=512,
        max_num_seqs=8,  # type: ignore[arg-type]
    )
    port = free_port()
    command = server_command(config, served_model_name="m", port=port)
    env = {**server_environment(config, "bench-key")}
    with (logs / "vllm.log").open("wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_S
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"vLLM exited: see {logs / 'vllm.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/health").status_code == 200:
                    return process, url
            time.sleep(0.5)
    raise SystemExit("vLLM not ready")


async def push_before(
    client: httpx.AsyncClient, url: str, directory: Path, weights: TorchWeights, dtype: str
) -> tuple[float, int | None]:
    """The sync up to 9198587: one bytes object, fsynced file on disk, seven requests."""
    started = time.perf_counter()
    path = directory / f"weights-v{weights.version:010d}.safetensors"
    atomic_write_bytes(path, weights.safetensors_bytes(dtype))
    written = time.perf_counter() - started
    version = str(weights.version)
    post = client.post
    (await post(f"{url}/pause", params={"mode": "wait", "clear_cache": "true"})).raise_for_status()
    try:
        await post(f"{url}/update_weight_version", json={"new_version": "loading"})
        rpc = await post(
            f"{url}/collective_rpc", json={"method": LOAD_METHOD, "args": [str(path), version]}
        )
        rpc.raise_for_status()
        await post(f"{url}/update_weight_version", json={"new_version": version})
        await post(f"{url}/reset_prefix_cache")
    finally:
        await post(f"{url}/resume")
    info = (await client.get(f"{url}/weight_info")).json()
    return written, int(info["weight_version"])


async def run(args: argparse.Namespace, url: str, base: TorchWeights, work: Path) -> dict[str, Any]:
    disk = work / "weights"
    disk.mkdir()
    shm = shared_memory_dir(f"bench-{os.getpid()}")
    sync = VllmWeightSync(shm, dtype=args.dtype)
    # "main": the same sync with no file reused and no page faulted in ahead.
    fresh = VllmWeightSync(shm / "main", dtype=args.dtype)
    fresh._recyclable = lambda version: None  # type: ignore[method-assign]
    placed = VllmWeightSync(shm / "placed", dtype=args.dtype)
    held: TorchWeights | None = None  # the placed version before, as the pool holds it
    results: dict[str, dict[str, list[float]]] = {v: defaultdict(list) for v in VARIANTS}
    version = 0
    try:
        for round_ in range(args.pushes + 1):  # the first round warms up, not counted
            for variant in VARIANTS:
                version += 1
                snapshot_started = time.perf_counter()
                if variant == "placed":
                    weights = TorchWeights.capture_into(placed, version, base.tensors.items())
                elif variant in ("after", "reload"):
                    weights = TorchWeights.capture(version, base.tensors.items())
                else:
                    weights = TorchWeights(version, base.tensors)
                snapshot = time.perf_counter() - snapshot_started
                transport = TimedTransport("reload" if variant == "reload" else None)
                async with httpx.AsyncClient(transport=transport, timeout=300.0) as client:
                    started = time.perf_counter()
                    if variant == "before":
                        written, reported = await push_before(
                            client, url, disk, weights, args.dtype
                        )
                    else:
                        used = {"main": fresh, "placed": placed}.get(variant, sync)
                        flags = _weights._MAP_FLAGS
                        if variant == "main":
                            _weights._MAP_FLAGS = mmap.MAP_SHARED
                        try:
                            file_started = time.perf_counter()
                            await used.weights_file(version, weights)
                            written = time.perf_counter() - file_started
                        finally:
                            _weights._MAP_FLAGS = flags
                        reported = await used.push(client, url, version, weights, 300.0)
                    total = time.perf_counter() - started
                if variant == "placed":
                    held = weights
                for stale in disk.iterdir():  # the old sync kept 3 files: not timed
                    stale.unlink()
                assert reported == version, (variant, reported, version)
                if round_ == 0:
                    continue
                row = results[variant]
                row["total"].append(total)
                row["file"].append(written)
                if variant in ("after", "reload", "placed"):
                    row["snapshot"].append(snapshot)
                    row["snapshot + push"].append(snapshot + total)
                for index, (path, seconds) in enumerate(transport.times):
                    row[f"{index + 1} {path}"].append(seconds)
    finally:
        del held
        fresh.close()
        placed.close()
        sync.close()  # last: its directory holds theirs
    return {
        variant: {part: statistics.median(values) for part, values in row.items()}
        for variant, row in results.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--pushes", type=int, default=10)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    model = args.model or next(CACHE.glob("models/tiny-llama-*"))
    torch.set_num_threads(1)
    tensors = {
        name: t.float()
        for name, t in load_file(str(model / "model.safetensors")).items()
        if name != "lm_head.weight"
    }
    base = TorchWeights(0, tensors)
    with tempfile.TemporaryDirectory(prefix="bench-push-", dir=Path.home()) as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        process, url = start_server(model, args.dtype, work)
        print(f"server ready in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        try:
            medians = asyncio.run(run(args, url, base, work))
        finally:
            segments = shared_memory_of(process.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            for segment in segments:  # what vLLM's processes leave in /dev/shm on SIGKILL
                segment.unlink(missing_ok=True)
    size = sum(t.numel() for t in base.tensors.values())
    print(f"model {model.name}: {size / 1e6:.2f}M parameters, pushed as {args.dtype}")
    print(f"median of {args.pushes} pushes each (seconds)")
    parts = sorted({p for row in medians.values() for p in row}, key=_order)
    print(f"{'part':40s}" + "".join(f" {v:>9s}" for v in VARIANTS))
    for part in parts:
        cells = [medians[v].get(part) for v in VARIANTS]
        shown = [f"{c:9.4f}" if c is not None else f"{'-':>9s}" for c in cells]
        print(f"{part:40s} " + " ".join(shown))
    if args.json:
        args.json.write_text(json.dumps({"model": str(model), "medians": medians}, indent=2))


def _order(part: str) -> tuple[int, str]:
    first = ("snapshot + push", "snapshot", "total", "file")
    return (first.index(part), part) if part in first else (len(first), part)


if __name__ == "__main__":
    main()
