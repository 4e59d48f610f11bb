"""The main job's numbers, side by side in one run (issue 8).

1. Checkpoint hold: the longest exclusive barrier hold of ``take_checkpoint`` for a
   ledger like the default job's, then with 10x the ledger and with 10x and 100x the
   bytes stored in the data plane. The checkpoint copies no token rows (they stay in
   the durable store until no retained checkpoint needs them), so the hold should track
   the ledger, not the bytes.
2. One SIGKILL mid-run of the default job: generated tokens reused after the restart
   (sealed siblings in the ledger, finished groups waiting in the replay index) against
   regenerated (seals made after the checkpoint), next to what a restart that discards
   all unfinished work (what other frameworks do) regenerates: all of them.
3. Steps per second of the default job (fresh run, no kill).

Run: ``python benchmarks/bench_run.py [--groups 16] [--repeat 5] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from rollout_recovery.capture import STAGING_PARTITION, assemble_receipt
from rollout_recovery.control import (
    AuditTrail,
    CheckpointStore,
    Controller,
    default_components,
    load_config,
)
from rollout_recovery.control._checkpointing import take_checkpoint  # the measured call
from rollout_recovery.dataplane import SqliteDataPlane


async def _fill(controller: Controller, groups: int, tokens_per_call: int) -> None:
    """``groups`` admitted groups of 4 siblings, 3 sealed with two-call receipts each."""
    ledger, writer = controller.ledger, controller.capture
    for g in range(groups):
        async with controller.barrier.mutation("prompt_reservations") as cut:
            record = ledger.reserve_group(
                cut,
                prompt_id=str(g),
                prompt_payload=controller.dataset[g],
                expected_generations=4,
                target_step=0,
                start_weight_version=0,
                group_id=f"g{g:07d}",
            )
            ledger.mark_group_dispatched(cut, record.group_id)
        for index in range(3):
            rollout_id = record.gate_rollout_id(index)
            prompt = np.arange(tokens_per_call, dtype=np.int32) % 50
            first = writer.stage_call(
                rollout_id=rollout_id,
                model_call_id="c0",
                parent=None,
                prompt_token_ids=prompt,
                generated_token_ids=prompt[:8],
                generated_logprobs=np.full(8, -0.5, dtype=np.float32),
                weight_version=0,
            )
            second_prompt = np.concatenate([prompt, prompt[:8], prompt])
            second = writer.stage_call(
                rollout_id=rollout_id,
                model_call_id="c1",
                parent=first,
                prompt_token_ids=second_prompt,
                generated_token_ids=prompt[:2],
                generated_logprobs=np.full(2, -0.5, dtype=np.float32),
                weight_version=0,
            )
            receipt = assemble_receipt(rollout_id, [first, second], terminal_model_call_id="c1")
            async with controller.barrier.mutation("sibling_seals") as cut:
                ledger.mark_sibling_sealed(
                    cut,
                    record.group_id,
                    generation_index=index,
                    gate_rollout_id=rollout_id,
                    receipt=receipt,
                    reward=1.0,
                    mask_sample=False,
                )


def hold_case(groups: int, tokens_per_call: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        config = load_config(None)
        inner = SqliteDataPlane(run / "dataplane.sqlite")
        audit = AuditTrail(run)
        parts = default_components(config, inner)
        controller = Controller(
            config=config,
            dataset=parts.dataset,
            backend=parts.backend,
            trainer=parts.trainer,
            data_plane=inner,
            audit=audit,
        )
        store = CheckpointStore(run, keep=config.checkpoint.keep)

        async def measure() -> list[float]:
            await _fill(controller, groups, tokens_per_call)
            holds = []
            for _ in range(repeat):
                timing = await take_checkpoint(controller, store)
                holds.append(timing.hold_s)
            await parts.backend.aclose()
            return holds

        holds = asyncio.run(measure())
        stored = sum(p.stat().st_size for p in run.glob("dataplane.sqlite*"))
        # The token bytes themselves (ids, mask, logprobs), without SQLite's page overhead.
        rows = inner.get(STAGING_PARTITION, inner.keys(STAGING_PARTITION))
        token_bytes = sum(
            r.token_ids.nbytes + r.token_mask.nbytes + r.logprobs.nbytes for r in rows
        )
        audit.close()
        inner.close()
    return {
        "groups": groups,
        "tokens_per_call": tokens_per_call,
        "stored_mb": stored / 1e6,
        "token_mb": token_bytes / 1e6,
        "hold_ms_max": max(holds) * 1e3,
        "hold_ms_median": statistics.median(holds) * 1e3,
    }


def _run_cli(out: Path, *, kill_after_step: int | None = None) -> tuple[int, float, str]:
    command = [sys.executable, "-m", "rollout_recovery", "run", "--out", str(out), "--plain"]
    started = time.monotonic()
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert child.stdout is not None
    lines = []
    for line in child.stdout:
        lines.append(line)
        if kill_after_step is not None and line.startswith(f"step {kill_after_step}/"):
            os.killpg(child.pid, signal.SIGKILL)
            break
    child.wait()
    return child.returncode, time.monotonic() - started, "".join(lines)


def kill_case(kill_after_step: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        code, _, _ = _run_cli(out, kill_after_step=kill_after_step)
        assert code == -signal.SIGKILL, code
        code, _, text = _run_cli(out)
        assert code == 0, text
        restored = [
            json.loads(line)
            for line in (out / "events.jsonl").read_text().splitlines()
            if '"restored"' in line
        ][-1]
    reused, lost = restored["tokens_reused"], restored["tokens_lost"]
    buffered = restored["canonical_tokens_kept"]
    return {
        "killed_after_step": kill_after_step,
        "restored_step": restored["step"],
        "sealed_siblings_kept": restored["sealed_siblings_kept"],
        "canonical_groups_kept": restored["canonical_groups"],
        "tokens_reused_sealed": reused,
        "tokens_reused_buffered": buffered,
        "tokens_regenerated": lost,
        # Other frameworks drop buffered and in-flight rollouts: everything sealed or
        # finished but not yet trained is generated again.
        "discard_all_tokens_regenerated": reused + buffered + lost,
    }


def default_job_case() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        code, seconds, text = _run_cli(Path(tmp) / "run")
        assert code == 0, text
    steps = load_config(None).job.steps
    return {"steps": steps, "seconds": seconds, "steps_per_second": steps / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=16, help="groups in the base ledger")
    parser.add_argument("--tokens", type=int, default=256, help="prompt tokens per call (base)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--kill-after-step", type=int, default=12)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    holds = [
        ("base", hold_case(args.groups, args.tokens, args.repeat)),
        ("10x ledger", hold_case(args.groups * 10, args.tokens, args.repeat)),
        ("10x stored bytes", hold_case(args.groups, args.tokens * 10, args.repeat)),
        ("100x stored bytes", hold_case(args.groups, args.tokens * 100, args.repeat)),
    ]
    base = holds[0][1]["hold_ms_max"]
    print("checkpoint hold (exclusive barrier section of take_checkpoint)")
    print(
        f"{'case':<18}{'groups':>8}{'token MB':>10}{'file MB':>9}{'max ms':>9}"
        f"{'median ms':>11}{'vs base':>9}"
    )
    for name, row in holds:
        print(
            f"{name:<18}{row['groups']:>8}{row['token_mb']:>10.2f}{row['stored_mb']:>9.2f}"
            f"{row['hold_ms_max']:>9.2f}"
            f"{row['hold_ms_median']:>11.2f}{row['hold_ms_max'] / base:>8.1f}x"
        )
    kill = kill_case(args.kill_after_step)
    print("\none SIGKILL of the default job, then the same command again")
    for key, value in kill.items():
        print(f"  {key}: {value}")
    saved = kill["discard_all_tokens_regenerated"] / max(1, kill["tokens_regenerated"])
    print(f"  discard-all regenerates {saved:.1f}x the tokens we regenerate")
    job = default_job_case()
    print(
        f"\ndefault job: {job['steps']} steps in {job['seconds']:.1f} s = "
        f"{job['steps_per_second']:.2f} steps/s"
    )
    if args.json:
        args.json.write_text(json.dumps({"holds": dict(holds), "kill": kill, "job": job}, indent=2))


if __name__ == "__main__":
    main()
