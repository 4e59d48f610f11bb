"""The snapshot after the checkpoint's hold against the ledger's size: full encode against
incremental, and the snapshot against the write of its files, side by side in one run.

The snapshot builder follows the journal and encodes its state at each checkpoint. Before,
``snapshot()`` encoded the whole ledger every time (the full encode, reproduced here from
the same public calls: it also joins the file and computes its SHA-256); now it re-encodes
only the groups the records since the previous snapshot touched (``IncrementalSidecar``)
and hands the sidecar out as its parts, neither joined nor checksummed. Both run on the
same builder at the same positions, and their bytes are checked equal.

Two parts of a checkpoint's commit are timed apart. The snapshot (``snapshot ms``) is
what the commit waits for before it can write: the goal is that it stays flat whatever the
ledger's size. The write (``write ms``, ``CheckpointStore.save`` of the sidecar: the
payload's SHA-256, the file written with ``writev`` and hashed for the manifest as it is
written, fsync, rename) is O(bytes) by nature; with ``[checkpoint] background = true`` (the
default) it runs while the next steps train, with ``false`` the step waits for it too. The
full snapshot's bytes are written the way they were before (one buffer), the incremental
one's as its parts, and the file written from the parts is read back and compared.

For each ledger size: ``G`` admitted groups of 4 siblings, 3 sealed with a one-call receipt
(``bench_checkpoint_hold.py``'s ledger), then ``--repeat`` rounds, each ``--seals`` live
seals through the controller (journaled and flushed), the builder's ``advance_to`` (the
replay of the new records, timed apart), and one snapshot each way. The first snapshot
(which fills the cache, a full encode) is not counted. The ledger's replay index is
empty there; a second table times the
replay index's saved state alone at the same sizes (``G`` canonical groups, ``--seals``
of them trained and as many published between snapshots), full against kept entries.

Run: ``python benchmarks/bench_snapshot.py --groups 160,5000,50000 [--repeat 5]
[--seals 16] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_checkpoint_hold import _controller, _fill, _live_seals

from rollout_recovery._settings import config_to_builtins
from rollout_recovery.checkpoint import SidecarFormat
from rollout_recovery.control._snapshot import Snapshot, SnapshotBuilder
from rollout_recovery.control._state import encode_controller_state
from rollout_recovery.dataplane import MemoryDataPlane, ReplayIndex
from rollout_recovery.rewards import CaptureRewardSettings
from rollout_recovery.rundir import CheckpointStore


def full_snapshot(
    builder: SnapshotBuilder, settings: CaptureRewardSettings, config: dict[str, Any]
) -> Snapshot:
    """``SnapshotBuilder.snapshot`` as it was before the incremental encoder: everything
    encoded from the builder's state."""
    replay, ledger = builder.replay, builder.ledger
    format = SidecarFormat.NATIVE
    sidecar = format.encode_checkpoint(
        ledger,
        batch_shortfall=dict(builder.state.shortfall),
        sampler_stamps_target_steps=True,
        finalizer_metrics_by_group=replay.metrics_by_group(),
        reward_settings=settings,
        canonical_group_ids=set(replay.group_ids()),
    )
    state = copy.copy(builder.state)
    state.config = config
    state.identity = "bench"
    return Snapshot(
        position=builder.position,
        step=state.step,
        weight_version=state.weight_version,
        sidecar_name=format.filename,
        sidecar=sidecar,
        replay_state=msgspec.msgpack.encode(replay.state_dict()),
        controller_state=encode_controller_state(state),
        expected_staging=frozenset(ledger.expected_staging_keys()),
        canonical_keys=frozenset(replay.row_keys()),
    )


def _timed(call: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = call()
    return (time.perf_counter() - started) * 1e3, result


def measure(groups: int, repeat: int, seals: int) -> dict[str, Any]:
    settings = CaptureRewardSettings()
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
        controller = _controller(Path(tmp), groups)
        config = config_to_builtins(controller.config)

        async def filled() -> None:
            await _fill(controller, groups)
            controller.follow_journal()

        asyncio.run(filled())
        builder = controller.checkpoints.snapshots
        assert builder is not None
        # Only the sidecar is written: the other files are O(replay index), not O(ledger).
        store = CheckpointStore(Path(tmp) / "written", keep=1)

        def write(snapshot: Snapshot) -> Path:
            return store.save(snapshot.step, {snapshot.sidecar_name: snapshot.sidecar})

        def snapshot() -> Snapshot:
            return builder.snapshot(
                sidecar_format="native", settings=settings, config=config, identity="bench"
            )

        first_ms, _ = _timed(snapshot)  # fills the cache: a full encode
        rows: list[dict[str, float]] = []
        for round_ in range(repeat):
            count = min(seals, groups // repeat)

            async def sealed(start: int = round_ * count, count: int = count) -> None:
                await _live_seals(controller, start, count)
                await controller.history.flush()

            asyncio.run(sealed())
            followed = builder.records_followed
            advance_ms, _ = _timed(lambda: builder.advance_to(controller.history.position))
            incremental_ms, incremental = _timed(snapshot)
            full_ms, full = _timed(lambda: full_snapshot(builder, settings, config))
            if incremental != full:
                raise SystemExit(f"{groups} groups: the incremental snapshot is not a full one")
            full_write_ms, _ = _timed(lambda: write(full))  # noqa: B023
            write_ms, path = _timed(lambda: write(incremental))  # noqa: B023
            if (path / full.sidecar_name).read_bytes() != full.sidecar:
                raise SystemExit(f"{groups} groups: the sidecar written from parts differs")
            rows.append(
                {
                    "records": builder.records_followed - followed,
                    "advance_ms": advance_ms,
                    "incremental_ms": incremental_ms,
                    "full_ms": full_ms,
                    "write_ms": write_ms,
                    "full_write_ms": full_write_ms,
                    "sidecar_mb": len(bytes(full.sidecar)) / 1e6,
                }
            )
        asyncio.run(controller.backend.aclose())
        controller.history.close()

    def median(key: str) -> float:
        return statistics.median(row[key] for row in rows)

    return {
        "groups": groups,
        "records_per_snapshot": median("records"),
        "first_snapshot_ms": first_ms,
        "advance_ms": median("advance_ms"),
        "full_ms": median("full_ms"),
        "incremental_ms": median("incremental_ms"),
        "full_over_incremental": median("full_ms") / median("incremental_ms"),
        "write_ms": median("write_ms"),
        "full_write_ms": median("full_write_ms"),
        "sidecar_mb": median("sidecar_mb"),
        "full_encodes": builder._sidecar.full_encodes,
    }


class _Cut:
    def require_live(self) -> None:
        return None


def measure_replay(groups: int, repeat: int, changes: int) -> dict[str, Any]:
    """The replay index's saved state with ``groups`` canonical groups, after ``changes``
    groups trained and as many published: ``msgspec.msgpack.encode(state_dict())`` (the
    full encode) against ``encoded_state()`` (each group's entries kept)."""
    cut, size = _Cut(), 4
    index = ReplayIndex(data_plane=MemoryDataPlane(), group_size=size)
    taken = 0

    def publish() -> None:
        nonlocal taken
        group_id = f"c{taken:07d}"
        taken += 1
        index.reserve(cut, group_id)
        index.commit(
            cut,
            group_id,
            [f"{group_id}/{i}" for i in range(size)],
            target_step=taken // 64,
            min_weight_version=0,
            max_weight_version=1,
            metrics={"reward_mean": 0.5, "length": 12.0},
        )

    for _ in range(groups):
        publish()
    index.encoded_state()
    rows = []
    for _ in range(repeat):
        trained = index.group_ids()[:changes]
        index.claim(cut, 0, trained)
        index.clear(cut, trained)
        for _ in range(changes):
            publish()
        incremental_ms, incremental = _timed(index.encoded_state)
        full_ms, full = _timed(lambda: msgspec.msgpack.encode(index.state_dict()))
        if incremental != full:
            raise SystemExit(f"{groups} canonical groups: encoded_state is not state_dict's")
        rows.append((full_ms, incremental_ms))
    full_ms = statistics.median(row[0] for row in rows)
    incremental_ms = statistics.median(row[1] for row in rows)
    return {
        "canonical_groups": groups,
        "full_ms": full_ms,
        "incremental_ms": incremental_ms,
        "full_over_incremental": full_ms / incremental_ms,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="160,5000,50000", help="ledger sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=5, help="snapshots per size")
    parser.add_argument("--seals", type=int, default=16, help="live seals before each snapshot")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    rows = []
    sizes = [int(text) for text in args.groups.split(",")]
    for groups in sizes:
        print(f"measuring {groups} groups ...", file=sys.stderr)
        rows.append(measure(groups, args.repeat, args.seals))
    base = rows[0]["incremental_ms"]
    for row in rows:
        row["incremental_vs_smallest"] = row["incremental_ms"] / base
    replay = [measure_replay(groups, args.repeat, args.seals) for groups in sizes]
    if args.json:
        print(json.dumps({"ledger": rows, "replay_index": replay}, indent=2))
        return 0
    print(
        f"{'':>29}{'snapshot after the hold (goal: flat)':^44}"
        f"{'write: background, O(bytes)':^28}"
    )
    print(
        f"{'groups':>8}{'records':>9}{'advance ms':>12}{'full ms':>10}{'incr. ms':>10}"
        f"{'full/incr':>11}{'incr vs 160':>13}{'full ms':>10}{'parts ms':>10}{'MB':>8}"
    )
    for row in rows:
        print(
            f"{row['groups']:>8}{row['records_per_snapshot']:>9.0f}{row['advance_ms']:>12.1f}"
            f"{row['full_ms']:>10.1f}{row['incremental_ms']:>10.2f}"
            f"{row['full_over_incremental']:>10.1f}x{row['incremental_vs_smallest']:>12.1f}x"
            f"{row['full_write_ms']:>10.1f}{row['write_ms']:>10.1f}{row['sidecar_mb']:>8.1f}"
        )
    print(f"\n{'canonical':>10}{'full ms':>10}{'incr. ms':>10}{'full/incr':>11}")
    for row in replay:
        print(
            f"{row['canonical_groups']:>10}{row['full_ms']:>10.1f}{row['incremental_ms']:>10.1f}"
            f"{row['full_over_incremental']:>10.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
