"""Child process for test_sqlite_crash.py: put rows forever, acknowledge each on stdout.

Usage: python crash_writer.py DB_PATH

Row ``i`` is ``crash_row(i)``: its bytes follow from ``i`` alone, so the parent can check
any row it finds after the kill. One line ``ack {i}`` is printed (and flushed) only after
``put`` returned, which is the durability promise under test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from rollout_recovery.dataplane import Row, SqliteDataPlane

PARTITION = "staging"


def crash_key(i: int) -> str:
    return f"rollout-{i:05d}/call-0"


def crash_row(i: int) -> Row:
    # Rows between 4 KiB and about 1.5 MiB, so kills land inside multi-page writes.
    n = 1024 + (i * 7919) % 131_072
    ids = (np.arange(n, dtype=np.int64) * 31 + i).astype(np.int32)
    return Row(
        token_ids=ids,
        token_mask=((ids % 3) == 0).astype(np.float32),
        logprobs=(-(ids % 101) / 100.0).astype(np.float32),
        metadata={"i": i, "n": n, "rollout_id": crash_key(i).split("/")[0]},
    )


def main() -> None:
    store = SqliteDataPlane(Path(sys.argv[1]))
    # A restarted writer continues after the rows already present.
    i = len(store.keys(PARTITION))
    print("ready", flush=True)
    while True:
        store.put(PARTITION, {crash_key(i): crash_row(i)})
        print(f"ack {i}", flush=True)
        i += 1


if __name__ == "__main__":
    main()
