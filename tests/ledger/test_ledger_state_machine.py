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

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
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


group_ids = Bundle("group_ids")
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

    def checkpoint_safe(self) -> bool:
        return not any(g.status in UNSAFE for g in self.model.values())

    def unsafe_ids(self) -> list[str]:
        return [gid for gid, g in self.model.items() if g.status in UNSAFE]

    # ---------------------------------------------------------------------------- rules

    @rule(
        target=group_ids,
        admitted=st.booleans(),
        granularity=st.sampled_from(["sibling", "prompt_group"]),
        n=st.integers(1, 4),
        target_step=st.one_of(st.none(), st.integers(0, 5)),
    )
    def reserve(self, admitted: bool, granularity: str, n: int, target_step: int | None) -> str:
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
        return group_id

    @rule(group_id=group_ids)
    def reserve_duplicate(self, group_id: str) -> None:
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

    @rule(group_id=group_ids, target_step=st.one_of(st.none(), st.integers(0, 5)))
    def admit(self, group_id: str, target_step: int | None) -> None:
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
        group_id=group_ids,
        indices=st.one_of(st.none(), st.lists(st.integers(-1, 4), max_size=4, unique=True)),
    )
    def dispatch(self, group_id: str, indices: list[int] | None) -> None:
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
        group_id=group_ids,
        index=st.integers(0, 4),
        n_keys=RECEIPT_KEYS,
        reward=REWARDS,
        mask=st.booleans(),
    )
    def seal_sibling(
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

    @rule(group_id=group_ids, index=st.integers(0, 3))
    def reseal_identically(self, group_id: str, index: int) -> None:
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

    @rule(group_id=group_ids, index=st.integers(0, 3))
    def reseal_conflicting(self, group_id: str, index: int) -> None:
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

    @rule(group_id=group_ids, index=st.integers(0, 3))
    def seal_with_a_stale_or_wrong_gate(self, group_id: str, index: int) -> None:
        group = self.model.get(group_id)
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
        group_id=group_ids,
        missing=st.sets(st.integers(0, 3), max_size=2),
        n_keys=st.integers(0, 2),
        drop_one=st.booleans(),
    )
    def seal_group(self, group_id: str, missing: set[int], n_keys: int, drop_one: bool) -> None:
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

    @rule(group_id=group_ids)
    def abandon_unsealed(self, group_id: str) -> None:
        def verdict() -> Callable[[Any], None]:
            group = self.require(group_id)
            if group.status not in {"generating", "ready_to_finalize"}:
                raise Refused(
                    ValueError, f"cannot abandon group {group_id!r} from {group.status!r}"
                )
            return lambda _: self._abandon(group)

        self.expect(lambda: self.ledger.abandon_unsealed(CUT, group_id), verdict)

    @rule(group_id=group_ids)
    def retry(self, group_id: str) -> None:
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

    @rule(group_id=group_ids)
    def finalization_started(self, group_id: str) -> None:
        def verdict() -> Callable[[Any], None]:
            group = self.require(group_id)
            if group.status != "ready_to_finalize":
                raise Refused(
                    ValueError,
                    f"cannot start finalization group {group_id!r} from {group.status!r}",
                )
            return lambda _: setattr(group, "status", "finalizing")

        self.expect(lambda: self.ledger.mark_finalization_started(CUT, group_id), verdict)

    @rule(group_id=group_ids)
    def finalization_unknown(self, group_id: str) -> None:
        def verdict() -> Callable[[Any], None]:
            group = self.require(group_id)
            if group.status != "finalizing":
                raise Refused(
                    ValueError,
                    f"cannot mark finalization unknown group {group_id!r} from {group.status!r}",
                )
            return lambda _: setattr(group, "status", "finalization_unknown")

        self.expect(lambda: self.ledger.mark_finalization_unknown(CUT, group_id), verdict)

    @rule(group_id=group_ids)
    def discard(self, group_id: str) -> None:
        def verdict() -> Callable[[Any], None]:
            self.require(group_id)
            return lambda _: self.model.pop(group_id)

        self.expect(lambda: self.ledger.discard_group(CUT, group_id), verdict)

    @rule(chosen=st.lists(group_ids, max_size=3), bogus=st.booleans())
    def discard_canonical(self, chosen: list[str], bogus: bool) -> None:
        ids = set(chosen) | ({"not-owned"} if bogus else set())
        owned = ids & set(self.model)
        assert self.ledger.discard_canonical_groups(CUT, ids) == len(owned)
        for group_id in owned:
            del self.model[group_id]

    @rule(group_id=group_ids)
    def bind_same_identity(self, group_id: str) -> None:
        def verdict() -> None:
            self.require(group_id)

        self.expect(
            lambda: self.ledger.bind_runtime_prompt(
                CUT, group_id, payload(self.model[group_id].idx if group_id in self.model else 0)
            ),
            verdict,
        )

    @rule(group_id=group_ids)
    def bind_wrong_identity(self, group_id: str) -> None:
        def verdict() -> None:
            group = self.require(group_id)
            raise Refused(
                ValueError,
                f"recovery group {group_id!r} resolved sample_id={group.idx + 1000}; "
                f"expected '{group.idx}'",
            )

        idx = self.model[group_id].idx + 1000 if group_id in self.model else 0
        self.expect(lambda: self.ledger.bind_runtime_prompt(CUT, group_id, payload(idx)), verdict)

    @rule(
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
        group_id=group_ids,
    )
    def dead_cut(self, operation: str, group_id: str) -> None:
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

    def _rebind(self, ledger: RolloutRecoveryLedger) -> None:
        for group_id, group in self.model.items():
            ledger.bind_runtime_prompt(CUT, group_id, payload(group.idx))

    @rule(via_load=st.booleans())
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

    @rule()
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
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLedgerStateMachine = LedgerMachine.TestCase
