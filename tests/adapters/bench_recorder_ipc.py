"""What a recorder call costs: in process, over a Unix socket, and the fdatasync under it.

Input to issue 26's process model: one recorder process per run reached by a thin client vs
a journal per rank. Not a test (not collected); run it on a quiet machine::

    python tests/adapters/bench_recorder_ipc.py --dir RUN_DIR_FILESYSTEM [--calls 5000]

- in-process: a small msgspec-encoded request (a seal: prompt key, generation index, 64
  completion tokens and logprobs) encoded, decoded, handled, and its reply encoded and
  decoded: the codec a client would pay, without the socket;
- Unix socket: the same request round trip to a server process (asyncio, one connection per
  client, 4-byte length prefix), from 1 and from 8 client processes at once, each sending its
  calls one after the other;
- fdatasync: one small append (``os.write`` of a journal-sized line on an ``O_APPEND``
  descriptor) followed by ``os.fdatasync``, in a file under ``--dir``: what a durable seal
  waits for whichever process holds the journal.

Percentiles are of single calls, in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import statistics
import struct
import tempfile
import time
from pathlib import Path

import msgspec

LENGTH = struct.Struct("!I")


class Seal(msgspec.Struct, array_like=True):
    run: str
    epoch: int
    row: int
    generation_index: int
    completion_ids: list[int]
    logprobs: list[float]


class Ack(msgspec.Struct, array_like=True):
    ok: bool
    position: int


ENCODER = msgspec.msgpack.Encoder()
SEAL_DECODER = msgspec.msgpack.Decoder(Seal)
ACK_DECODER = msgspec.msgpack.Decoder(Ack)


def request(i: int) -> Seal:
    return Seal("run-0", 0, i, i % 8, list(range(64)), [-0.5] * 64)


class Recorder:
    """The stand-in for the recorder's state: a dict of sealed siblings."""

    def __init__(self) -> None:
        self.sealed: dict[tuple[int, int, int], int] = {}

    def handle(self, seal: Seal) -> Ack:
        key = (seal.epoch, seal.row, seal.generation_index)
        position = self.sealed.setdefault(key, len(self.sealed))
        return Ack(True, position)


def percentiles(samples_ns: list[int]) -> str:
    us = sorted(x / 1000 for x in samples_ns)
    p = lambda q: us[min(len(us) - 1, int(q * len(us)))]  # noqa: E731
    return (
        f"p50 {p(0.50):8.1f}  p90 {p(0.90):8.1f}  p99 {p(0.99):8.1f}  "
        f"mean {statistics.fmean(us):8.1f}  (n={len(us)})"
    )


def bench_in_process(calls: int) -> list[int]:
    recorder = Recorder()
    samples = []
    for i in range(calls):
        start = time.perf_counter_ns()
        seal = SEAL_DECODER.decode(ENCODER.encode(request(i)))
        ACK_DECODER.decode(ENCODER.encode(recorder.handle(seal)))
        samples.append(time.perf_counter_ns() - start)
    return samples


async def serve(path: str, ready: mp.synchronize.Event) -> None:
    recorder = Recorder()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
                seal = SEAL_DECODER.decode(await reader.readexactly(size))
                reply = ENCODER.encode(recorder.handle(seal))
                writer.write(LENGTH.pack(len(reply)) + reply)
        except asyncio.IncompleteReadError:
            writer.close()

    server = await asyncio.start_unix_server(connection, path)
    ready.set()
    async with server:
        await server.serve_forever()


def server_main(path: str, ready: mp.synchronize.Event) -> None:
    asyncio.run(serve(path, ready))


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("server closed")
        data += chunk
    return data


def client_main(path: str, calls: int, start: mp.synchronize.Barrier, out: mp.Queue) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    samples = []
    start.wait()
    for i in range(calls + 200):
        begin = time.perf_counter_ns()
        body = ENCODER.encode(request(i))
        sock.sendall(LENGTH.pack(len(body)) + body)
        (size,) = LENGTH.unpack(recv_exactly(sock, LENGTH.size))
        ACK_DECODER.decode(recv_exactly(sock, size))
        if i >= 200:  # the first 200 warm up
            samples.append(time.perf_counter_ns() - begin)
    sock.close()
    out.put(samples)


def bench_socket(clients: int, calls: int) -> list[int]:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "recorder.sock")
        ready = ctx.Event()
        server = ctx.Process(target=server_main, args=(path, ready), daemon=True)
        server.start()
        try:
            ready.wait()
            start, out = ctx.Barrier(clients), ctx.Queue()
            procs = [
                ctx.Process(target=client_main, args=(path, calls, start, out))
                for _ in range(clients)
            ]
            for proc in procs:
                proc.start()
            samples = [x for _ in procs for x in out.get()]
            for proc in procs:
                proc.join()
        finally:
            server.kill()
            server.join()
    return samples


def bench_fdatasync(directory: Path, calls: int, size: int) -> list[int]:
    line = b"x" * (size - 1) + b"\n"
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        fd = os.open(os.path.join(tmp, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            samples = []
            for _ in range(calls):
                start = time.perf_counter_ns()
                os.write(fd, line)
                os.fdatasync(fd)
                samples.append(time.perf_counter_ns() - start)
        finally:
            os.close(fd)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="where run directories live")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--syncs", type=int, default=500)
    args = parser.parse_args()
    print(f"request: {len(ENCODER.encode(request(1)))} bytes msgpack; times in microseconds")
    print(f"in-process call            {percentiles(bench_in_process(args.calls))}")
    print(f"unix socket, 1 client      {percentiles(bench_socket(1, args.calls))}")
    print(f"unix socket, 8 clients     {percentiles(bench_socket(8, args.calls // 4))}")
    for size in (256, 4096):
        samples = bench_fdatasync(args.dir, args.syncs, size)
        print(f"append {size:4d} B + fdatasync {percentiles(samples)}")


if __name__ == "__main__":
    main()
