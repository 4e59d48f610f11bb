"""``rollout-recovery demo``: one small ledger through failure, checkpoint and restart.

Two prompt groups from one dataloader batch, one at sibling granularity and one atomic,
walk through every ledger transition a real run makes, under a real checkpoint barrier. A
table after each step shows every group, sibling and attempt, so a reader can see sealed
work survive a worker failure and a full restart while unfinished work gets fresh attempts.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table

from ..checkpoint import SidecarFormat, write_sidecar
from ..dataplane import DataPlaneCheckpointBarrier, DataPlaneMutationCut
from ..ledger import (
    ROLLOUT_RECOVERY_STATE_FILENAME,
    PromptGroupRecoveryRecord,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    SiblingSealResult,
    build_rollout_recovery_state,
    parse_rollout_recovery_state,
)
from ..rewards import RewardChecks

__all__ = ["demo"]

# A stand-in dataset: the ledger persists only the prompt's index and rebinds the prompt
# from here after the restart.
DATASET: dict[int, dict[str, Any]] = {
    7: {"idx": 7, "task_name": "math", "prompt": "What is 12 * 7?"},
    8: {"idx": 8, "task_name": "math", "prompt": "Factor x^2 - 9."},
}
GROUP_A = "prompt-7"
GROUP_B = "prompt-8"

_STATUS_STYLE = {
    RolloutAttemptStatus.RESERVED: "dim",
    RolloutAttemptStatus.DISPATCHED: "yellow",
    RolloutAttemptStatus.SEALED: "green",
    RolloutAttemptStatus.FAILED: "red",
    RolloutAttemptStatus.ABANDONED: "red",
}


def _receipt(gate_id: str, calls: int = 2) -> dict[str, Any]:
    return {
        "rollout_id": gate_id,
        "manifest": [{"staging_key": f"{gate_id}/call-{c}"} for c in range(calls)],
    }


class _Demo:
    def __init__(self, console: Console, out_dir: Path) -> None:
        self.console = console
        self.out_dir = out_dir
        self.barrier = DataPlaneCheckpointBarrier()
        self.ledger = RolloutRecoveryLedger()
        self.step = 0

    def show(self, title: str, note: str) -> None:
        self.step += 1
        table = Table(
            title=f"step {self.step}: {title}",
            box=box.SIMPLE_HEAD if self.console.is_terminal else box.ASCII,
            title_justify="left",
        )
        table.add_column("group (granularity, phase, status)")
        table.add_column("sibling")
        table.add_column("attempts, oldest first (uuid prefix:status)")
        table.add_column("staged keys", justify="right")
        for group in self.ledger.groups():
            self._add_group_rows(table, group)
        self.console.print(table)
        self.console.print(f"  {note}")
        keys = sorted(self.ledger.expected_staging_keys())
        self.console.print(f"  ledger owns {len(keys)} staged rows\n")

    def _add_group_rows(self, table: Table, group: PromptGroupRecoveryRecord) -> None:
        header = "\n".join(
            (
                group.group_id,
                f"{group.recovery_granularity.value}, {group.phase.value}",
                group.status.value,
            )
        )
        for sibling in group.siblings:
            chain = " -> ".join(
                f"[{_STATUS_STYLE[a.status]}]{a.attempt_id[:6]}:{a.status.value}[/]"
                for a in sibling.attempts
            )
            index = sibling.generation_index
            table.add_row(
                header if index == 0 else "",
                f"g{index}",
                chain,
                str(len(sibling.current_attempt.staging_keys)),
            )
        table.add_section()

    def _seal_siblings(
        self, cut: DataPlaneMutationCut, group_id: str, rewards: dict[int, float]
    ) -> None:
        """Seal the given siblings as a worker's streamed results would arrive."""
        group = self.ledger.get_group(group_id)
        for index, reward in rewards.items():
            gate_id = group.gate_rollout_id(index)
            self.ledger.mark_sibling_sealed(
                cut,
                group_id,
                generation_index=index,
                gate_rollout_id=gate_id,
                receipt=_receipt(gate_id),
                reward=reward,
                mask_sample=False,
                reward_checks=RewardChecks(
                    duplicated_reasoning=False, empty_final_answer=False, low_effort=False
                ),
            )

    async def run(self) -> None:
        async with self.barrier.mutation(kind="prompt_reservations") as cut:
            for prompt_idx, group_id, granularity, siblings in (
                (7, GROUP_A, RecoveryGranularity.SIBLING, 4),
                (8, GROUP_B, RecoveryGranularity.PROMPT_GROUP, 2),
            ):
                self.ledger.reserve_group(
                    cut,
                    prompt_id=str(prompt_idx),
                    prompt_payload=DATASET[prompt_idx],
                    expected_generations=siblings,
                    target_step=None,
                    start_weight_version=0,
                    recovery_granularity=granularity,
                    admitted=False,
                    group_id=group_id,
                    admission_id="batch-0",
                )
        self.show(
            "reserve",
            "The dataloader yielded two prompts; the ledger owns them before any sampler decision.",
        )

        async with self.barrier.mutation(kind="prompt_reservations") as cut:
            for group_id in (GROUP_A, GROUP_B):
                self.ledger.mark_group_admitted(
                    cut, group_id, target_step=0, start_weight_version=0
                )
                self.ledger.mark_group_dispatched(cut, group_id)
        self.show("admit and dispatch", "Every sibling runs on a generation worker.")

        async with self.barrier.mutation(kind="sibling_seals") as cut:
            self._seal_siblings(cut, GROUP_A, {0: 1.0, 1: 0.0})
        self.show("partial seal", "Two siblings of prompt-7 finished; their receipts are sealed.")

        async with self.barrier.mutation(kind="recovery_retries") as cut:
            self.ledger.abandon_unsealed(cut, GROUP_A)
        self.show(
            "worker failure",
            "The worker running prompt-7 g2 and g3 died: those attempts are abandoned; the "
            "sealed siblings stay.",
        )

        async with self.barrier.mutation(kind="recovery_retries") as cut:
            self.ledger.prepare_incomplete_retry(cut, GROUP_A)
            self.ledger.mark_group_dispatched(cut, GROUP_A, generation_indices=[2, 3])
        self.show("retry", "Fresh attempts (new UUIDs) for g2 and g3 only, dispatched again.")

        sidecar_path = self.out_dir / ROLLOUT_RECOVERY_STATE_FILENAME
        async with self.barrier.checkpoint() as cut:
            cut.require_live()
            state = build_rollout_recovery_state(
                self.ledger, batch_shortfall={}, sampler_stamps_target_steps=True
            )
            write_sidecar(sidecar_path, state, format="pt")
        self.show(
            "checkpoint",
            f"The checkpoint barrier drained mutations and wrote {sidecar_path} "
            f"({sidecar_path.stat().st_size} bytes, readable by torch.load(weights_only=True)).",
        )

        # The process dies here. A new controller starts from the file alone.
        self.ledger = RolloutRecoveryLedger()
        self.barrier = DataPlaneCheckpointBarrier()
        parsed = parse_rollout_recovery_state(SidecarFormat.decode(sidecar_path.read_bytes())[1])
        async with self.barrier.mutation(kind="recovery_restore") as cut:
            self.ledger.load_state_dict(cut, parsed.ledger_state)
            self.ledger.prepare_for_restart(cut)
            for group in self.ledger.groups():
                self.ledger.bind_runtime_prompt(
                    cut, group.group_id, DATASET[int(group.prompt_ref.sample_id)]
                )
        self.show(
            "restart",
            "A new process loaded the sidecar. In-flight attempts are abandoned; prompt-7's "
            "sealed siblings are kept; atomic prompt-8 abandons its whole cohort.",
        )

        async with self.barrier.mutation(kind="recovery_retries") as cut:
            for group_id in (GROUP_A, GROUP_B):
                self.ledger.prepare_incomplete_retry(cut, group_id)
                reserved = [
                    s.generation_index
                    for s in self.ledger.get_group(group_id).siblings
                    if s.current_attempt.status is RolloutAttemptStatus.RESERVED
                ]
                self.ledger.mark_group_dispatched(cut, group_id, generation_indices=reserved)
        self.show("redispatch", "Only unfinished siblings get new attempts and run again.")

        async with self.barrier.mutation(kind="sibling_seals") as cut:
            self._seal_siblings(cut, GROUP_A, {2: 1.0, 3: 1.0})
            group_b = self.ledger.get_group(GROUP_B)
            self.ledger.mark_group_sealed(
                cut,
                GROUP_B,
                {
                    0: SiblingSealResult(
                        gate_rollout_id=group_b.gate_rollout_id(0),
                        receipt=_receipt(group_b.gate_rollout_id(0)),
                        reward=1.0,
                        mask_sample=False,
                    ),
                    # A terminal capture failure: sealed without a receipt, it becomes a
                    # masked placeholder row at finalization.
                    1: SiblingSealResult(
                        gate_rollout_id=group_b.gate_rollout_id(1),
                        receipt=None,
                        reward=0.0,
                        mask_sample=True,
                    ),
                },
            )
        self.show(
            "last seals",
            "Both groups are READY_TO_FINALIZE: exactly N sealed siblings each, no sibling "
            "generated twice after it sealed.",
        )


@click.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory for the checkpoint file (default: a temporary directory).",
)
def demo(out_dir: Path | None) -> None:
    """Walk a small ledger through failure, checkpoint and restart, step by step."""
    # Off a terminal (a log, a pipe) rich would wrap at 80 columns; the table needs ~100.
    probe = Console()
    console = probe if probe.is_terminal else Console(width=110)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        asyncio.run(_Demo(console, out_dir).run())
        return
    with tempfile.TemporaryDirectory(prefix="rollout-recovery-demo-") as temporary:
        asyncio.run(_Demo(console, Path(temporary)).run())
