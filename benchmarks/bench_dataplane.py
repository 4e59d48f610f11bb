"""Put and get of long token rows through the SQLite data plane vs. a plain fsynced file.

Standalone (never part of the test run)::

    python benchmarks/bench_dataplane.py [--rows 64] [--tokens 131072] [--batch 1]

Both sides handle the same bytes per row (int32 ids, float32 mask, float32 logprobs) with
the same durability: the plain file appends a row's three arrays and fsyncs before the next
row, the store commits one transaction per ``put`` (WAL + synchronous=FULL). Reads go back
through each side's normal path into fresh numpy arrays. Prints a table and writes JSON to
``benchmarks/results/``.

Two things move the numbers on a shared VM: the speed of fsync at the moment (best of N is
the headline, medians go to the JSON), and glibc handing freed megabyte buffers back to the
OS between gets, which turns every SQLite get into page faults when the caller still holds
the previous row. ``MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456``
removes the second effect and shows the store's own cost.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rollout_recovery.dataplane._protocol import Row
from rollout_recovery.dataplane._sqlite import SqliteDataPlane

RESULTS = Path(__file__).resolve().parent / "results"


def make_rows(count: int, tokens: int, seed: int = 0) -> list[Row]:
    rng = np.random.default_rng(seed)
    return [
        Row(
            token_ids=rng.integers(0, 150_000, tokens, dtype=np.int32),
            token_mask=(rng.random(tokens) < 0.7).astype(np.float32),
            logprobs=-rng.random(tokens, dtype=np.float32),
            metadata={"rollout_id": f"g{i}_g0_a{i:032x}", "model_call_id": f"c{i}", "wv": 3},
        )
        for i in range(count)
    ]


def timed(action: Callable[[], None]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def bench_sqlite(workdir: Path, rows: list[Row], batch: int) -> tuple[float, float]:
    store = SqliteDataPlane(workdir / "store.sqlite3")
    keys = [f"rollout-{i}/call-0" for i in range(len(rows))]

    def put_all() -> None:
        for start in range(0, len(rows), batch):
            store.put(
                "staging",
                dict(zip(keys[start : start + batch], rows[start : start + batch], strict=True)),
            )

    def get_all() -> None:
        for key, row in zip(keys, rows, strict=True):
            (got,) = store.get("staging", [key])
            assert got.token_ids.shape == row.token_ids.shape

    put_s = timed(put_all)
    get_s = timed(get_all)
    store.close()
    return put_s, get_s


def bench_plain(workdir: Path, rows: list[Row]) -> tuple[float, float]:
    path = workdir / "rows.bin"
    offsets: list[tuple[int, int, int]] = []

    def put_all() -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            offset = 0
            for row in rows:
                n = row.token_ids.shape[0]
                for array in (row.token_ids, row.token_mask, row.logprobs):
                    view = np.ascontiguousarray(array).data.cast("B")
                    while view:
                        view = view[os.write(fd, view) :]
                os.fsync(fd)
                offsets.append((offset, n, n * 12))
                offset += n * 12
        finally:
            os.close(fd)

    def get_all() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            for offset, n, size in offsets:
                data = os.pread(fd, size, offset)
                ids = np.frombuffer(data, dtype=np.int32, count=n).copy()
                mask = np.frombuffer(data, dtype=np.float32, count=n, offset=4 * n).copy()
                logprobs: npt.NDArray[np.float32] = np.frombuffer(
                    data, dtype=np.float32, count=n, offset=8 * n
                ).copy()
                assert ids.shape == mask.shape == logprobs.shape
        finally:
            os.close(fd)

    return timed(put_all), timed(get_all)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=131_072)
    parser.add_argument("--batch", type=int, default=1, help="rows per SQLite put")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    args = parser.parse_args(argv)

    rows = make_rows(args.rows, args.tokens)
    row_bytes = args.tokens * 12
    total_mb = args.rows * row_bytes / 1e6
    runs: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        # Fresh files each run and the two sides interleaved, so neither benefits from
        # the other's warm-up or suffers a noisier moment of the disk alone.
        with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
            workdir = Path(scratch)
            (workdir / "sqlite").mkdir()
            (workdir / "plain").mkdir()
            timings = dict(
                zip(
                    ("sqlite_put", "sqlite_get"),
                    bench_sqlite(workdir / "sqlite", rows, args.batch),
                    strict=True,
                )
            )
            timings.update(
                zip(("plain_put", "plain_get"), bench_plain(workdir / "plain", rows), strict=True)
            )
        for name, seconds in timings.items():
            runs.setdefault(name, []).append(seconds)
    # Best of N is the headline (this machine is shared and noisy); medians go to the JSON.
    best = {name: min(values) for name, values in runs.items()}
    median = {name: statistics.median(values) for name, values in runs.items()}

    table = []
    for op in ("put", "get"):
        sqlite_s, plain_s = best[f"sqlite_{op}"], best[f"plain_{op}"]
        table.append(
            {
                "op": op,
                "sqlite_rows_per_s": args.rows / sqlite_s,
                "sqlite_mb_per_s": total_mb / sqlite_s,
                "plain_rows_per_s": args.rows / plain_s,
                "plain_mb_per_s": total_mb / plain_s,
                "ratio": plain_s / sqlite_s,
                "median_ratio": median[f"plain_{op}"] / median[f"sqlite_{op}"],
            }
        )

    print(
        f"{args.rows} rows x {args.tokens} tokens ({row_bytes / 2**20:.2f} MiB/row), "
        f"{args.batch} row(s) per put, best of {args.repeat}"
    )
    header = (
        f"{'op':<4} {'sqlite rows/s':>14} {'sqlite MB/s':>12} {'plain rows/s':>13} "
        f"{'plain MB/s':>11} {'sqlite/plain':>13} {'median ratio':>13}"
    )
    print(header)
    for line in table:
        print(
            f"{line['op']:<4} {line['sqlite_rows_per_s']:>14.1f} {line['sqlite_mb_per_s']:>12.1f} "
            f"{line['plain_rows_per_s']:>13.1f} {line['plain_mb_per_s']:>11.1f} "
            f"{line['ratio']:>13.2f} {line['median_ratio']:>13.2f}"
        )

    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out = RESULTS / f"bench_dataplane-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "benchmark": "bench_dataplane",
                "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "row_bytes": row_bytes,
                "python": sys.version.split()[0],
                "sqlite": sqlite3.sqlite_version,
                "numpy": np.__version__,
                "platform": platform.platform(),
                "seconds": best,
                "runs_seconds": runs,
                # glibc returning freed megabyte buffers to the OS dominates get; see the report.
                "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
                "table": table,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
