"""The golden journal replays, through the one transition of each record, to exactly the
state the live run had; an altered copy of it does not (issue 25, item 1).

``tests/fixtures/transitions/make_golden.py`` recorded ``events.jsonl`` from a real run
(faults, cohorts, two kills and restores with ``reuse = "none"``, a drain) and
``live_state.msgpack`` from the live objects of its last process. Like Temporal's replay
tests, which keep a complete history and a nondeterministic one, the altered copies are
histories the code that wrote them would never write: one a transition refuses (naming
its line), one that applies but to a state the run never had.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from rollout_recovery.control._replay import JournalReplay, ReplayError, metadata_only_plane
from rollout_recovery.control._state import ControllerState
from rollout_recovery.dataplane import ReplayIndex
from rollout_recovery.history import JournalEntry
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.history.records import (
    AttemptsAbandoned,
    BatchAdmitted,
    GroupPublished,
    GroupSealed,
    PromptTaken,
    Restored,
    RoundStarted,
    SiblingSealed,
    StepTrained,
)
from rollout_recovery.ledger import RolloutRecoveryLedger

GOLDEN = Path(__file__).parents[1] / "fixtures" / "transitions"
JOURNAL = GOLDEN / "events.jsonl"
GROUP_SIZE = 2  # the golden job's generations_per_prompt


class _Cut:
    def require_live(self) -> None:
        return None


def replayed(entries: list[JournalEntry]) -> dict[str, Any]:
    """The state a replay of ``entries`` from the journal's first line arrives at."""
    ledger = RolloutRecoveryLedger()
    replay = ReplayIndex(data_plane=metadata_only_plane(), group_size=GROUP_SIZE)
    state = ControllerState.initial(0)
    JournalReplay(ledger=ledger, replay=replay, state=state, journal=JOURNAL).follow(
        _Cut(), entries
    )
    return {
        "ledger": ledger.state_dict(),
        "replay": replay.state_dict(),
        "controller": comparable(msgspec.to_builtins(state)),
    }


def comparable(controller: dict[str, Any]) -> dict[str, Any]:
    """A controller state without what no record carries: the job's config and identity,
    which a checkpoint stamps on the state it writes."""
    return {**controller, "config": {}, "identity": ""}


def live() -> dict[str, Any]:
    saved = msgspec.msgpack.decode((GOLDEN / "live_state.msgpack").read_bytes())
    assert isinstance(saved, dict)
    return {**saved, "controller": comparable(saved["controller"])}


def test_the_golden_journal_holds_what_it_must_exercise() -> None:
    records = [entry.record for entry in read_entries(JOURNAL)]
    kinds = {type(record) for record in records}
    assert {PromptTaken, BatchAdmitted, RoundStarted, SiblingSealed, GroupSealed} <= kinds
    assert {AttemptsAbandoned, GroupPublished, StepTrained, Restored} <= kinds
    restores = [r for r in records if isinstance(r, Restored)]
    assert len(restores) == 2 and restores[0].rolled_back_steps and restores[1].discarded
    # The live process ended mid-run: a ledger and a replay index with work in them.
    state = live()
    assert state["ledger"]["groups"] and state["replay"]["groups"]


def test_the_golden_journal_replays_to_the_live_state() -> None:
    assert replayed(read_entries(JOURNAL)) == live()


def _altered(index: int, record: Any) -> list[JournalEntry]:
    entries = read_entries(JOURNAL)
    entry = entries[index]
    return [
        *entries[:index],
        JournalEntry(offset=entry.offset, line=entry.line, record=record),
        *entries[index + 1 :],
    ]


def test_a_seal_of_an_attempt_never_dispatched_is_refused_naming_its_line() -> None:
    entries = read_entries(JOURNAL)
    index = max(i for i, e in enumerate(entries) if isinstance(e.record, SiblingSealed))
    sealed = entries[index].record
    assert isinstance(sealed, SiblingSealed)
    stranger = sealed.seal.rollout_id[:-32] + "f" * 32
    seal = msgspec.structs.replace(
        sealed.seal, rollout_id=stranger, receipt={**sealed.seal.receipt, "rollout_id": stranger}
    )
    altered = _altered(index, msgspec.structs.replace(sealed, seal=seal))
    with pytest.raises(ReplayError, match=rf"events\.jsonl:{entries[index].line} .*identity"):
        replayed(altered)


def test_a_step_that_claims_a_row_it_never_trained_diverges_from_the_live_state() -> None:
    entries = read_entries(JOURNAL)
    index = max(i for i, e in enumerate(entries) if isinstance(e.record, StepTrained))
    step = entries[index].record
    assert isinstance(step, StepTrained)
    altered = _altered(index, msgspec.structs.replace(step, valid_rows=step.valid_rows + 1))
    state = replayed(altered)
    assert state["ledger"] == live()["ledger"]
    assert state["controller"] != live()["controller"]
