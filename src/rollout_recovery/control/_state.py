"""The controller's persisted state: one versioned Struct, beside the NeMo-RL sidecar.

The sidecar's schema is closed (NeMo-RL reads it), so what only the controller needs goes
in ``controller_state.msgpack``: the training step, the dataloader cursor, the retry rounds
each group used, the step shortfall, the weight versions, the run counters and the job's
configuration. The controller holds exactly one :class:`ControllerState`; it changes only
by folding in the records the run journals (:meth:`ControllerState.apply`, called by each
record's one transition, ``_transitions.py``); a checkpoint encodes it whole. Decoding is
strict, so a damaged or foreign file is refused with the field path at fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, assert_never

import msgspec

from .._messages import split_validation_path
from ..errors import InvalidStateError
from ..history import records
from ..rollout import FailureReason
from . import _logprob_check

__all__ = [
    "CONTROLLER_STATE_VERSION",
    "ControllerState",
    "RunCounters",
    "decode_controller_state",
    "encode_controller_state",
]

CONTROLLER_STATE_VERSION = 3

#: Abandon reasons that say nothing about the work (the process or its backend stopped
#: under it): the round goes back to the group's budget.
_NOT_RETRIES = frozenset({FailureReason.RESTART, FailureReason.DRAIN, FailureReason.BACKEND_CLOSED})


class RunCounters(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Totals over the whole run (across restarts), for the summary."""

    prompts_taken: int = 0
    prompts_trained: int = 0
    prompts_dropped: int = 0
    attempts: int = 0
    retries: int = 0
    siblings_reused: int = 0
    checkpoints: int = 0
    #: Generated tokens of sealed attempts (calls continued from a lost attempt excluded).
    tokens_generated: int = 0
    #: Calls (and their generated tokens) sealed attempts continued from lost attempts of
    #: their siblings instead of generating them again (call-level resume).
    calls_resumed: int = 0
    tokens_resumed: int = 0
    rows_trained: int = 0
    valid_rows_trained: int = 0
    longest_checkpoint_stall_us: int = 0
    longest_checkpoint_hold_us: int = 0


class ControllerState(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything the controller needs to continue a run from a checkpoint.

    Every field is required in a file: a state missing one is refused, not defaulted.
    """

    format: Literal["rollout-recovery-controller-state"] = "rollout-recovery-controller-state"
    version: int = CONTROLLER_STATE_VERSION
    #: The next step to train.
    step: int
    #: The trainer's weight version (what generation stamps new calls with).
    weight_version: int
    #: The highest weight version this run ever produced: versions after a restore
    #: continue above it, so one number never names two sets of weights.
    highest_weight_version: int
    #: Prompts taken from the dataloader so far (its cursor; moves with the ledger).
    prompts_taken: int
    #: Generation rounds each unfinished group has used (its retry budget); a round a
    #: crash interrupted is given back.
    rounds_used: dict[str, int]
    #: Per target step, how many of its groups were dropped (the sidecar's copy is
    #: NeMo-RL's ``batch_shortfall``).
    shortfall: dict[int, int]
    #: Consecutive trained steps without a single valid row (a run that only trains
    #: placeholders is stopped).
    steps_without_valid_rows: int
    #: The weight versions the current policy descends from, oldest first, itself last:
    #: what ``[recovery] reuse = "ancestors"`` keeps seals of.
    lineage: list[int]
    #: Totals over the whole run, for the summary.
    counters: RunCounters
    #: The job's configuration, as builtins, and its identity fingerprint.
    config: dict[str, Any]
    identity: str

    @classmethod
    def initial(cls, weight_version: int) -> ControllerState:
        """The state of a run that has done nothing yet, its policy at ``weight_version``."""
        return cls(
            step=0,
            weight_version=weight_version,
            highest_weight_version=weight_version,
            prompts_taken=0,
            rounds_used={},
            shortfall={},
            steps_without_valid_rows=0,
            lineage=[weight_version],
            counters=RunCounters(),
            config={},
            identity="",
        )

    def apply(self, record: records.HistoryRecord, *, rolled_back: bool = False) -> None:
        """Fold one history record into the state: the one place the state changes.

        Called by the one transition of each record (``_transitions.Transitions.apply``),
        which the live controller and a journal replay share, so both arrive at the same
        state. ``rolled_back`` marks a training step a restore undoes (its policy was
        lost): only its version is kept, so versions stay unique.
        """
        counters = self.counters
        match record:
            case records.PromptTaken():
                self.prompts_taken = record.position + 1
                counters.prompts_taken += 1
            case records.RoundStarted():
                self.rounds_used[record.group_id] = record.round
                counters.attempts += len(record.dispatched)
            case records.SiblingSealed():
                self._count_generated([record.seal])
            case records.GroupSealed():
                self._count_generated(record.seals)
            case records.AttemptsAbandoned():
                self._abandoned(record)
            case records.PromptDropped():
                self.shortfall[record.target_step] = self.shortfall.get(record.target_step, 0) + 1
                self.rounds_used.pop(record.group_id, None)
                counters.prompts_dropped += 1
            case records.GroupPublished():
                self.rounds_used.pop(record.group_id, None)
            case records.StepTrained():
                self.highest_weight_version = max(
                    self.highest_weight_version, record.weight_version
                )
                if not rolled_back:
                    self._train(record)
            case records.CheckpointCommitted():
                counters.checkpoints += 1
                counters.longest_checkpoint_hold_us = max(
                    counters.longest_checkpoint_hold_us, record.hold_us
                )
                counters.longest_checkpoint_stall_us = max(
                    counters.longest_checkpoint_stall_us, record.stall_us
                )
            case records.Restored():
                counters.siblings_reused += record.sealed_siblings_kept
            case records.BackendEvent(kind=_logprob_check.LOGPROB_MISMATCH, detail=detail):
                # Right after its step's step_trained, which reset the count of steps
                # without a valid row trained; the refusal carries the true count.
                self.steps_without_valid_rows = int(detail["steps_without_valid_rows"])
            case (
                records.RunStarted()
                | records.PromptAliased()
                | records.BatchAdmitted()
                | records.AttemptResumed()
                | records.BackendEvent()
            ):
                pass  # nothing the state keeps (the seal counts what a resume inherited)
            case _:
                assert_never(record)

    def _count_generated(self, seals: Sequence[records.Seal]) -> None:
        counters = self.counters
        for seal in seals:
            counters.tokens_generated += seal.tokens - seal.inherited_tokens
            counters.calls_resumed += seal.inherited_calls
            counters.tokens_resumed += seal.inherited_tokens

    def _abandoned(self, record: records.AttemptsAbandoned) -> None:
        if any(a.reason not in _NOT_RETRIES for a in record.attempts):
            self.counters.retries += 1
        elif record.attempts and self.rounds_used.get(record.group_id, 0) > 0:
            # A restart's, a drain's or a closed backend's abandons are not failures of
            # the work: the round goes back to the group's retry budget. Counted, every
            # kill that lands while a group generates would cost it a round, and a few
            # kills in a row would drop healthy prompts (and strand their step short).
            self.rounds_used[record.group_id] -= 1

    def _train(self, record: records.StepTrained) -> None:
        counters = self.counters
        self.step = record.step + 1
        self.weight_version = record.weight_version
        self.lineage.append(record.weight_version)
        self.shortfall = {s: n for s, n in self.shortfall.items() if s > record.step}
        self.steps_without_valid_rows = (
            0 if record.valid_rows else (self.steps_without_valid_rows + 1)
        )
        counters.prompts_trained += len(record.group_ids)
        counters.rows_trained += len(record.rows)
        counters.valid_rows_trained += record.valid_rows


def encode_controller_state(state: ControllerState) -> bytes:
    return msgspec.msgpack.encode(state)


class _Envelope(msgspec.Struct):
    """Just the format and version, read first so a newer file is named as such."""

    format: str = ""
    version: int = -1


def decode_controller_state(data: bytes) -> ControllerState:
    try:
        envelope = msgspec.msgpack.decode(data, type=_Envelope)
    except (msgspec.ValidationError, msgspec.DecodeError):
        envelope = _Envelope()
    if envelope.version not in (-1, CONTROLLER_STATE_VERSION):
        raise InvalidStateError(
            f"controller state version {envelope.version} is not supported "
            f"(expected {CONTROLLER_STATE_VERSION})",
            path="$.version",
        )
    try:
        state = msgspec.msgpack.decode(data, type=ControllerState)
    except msgspec.ValidationError as error:
        message, path = split_validation_path(str(error))
        raise InvalidStateError(f"invalid controller state: {message}", path=path) from None
    except msgspec.DecodeError as error:
        raise InvalidStateError(f"controller state is not MessagePack: {error}") from None
    if state.version != CONTROLLER_STATE_VERSION:
        raise InvalidStateError(
            f"controller state version {state.version} is not supported "
            f"(expected {CONTROLLER_STATE_VERSION})",
            path="$.version",
        )
    return state
