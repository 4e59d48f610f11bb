"""Stateful property test: random operation sequences against an obviously-correct model.

The model is plain data: per group its granularity, phase, status and, per sibling, the list
of attempts (uuid, status, and the seal for a sealed attempt). It is written from the seed's
transition tables (reference §3) independently of the implementation: gate ids are derived
from the model's own uuids, staging keys from the model's own receipts. Invalid operations
are attempted too; each must raise the seed's exception type with the seed's message start and
change nothing. After every step the ledger must agree with the model, and its state must
round-trip through ``from_state_dict`` whenever it is checkpoint-safe.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)
from ledger_support import CUT, DEAD, DEAD_CUT_MESSAGE, payload, snapshot

from rollout_recovery import (
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    SiblingSealResult,
)

SEALED = "sealed"
UNSAFE = {"finalizing", "finalization_unknown"}


@dataclasses.dataclass
class Attempt:
    uuid: uuid.UUID
    status: str = "reserved"
    seal: tuple[dict[str, Any] | None, float, bool] | None = None  # receipt, reward, mask


@dataclasses.dataclass
class Group:
    idx: int
    granularity: str
    phase: str
    status: str
    target_step: int | None
    start_weight_version: int
    siblings: list[list[Attempt]]

    def current(self, index: int) -> Attempt:
        return self.siblings[index][-1]

    def currents(self) -> list[Attempt]:
        return [attempts[-1] for attempts in self.siblings]

    def all_sealed(self) -> bool:
        return all(a.status == SEALED for a in self.currents())


def gate(group_id: str, index: int, attempt: Attempt) -> str:
    return f"{group_id}_g{index}_a{attempt.uuid.hex}"


def receipt_for(gate_id: str, n_keys: int | None) -> dict[str, Any] | None:
    if n_keys is None:
        return None
    return {
        "rollout_id": gate_id,
        "manifest": [{"staging_key": f"{gate_id}/c{k}"} for k in range(n_keys)],
    }


def keys_of(receipt: dict[str, Any] | None) -> list[str]:
    return [] if receipt is None else [entry["staging_key"] for entry in receipt["manifest"]]


class Refused(Exception):
    """The model's verdict: this call must raise ``error`` with a message starting ``text``."""

    def __init__(self, error: type[BaseException], text: str) -> None:
        super().__init__(text)
        self.error = error
        self.text = text


CHOICE = st.integers(0, 2**16)
RECEIPT_KEYS = st.one_of(st.none(), st.integers(0, 2))
REWARDS = st.sampled_from([0.0, 1.0, -2.0, 0.5, 1])


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = RolloutRecoveryLedger()
        self.model: dict[str, Group] = {}
        self.counter = 0

    # ---------------------------------------------------------------------------- plumbing

    def expect(self, call: Callable[[], Any], verdict: Callable[[], Any]) -> Any:
        """Run the model's verdict; if it refuses, the call must refuse and change nothing."""
        try:
            apply = verdict()
        except Refused as refusal:
            event(f"refused: {refusal.text.split(chr(39))[0][:40]}")
            before = snapshot(self.ledger)
            try:
                call()
            except refusal.error as error:
                assert re.match(re.escape(refusal.text), str(error)), (
                    f"message {str(error)!r} does not start with {refusal.text!r}"
                )
            else:
                raise AssertionError(f"expected {refusal.error.__name__}: {refusal.text}")
            assert snapshot(self.ledger) == before, "a refused call changed ledger state"
            return None
        event("accepted")
        result = call()
        if apply is not None:
            apply(result)
        return result

    def require(self, group_id: str) -> Group:
        if group_id not in self.model:
            raise Refused(ValueError, f"unknown recovery group_id={group_id!r}")
        return self.model[group_id]

    def require_index(self, group_id: str, group: Group, index: int) -> None:
        if not 0 <= index < len(group.siblings):
            raise Refused(ValueError, f"generation_index={index} is outside group {group_id!r}")

    def gid(self, choice: int) -> str:
        """Mostly a live group; sometimes an id the ledger never owned or already dropped."""
        live = list(self.model)
        if not live or choice % 10 == 0:
            return f"grp{choice % (self.counter + 2)}" if choice % 20 else "nope"
        return live[choice % len(live)]

    def checkpoint_safe(self) -> bool:
        return not any(g.status in UNSAFE for g in self.model.values())

    def unsafe_ids(self) -> list[str]:
        return [gid for gid, g in self.model.items() if g.status in UNSAFE]

    # ---------------------------------------------------------------------------- rules

    @rule(
        admitted=st.booleans(),
        granularity=st.sampled_from(["sibling", "prompt_group"]),
        n=st.integers(1, 4),
        target_step=st.one_of(st.none(), st.integers(0, 5)),
    )
    def reserve(self, admitted: bool, granularity: str, n: int, target_step: int | None) -> None:
        self.counter += 1
        group_id = f"grp{self.counter}"
        record = self.ledger.reserve_group(
            CUT,
            prompt_id=str(self.counter),
            prompt_payload=payload(self.counter),
            expected_generations=n,
            target_step=target_step,
            start_weight_version=self.counter,
            recovery_granularity=RecoveryGranularity(granularity),
            admitted=admitted,
            group_id=group_id,
        )
        self.model[group_id] = Group(
            idx=self.counter,
            granularity=granularity,
            phase="admitted" if admitted else "reserved",
            status="generating",
            target_step=target_step,
            start_weight_version=self.counter,
            siblings=[[Attempt(s.current_attempt.attempt_uuid)] for s in record.siblings],
        )

    def reserve_duplicate(self, choice: int) -> None:
        group_id = self.gid(choice)

        def verdict() -> None:
            if group_id in self.model:
                raise Refused(ValueError, f"duplicate recovery group_id={group_id!r}")
            raise Refused(ValueError, "prompt_id must not be empty")

        self.expect(
            lambda: self.ledger.reserve_group(
                CUT,
                prompt_id="" if group_id not in self.model else "1",
                prompt_payload=payload(1),
                expected_generations=1,
                target_step=None,
                start_weight_version=0,
                group_id=group_id,
            ),
            verdict,
        )

    @rule(choice=CHOICE, target_step=st.one_of(st.none(), st.integers(0, 5)))
    def admit(self, choice: int, target_step: int | None) -> None:
        self.admit_id(self.gid(choice), target_step)

    def admit_id(self, group_id: str, target_step: int | None) -> None:

        def verdict() -> Callable[[Any], None]:
            group = self.require(group_id)
            if group.phase != "reserved":
                raise Refused(ValueError, f"recovery group {group_id!r} is already admitted")

            def apply(_: Any) -> None:
                group.phase = "admitted"
                group.target_step = target_step
                group.start_weight_version = 100

            return apply

        self.expect(
            lambda: self.ledger.mark_group_admitted(
                CUT, group_id, target_step=target_step, start_weight_version=100
            ),
            verdict,
        )

    @rule(
        choice=CHOICE,
        indices=st.one_of(st.none(), st.lists(st.integers(-1, 4), max_size=4, unique=True)),
    )
    def dispatch(self, choice: int, indices: list[int] | None) -> None:
        self.dispatch_indices(self.gid(choice), indices)

    def dispatch_indices(self, group_id: str, indices: list[int] | None) -> None:

        def verdict() -> Callable[[Any], None]:
            group = self.require(group_id)
            if group.phase != "admitted":
                raise Refused(ValueError, f"cannot dispatch unadmitted recovery group {group_id!r}")
            if group.status != "generating":
                raise Refused(
                    ValueError, f"cannot dispatch group {group_id!r} from {group.status!r}"
                )
            selected = list(range(len(group.siblings))) if indices is None else indices
            for index in selected:
                self.require_index(group_id, group, index)
            if any(group.current(i).status != "reserved" for i in selected):
                raise Refused(ValueError, "only reserved rollout attempts may be dispatched")

            def apply(_: Any) -> None:
                for index in selected:
                    group.current(index).status = "dispatched"

            return apply

        self.expect(
            lambda: self.ledger.mark_group_dispatched(CUT, group_id, generation_indices=indices),
            verdict,
        )

    @rule(
        choice=CHOICE,
        index=CHOICE,
        n_keys=RECEIPT_KEYS,
        reward=REWARDS,
        mask=st.booleans(),
    )
    def seal_sibling(
        self, choice: int, index: int, n_keys: int | None, reward: float, mask: bool
    ) -> None:
        group_id = self.gid(choice)
        group = self.model.get(group_id)
        # mostly an existing sibling, sometimes one past the end
        index = index % (len(group.siblings) + 1) if group else index % 3
        self.seal_sibling_id(group_id, index, n_keys, reward, mask)

    def seal_sibling_id(
        self, group_id: str, index: int, n_keys: int | None, reward: float, mask: bool
    ) -> None:
        group = self.model.get(group_id)
        in_range = group is not None and 0 <= index < len(group.siblings)
        gate_id = gate(group_id, index, group.current(index)) if group and in_range else "none"
        receipt = receipt_for(gate_id, n_keys)

        def verdict() -> Callable[[Any], None] | None:
            group = self.require(group_id)
            if group.granularity == "prompt_group":
                raise Refused(
                    ValueError, "prompt-group recovery must seal every sibling atomically"
                )
            self.require_index(group_id, group, index)
            attempt = group.current(index)
            logical = f"{group_id}_g{index}"
            if attempt.status == SEALED:
                if attempt.seal == (receipt, float(reward), mask):
                    return None
                raise Refused(ValueError, f"conflicting duplicate seal for {logical!r}")
            if attempt.status != "dispatched":
                raise Refused(
                    ValueError,
                    f"cannot seal logical rollout {logical!r} from status {attempt.status!r}",
                )

            def apply(_: Any) -> None:
                attempt.status = SEALED
                attempt.seal = (receipt, float(reward), mask)
                if group.all_sealed():
                    group.status = "ready_to_finalize"

            return apply

        self.expect(
            lambda: self.ledger.mark_sibling_sealed(
                CUT,
                group_id,
                generation_index=index,
                gate_rollout_id=gate_id,
                receipt=receipt,
                reward=reward,
                mask_sample=mask,
            ),
            verdict,
        )

    def reseal_identically(self, choice: int, index: int) -> None:
        group = self.model.get(self.gid(choice))
        self._reseal_identically_id(self.gid(choice), index % len(group.siblings) if group else 0)

    def _reseal_identically_id(self, group_id: str, index: int) -> None:
        group = self.model.get(group_id)
        if group is None or group.granularity != "sibling" or index >= len(group.siblings):
            return
        attempt = group.current(index)
        if attempt.status != SEALED or attempt.seal is None:
            return
        receipt, reward, mask = attempt.seal
        before = snapshot(self.ledger)
        self.ledger.mark_sibling_sealed(
            CUT,
            group_id,
            generation_index=index,
            gate_rollout_id=gate(group_id, index, attempt),
            receipt=None if receipt is None else dict(receipt),
            reward=reward,
            mask_sample=mask,
        )
        assert snapshot(self.ledger) == before, "an identical duplicate seal must be a no-op"

    def reseal_conflicting(self, choice: int, index: int) -> None:
        group = self.model.get(self.gid(choice))
        self._reseal_conflicting_id(self.gid(choice), index % len(group.siblings) if group else 0)

    def _reseal_conflicting_id(self, group_id: str, index: int) -> None:
        group = self.model.get(group_id)
        if group is None or group.granularity != "sibling" or index >= len(group.siblings):
            return
        attempt = group.current(index)
        if attempt.status != SEALED or attempt.seal is None:
            return
        receipt, reward, mask = attempt.seal

        def verdict() -> None:
            raise Refused(ValueError, f"conflicting duplicate seal for '{group_id}_g{index}'")

        self.expect(
            lambda: self.ledger.mark_sibling_sealed(
                CUT,
                group_id,
                generation_index=index,
                gate_rollout_id=gate(group_id, index, attempt),
                receipt=receipt,
                reward=reward,
                mask_sample=not mask,
            ),
            verdict,
        )

    def seal_with_a_stale_or_wrong_gate(self, choice: int, index: int) -> None:
        group_id = self.gid(choice)
        group = self.model.get(group_id)
        index = index % len(group.siblings) if group else 0
        if group is None or index >= len(group.siblings):
            return
        attempts = group.siblings[index]
        wrong = gate(group_id, index, attempts[-2]) if len(attempts) > 1 else f"{group_id}_wrong"
        expected = gate(group_id, index, attempts[-1])

        def verdict() -> None:
            if group.granularity == "prompt_group":
                raise Refused(
                    ValueError, "prompt-group recovery must seal every sibling atomically"
                )
            raise Refused(
                ValueError,
                f"streamed rollout identity mismatch: result={wrong!r}, expected={expected!r}",
            )

        self.expect(
            lambda: self.ledger.mark_sibling_sealed(
                CUT,
                group_id,
                generation_index=index,
                gate_rollout_id=wrong,
                receipt=None,
                reward=0.0,
                mask_sample=True,
            ),
            verdict,
        )

    @rule(
        choice=CHOICE,
        missing=st.sets(st.integers(0, 3), max_size=2),
        n_keys=st.integers(0, 2),
        drop_one=st.booleans(),
    )
    def seal_group(self, choice: int, missing: set[int], n_keys: int, drop_one: bool) -> None:
        self.seal_group_ids(self.gid(choice), missing, n_keys, drop_one)

    def seal_group_ids(self, group_id: str, missing: set[int], n_keys: int, drop_one: bool) -> None:
        group = self.model.get(group_id)
        results: dict[int, SiblingSealResult] = {}
        if group is not None:
            for index in range(len(group.siblings)):
                gate_id = gate(group_id, index, group.current(index))
                results[index] = SiblingSealResult(
                    gate_rollout_id=gate_id,
                    receipt=receipt_for(gate_id, None if index in missing else n_keys),
                    reward=float(index),
                    mask_sample=index in missing,
                )
            if drop_one:
                results.pop(len(group.siblings) - 1)

        def verdict() -> Callable[[Any], None]:
            group = self.require(group_id)
            if group.granularity != "prompt_group":
                raise Refused(
                    ValueError, "atomic group sealing requires prompt-group recovery granularity"
                )
            if group.status != "generating":
                raise Refused(
                    ValueError, f"cannot seal group {group_id!r} from status {group.status!r}"
                )
            expected = list(range(len(group.siblings)))
            if sorted(results) != expected:
                raise Refused(
                    ValueError,
                    "prompt-group seal requires every logical sibling exactly once: "
                    f"expected={expected}, actual={sorted(results)}",
                )
            for index, attempt in enumerate(group.currents()):
                if attempt.status != "dispatched":
                    raise Refused(
                        ValueError,
                        f"cannot seal logical rollout '{group_id}_g{index}' "
                        f"from status {attempt.status!r}",
                    )

            def apply(_: Any) -> None:
                for index, attempt in enumerate(group.currents()):
                    result = results[index]
                    attempt.status = SEALED
                    attempt.seal = (result.receipt, result.reward, result.mask_sample)
                group.status = "ready_to_finalize"

            return apply

        self.expect(lambda: self.ledger.mark_group_sealed(CUT, group_id, results), verdict)

    @staticmethod
    def _abandon_entire(group: Group) -> None:
        for attempt in group.currents():
            attempt.status = "abandoned"
            attempt.seal = None
        group.status = "generating"

    def _abandon(self, group: Group) -> None:
        if group.granularity == "prompt_group" and group.status == "generating":
            self._abandon_entire(group)
            return
        for attempt in group.currents():
            if attempt.status != SEALED:
                attempt.status = "abandoned"
        group.status = "ready_to_finalize" if group.all_sealed() else "generating"

    @rule(choice=CHOICE)
    def abandon_unsealed(self, choice: int) -> None:
        self.abandon_unsealed_id(self.gid(choice))

    def abandon_unsealed_id(self, group_id: str) -> None:

        def verdict() -> Callable[[Any], None]:
            group = self.require(group_id)
            if group.status not in {"generating", "ready_to_finalize"}:
                raise Refused(
                    ValueError, f"cannot abandon group {group_id!r} from {group.status!r}"
                )
            return lambda _: self._abandon(group)

        self.expect(lambda: self.ledger.abandon_unsealed(CUT, group_id), verdict)

    @rule(choice=CHOICE)
    def retry(self, choice: int) -> None:
        self.retry_id(self.gid(choice))

    def retry_id(self, group_id: str) -> None:

        def verdict() -> Callable[[Any], None]:
            group = self.require(group_id)
            if group.status != "generating":
                raise Refused(
                    ValueError, f"cannot retry group {group_id!r} from status {group.status!r}"
                )
            statuses = [a.status for a in group.currents()]
            retryable = {"abandoned", "failed"}
            if (
                group.granularity == "prompt_group"
                and any(s in retryable for s in statuses)
                and not all(s in retryable for s in statuses)
            ):
                raise Refused(
                    ValueError,
                    "prompt-group retry requires every sibling attempt to be abandoned "
                    "or failed together",
                )
            renew: list[int] = []
            for index, status in enumerate(statuses):
                if (group.granularity == "sibling" and status == SEALED) or status == "reserved":
                    continue
                if status not in retryable:
                    raise Refused(
                        ValueError,
                        f"cannot retry logical rollout '{group_id}_g{index}' "
                        f"from status {status!r}",
                    )
                renew.append(index)

            def apply(record: Any) -> None:
                for index in renew:
                    new = record.siblings[index].current_attempt
                    assert new.status is RolloutAttemptStatus.RESERVED
                    group.siblings[index].append(Attempt(new.attempt_uuid))

            return apply

        self.expect(lambda: self.ledger.prepare_incomplete_retry(CUT, group_id), verdict)

    def finalization_started(self, choice: int) -> None:
        self.finalization_started_id(self.gid(choice))

    def finalization_started_id(self, group_id: str) -> None:

        def verdict() -> Callable[[Any], None]:
            group = self.require(group_id)
            if group.status != "ready_to_finalize":
                raise Refused(
                    ValueError,
                    f"cannot start finalization group {group_id!r} from {group.status!r}",
                )
            return lambda _: setattr(group, "status", "finalizing")

        self.expect(lambda: self.ledger.mark_finalization_started(CUT, group_id), verdict)

    def finalization_unknown(self, choice: int) -> None:
        group_id = self.gid(choice)

        def verdict() -> Callable[[Any], None]:
            group = self.require(group_id)
            if group.status != "finalizing":
                raise Refused(
                    ValueError,
                    f"cannot mark finalization unknown group {group_id!r} from {group.status!r}",
                )
            return lambda _: setattr(group, "status", "finalization_unknown")

        self.expect(lambda: self.ledger.mark_finalization_unknown(CUT, group_id), verdict)

    def discard(self, choice: int) -> None:
        group_id = self.gid(choice)

        def verdict() -> Callable[[Any], None]:
            self.require(group_id)
            return lambda _: self.model.pop(group_id)

        self.expect(lambda: self.ledger.discard_group(CUT, group_id), verdict)

    def discard_canonical(self, chosen: list[int], bogus: bool) -> None:
        ids = {self.gid(c) for c in chosen} | ({"not-owned"} if bogus else set())
        owned = ids & set(self.model)
        assert self.ledger.discard_canonical_groups(CUT, ids) == len(owned)
        for group_id in owned:
            del self.model[group_id]

    def bind_same_identity(self, choice: int) -> None:
        group_id = self.gid(choice)

        def verdict() -> None:
            self.require(group_id)

        self.expect(
            lambda: self.ledger.bind_runtime_prompt(
                CUT, group_id, payload(self.model[group_id].idx if group_id in self.model else 0)
            ),
            verdict,
        )

    def bind_wrong_identity(self, choice: int) -> None:
        group_id = self.gid(choice)

        def verdict() -> None:
            group = self.require(group_id)
            raise Refused(
                ValueError,
                f"recovery group {group_id!r} resolved sample_id={group.idx + 1000}; "
                f"expected '{group.idx}'",
            )

        idx = self.model[group_id].idx + 1000 if group_id in self.model else 0
        self.expect(lambda: self.ledger.bind_runtime_prompt(CUT, group_id, payload(idx)), verdict)

    def dead_cut(self, operation: str, choice: int) -> None:
        group_id = self.gid(choice)
        calls: dict[str, Callable[[], Any]] = {
            "dispatch": lambda: self.ledger.mark_group_dispatched(DEAD, group_id),
            "abandon": lambda: self.ledger.abandon_unsealed(DEAD, group_id),
            "retry": lambda: self.ledger.prepare_incomplete_retry(DEAD, group_id),
            "discard": lambda: self.ledger.discard_group(DEAD, group_id),
            "discard_canonical": lambda: self.ledger.discard_canonical_groups(DEAD, {group_id}),
            "restart": lambda: self.ledger.prepare_for_restart(DEAD),
            "start": lambda: self.ledger.mark_finalization_started(DEAD, group_id),
            "admit": lambda: self.ledger.mark_group_admitted(
                DEAD, group_id, target_step=None, start_weight_version=0
            ),
        }

        def verdict() -> None:
            raise Refused(RuntimeError, DEAD_CUT_MESSAGE)

        self.expect(calls[operation], verdict)

    @initialize(
        groups=st.lists(
            st.tuples(
                st.booleans(), st.sampled_from(["sibling", "prompt_group"]), st.integers(1, 4)
            ),
            min_size=1,
            max_size=3,
        )
    )
    def start_with_groups(self, groups: list[tuple[bool, str, int]]) -> None:
        for admitted, granularity, n in groups:
            self.reserve(admitted, granularity, n, None)

    @rule(
        choice=CHOICE,
        index=CHOICE,
        n_keys=RECEIPT_KEYS,
        mask=st.booleans(),
        steps=st.integers(1, 8),
    )
    def progress(self, choice: int, index: int, n_keys: int | None, mask: bool, steps: int) -> None:
        """Advance one live group up to ``steps`` moves along the happy path.

        Uniformly random operations mostly get refused; this rule reaches deep states (sealed
        siblings, retries with kept seals, ready groups) often enough to test them.
        """
        if not self.model:
            return
        group_id = list(self.model)[choice % len(self.model)]
        for step in range(steps):
            group = self.model.get(group_id)
            if group is None:
                return
            statuses = [a.status for a in group.currents()]
            n = len(statuses)
            pick = index + step
            if group.phase == "reserved":
                self.admit_id(group_id, 1)
            elif group.status == "generating" and "reserved" in statuses:
                reserved = [i for i, s in enumerate(statuses) if s == "reserved"]
                subset = reserved if pick % 3 else reserved[: 1 + pick % len(reserved)]
                self.dispatch_indices(group_id, subset)
            elif group.status == "generating" and group.granularity == "prompt_group":
                if all(s == "dispatched" for s in statuses):
                    missing = {pick % n} if pick % 4 == 0 else set()
                    self.seal_group_ids(group_id, missing, 1 + pick % 2, False)
                else:
                    self.retry_id(group_id)
            elif group.status != "generating" and group.granularity == "sibling" and pick % 3:
                # duplicate deliveries of a sealed sibling: identical is a no-op, else refused
                self.reseal_for(group_id, pick % len(statuses), identical=pick % 3 == 1)
                if group.status == "ready_to_finalize":
                    self.abandon_unsealed_id(group_id)  # keeps a ready group ready
                return
            elif group.status == "generating":
                sealed = [i for i, s in enumerate(statuses) if s == SEALED]
                if group.granularity == "sibling" and sealed and pick % 4 == 3:
                    self.reseal_for(group_id, sealed[pick % len(sealed)], identical=pick % 2 == 0)
                dispatched = [i for i, s in enumerate(statuses) if s == "dispatched"]
                if dispatched and pick % 5 == 4:
                    self.abandon_unsealed_id(group_id)  # a worker died
                elif dispatched:
                    target = dispatched[pick % len(dispatched)]
                    self.seal_sibling_id(group_id, target, n_keys, 1.0, mask)
                else:
                    self.retry_id(group_id)
            elif group.status == "ready_to_finalize" and pick % 6 == 0:
                self.finalization_started_id(group_id)
            else:
                return

    @rule(choice=CHOICE, unknown=st.booleans())
    def finalize(self, choice: int, unknown: bool) -> None:
        if unknown:
            self.finalization_unknown(choice)
        else:
            self.finalization_started(choice)

    @rule(choice=CHOICE, canonical=st.booleans(), chosen=st.lists(CHOICE, max_size=3))
    def drop(self, choice: int, canonical: bool, chosen: list[int]) -> None:
        if canonical:
            self.discard_canonical(chosen, bool(choice % 2))
        else:
            self.discard(choice)

    @rule(
        kind=st.sampled_from(["identical", "conflicting", "stale_gate"]),
        choice=CHOICE,
        index=CHOICE,
    )
    def reseal(self, kind: str, choice: int, index: int) -> None:
        {
            "identical": self.reseal_identically,
            "conflicting": self.reseal_conflicting,
            "stale_gate": self.seal_with_a_stale_or_wrong_gate,
        }[kind](choice, index)

    @rule(
        kind=st.sampled_from(["reserve_duplicate", "bind_same", "bind_wrong", "dead_cut"]),
        choice=CHOICE,
        operation=st.sampled_from(
            [
                "dispatch",
                "abandon",
                "retry",
                "discard",
                "discard_canonical",
                "restart",
                "start",
                "admit",
            ]
        ),
    )
    def misuse(self, kind: str, choice: int, operation: str) -> None:
        if kind == "reserve_duplicate":
            self.reserve_duplicate(choice)
        elif kind == "bind_same":
            self.bind_same_identity(choice)
        elif kind == "bind_wrong":
            self.bind_wrong_identity(choice)
        else:
            self.dead_cut(operation, choice)

    def reseal_for(self, group_id: str, index: int, *, identical: bool) -> None:
        if identical:
            self._reseal_identically_id(group_id, index)
        else:
            self._reseal_conflicting_id(group_id, index)

    def _rebind(self, ledger: RolloutRecoveryLedger) -> None:
        for group_id, group in self.model.items():
            ledger.bind_runtime_prompt(CUT, group_id, payload(group.idx))

    @rule(kind=st.sampled_from(["from_state_dict", "load_state_dict", "restart"]))
    def checkpoint(self, kind: str) -> None:
        if kind == "restart":
            self.restart()
        else:
            self.checkpoint_round_trip(kind == "load_state_dict")

    def checkpoint_round_trip(self, via_load: bool) -> None:
        if not self.checkpoint_safe():
            self._expect_unsafe(self.ledger.state_dict)
            return
        state = self.ledger.state_dict()
        if via_load:
            restored = RolloutRecoveryLedger()
            restored.load_state_dict(CUT, state)
        else:
            restored = RolloutRecoveryLedger.from_state_dict(state)
        assert all(g.runtime_prompt_payload is None for g in restored.groups())
        self._rebind(restored)
        assert restored.state_dict() == state
        self.ledger = restored

    def restart(self) -> None:
        if not self.checkpoint_safe():
            self._expect_unsafe(self.ledger.state_dict)
            self._expect_unsafe(lambda: self.ledger.prepare_for_restart(CUT))
            return
        restored = RolloutRecoveryLedger()
        restored.load_state_dict(CUT, self.ledger.state_dict())
        restored.prepare_for_restart(CUT)
        self._rebind(restored)
        for group in self.model.values():
            if group.status == "generating":
                if group.granularity == "prompt_group":
                    self._abandon_entire(group)
                else:
                    self._abandon(group)
        self.ledger = restored

    def _expect_unsafe(self, call: Callable[[], Any]) -> None:
        def verdict() -> None:
            raise Refused(
                RuntimeError,
                "rollout recovery contains checkpoint-unsafe group states: "
                f"groups={self.unsafe_ids()!r}",
            )

        self.expect(call, verdict)

    # ---------------------------------------------------------------------------- invariants

    @invariant()
    def ledger_matches_model(self) -> None:
        records = self.ledger.groups()
        assert [r.group_id for r in records] == list(self.model)
        assert len(self.ledger) == len(self.model)
        for record in records:
            group = self.model[record.group_id]
            assert record.group_id in self.ledger
            assert record.recovery_granularity is RecoveryGranularity(group.granularity)
            assert record.phase is PromptGroupPhase(group.phase)
            assert record.status is PromptGroupStatus(group.status)
            assert record.target_step == group.target_step
            assert record.start_weight_version == group.start_weight_version
            assert record.expected_generations == len(group.siblings)
            assert record.prompt_id == str(group.idx)
            for index, (sibling, attempts) in enumerate(
                zip(record.siblings, group.siblings, strict=True)
            ):
                assert sibling.generation_index == index
                assert [a.attempt_uuid for a in sibling.attempts] == [a.uuid for a in attempts]
                assert [a.status.value for a in sibling.attempts] == [a.status for a in attempts]
                current, expected = sibling.current_attempt, attempts[-1]
                assert record.gate_rollout_id(index) == gate(record.group_id, index, expected)
                if expected.status == SEALED:
                    assert expected.seal is not None
                    receipt, reward, mask = expected.seal
                    assert current.receipt == receipt
                    assert current.reward == reward and current.mask_sample is mask
                    assert current.staging_keys == keys_of(receipt)
                elif current.status is RolloutAttemptStatus.ABANDONED and (
                    group.granularity == "prompt_group"
                ):
                    assert current.receipt is None and current.staging_keys == []
            assert record.sealed_generation_indices == [
                i for i, a in enumerate(group.currents()) if a.status == SEALED
            ]

    @invariant()
    def note_coverage(self) -> None:
        for group in self.model.values():
            if group.status != "generating":
                event(f"reached {group.granularity} {group.status}")
            sealed = sum(a.status == SEALED for a in group.currents())
            if group.status == "generating" and sealed:
                event(f"reached {group.granularity} generating with a sealed sibling")
            if any(len(attempts) > 1 for attempts in group.siblings):
                event(f"reached {group.granularity} retried")
                if sealed:
                    event(f"reached {group.granularity} retried with a kept seal")

    @invariant()
    def staging_keys_match_model(self) -> None:
        expected = {
            key
            for group in self.model.values()
            for attempt in group.currents()
            if attempt.status == SEALED and attempt.seal is not None
            for key in keys_of(attempt.seal[0])
        }
        assert self.ledger.expected_staging_keys() == expected

    @invariant()
    def state_round_trips_when_checkpoint_safe(self) -> None:
        if not self.checkpoint_safe():
            return
        state = self.ledger.state_dict()
        restored = RolloutRecoveryLedger.from_state_dict(state)
        assert restored.groups() == [
            dataclasses.replace(record, runtime_prompt_payload=None)
            for record in self.ledger.groups()
        ]


LedgerMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLedgerStateMachine = pytest.mark.slow(LedgerMachine.TestCase)
