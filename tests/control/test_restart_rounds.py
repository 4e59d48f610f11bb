"""A restart never costs a prompt a round, under every reuse policy (issue 24, item 6).

A round a crash interrupts is given back by the restart's ``attempts_abandoned`` (reason
``restart``). With ``[recovery] reuse = "none"`` or ``"ancestors"`` a group whose seals a
restore discards is rewound, and a later restore from the same snapshot used to skip that
record with the rest of the rewound group's work: the round stayed spent, rounds went
1, 1, 2, 2, ... over repeated kills with no failed attempt, and healthy prompts were dropped
"retry budget exhausted". The restart's abandons belong to the restore before them, not to
the group's work, so a replay applies them even for a rewound group.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from rollout_recovery._crashpoints import CRASH_AT_ENV
from rollout_recovery.control._replay import JournalReplay, metadata_only_plane
from rollout_recovery.control._state import ControllerState
from rollout_recovery.dataplane import ReplayIndex
from rollout_recovery.history import JournalEntry, audit_run
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.history.records import (
    AbandonedAttempt,
    AttemptsAbandoned,
    BatchAdmitted,
    FreshAttempt,
    HistoryRecord,
    PromptDropped,
    PromptTaken,
    Restored,
    ReusePolicy,
    RoundStarted,
    Seal,
    SiblingSealed,
)
from rollout_recovery.ledger import RolloutAttemptStatus, RolloutRecoveryLedger
from rollout_recovery.rollout import FailureReason

GROUP = "g0000000"


class _Cut:
    def require_live(self) -> None:
        return None


def _attempt(index: int, number: int) -> str:
    return f"{GROUP}_g{index}_a{uuid.UUID(int=number).hex}"


def _round(first: int) -> RoundStarted:
    return RoundStarted(
        group_id=GROUP,
        round=1,
        dispatched=[FreshAttempt(0, _attempt(0, first)), FreshAttempt(1, _attempt(1, first + 1))],
        weight_version=0,
    )


def _seal(rollout_id: str) -> SiblingSealed:
    receipt = {"rollout_id": rollout_id, "manifest": [{"staging_key": f"{rollout_id}/c0"}]}
    return SiblingSealed(
        group_id=GROUP,
        seal=Seal(
            generation_index=0,
            rollout_id=rollout_id,
            receipt=receipt,
            reward=1.0,
            mask_sample=False,
            tokens=3,
            # A version the restored policy does not descend from: "ancestors" drops it too.
            weight_versions=[7],
        ),
    )


@pytest.mark.parametrize("reuse", [ReusePolicy.NONE, ReusePolicy.ANCESTORS])
def test_a_rewound_group_keeps_the_round_an_earlier_restart_gave_back(reuse: ReusePolicy) -> None:
    """Kill 1 interrupts the group's round (the restart gives it back); the next run seals
    a sibling in the same round; kill 2 restores from the same snapshot, which rewinds
    the group: its round must still be given back."""
    snapshot = 1
    records: list[HistoryRecord] = [
        PromptTaken(
            group_id=GROUP,
            prompt_idx=0,
            position=0,
            batch=0,
            attempts=[_attempt(0, 1), _attempt(1, 2)],
        ),
        BatchAdmitted(batch=0, group_ids=[GROUP], target_step=0, weight_version=0),
        _round(1),
        # Restore 1: nothing sealed after the snapshot, nothing rewound; the restart
        # abandons the interrupted round and gives it back.
        Restored(
            checkpoint="step_000000",
            step=0,
            snapshot_position=snapshot,
            replayed_records=3,
            reuse=reuse,
            groups_in_ledger=1,
            sealed_siblings_kept=0,
            canonical_groups=0,
        ),
        AttemptsAbandoned(
            group_id=GROUP,
            attempts=[
                AbandonedAttempt(0, _attempt(0, 1), FailureReason.RESTART),
                AbandonedAttempt(1, _attempt(1, 2), FailureReason.RESTART),
            ],
        ),
        _round(3),
        _seal(_attempt(0, 3)),
    ]
    entries = [
        JournalEntry(offset=snapshot + n, line=n + 1, record=r) for n, r in enumerate(records)
    ]
    ledger = RolloutRecoveryLedger()
    state = ControllerState.initial(0)
    JournalReplay(
        ledger=ledger,
        replay=ReplayIndex(data_plane=metadata_only_plane(), group_size=2),
        state=state,
        journal=Path("events.jsonl"),
    ).restore(_Cut(), entries, snapshot_position=snapshot, reuse=reuse)

    siblings = ledger.get_group(GROUP).siblings
    assert [s.current_attempt.status for s in siblings] == [RolloutAttemptStatus.ABANDONED] * 2
    assert state.rounds_used.get(GROUP, 0) == 0, "a restart cost the prompt a round"


@pytest.mark.slow
def test_repeated_kills_spend_no_round_of_a_healthy_prompt(
    tmp_path: Path,
    write_config: Callable[..., Path],
    run_cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """Real SIGKILLs (a fsync crash point), six in a row, each restoring the bootstrap
    checkpoint with ``reuse = "none"``; no attempt ever fails, so every round is a first
    round and no prompt is dropped."""
    config = write_config(
        {
            "job": {
                "steps": 3,
                "prompts_per_step": 2,
                "generations_per_prompt": 2,
                "staleness_window": 1,
                "seed": 3,
            },
            "generation": {"call_latency_s": 0.002},
            "retry": {"max_rounds": 3, "backoff_s": 0.0},
            "checkpoint": {"every_steps": 50},
            "recovery": {"reuse": "none"},
        },
        fast=False,
        faults_off=True,
    )
    out = tmp_path / "run"
    args = ["--out", str(out), "--config", str(config), "--plain"]
    for _ in range(6):
        killed = run_cli(args, env={CRASH_AT_ENV: "journal.after_fsync:3"})
        assert killed.returncode == -9, killed.stdout
    finished = run_cli(args)
    assert finished.returncode == 0, finished.stdout

    records = [entry.record for entry in read_entries(out / "events.jsonl")]
    assert sum(isinstance(r, Restored) for r in records) == 6
    assert any(
        isinstance(r, AttemptsAbandoned) and r.attempts[0].reason is FailureReason.RESTART
        for r in records
    ), "no kill interrupted a round: the test tests nothing"
    rounds = sorted({(r.group_id, r.round) for r in records if isinstance(r, RoundStarted)})
    assert all(number == 1 for _, number in rounds), f"restarts spent rounds: {rounds}"
    assert not [r for r in records if isinstance(r, PromptDropped)]
    assert audit_run(out).ok
