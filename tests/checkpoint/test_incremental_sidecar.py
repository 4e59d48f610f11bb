"""IncrementalSidecar: a ledger's sidecar encoded again and again, re-encoding only the
groups it is told changed, is byte for byte the full encode (issue 28, item 5).

The state machine drives a ledger through random calls (reservations in shared admission
batches, dispatches, seals, abandons, retries, admissions, publishes into a canonical set,
drops, a finalization that makes the ledger uncheckpointable), tells the encoder the group
each call names, and compares every encode with ``SidecarFormat.encode_checkpoint``: the
same bytes, or the same refusal. The framing the native file is joined with (MessagePack
headers written by hand) is checked against msgspec's own at every size boundary.
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rollout_recovery import RolloutRecoveryLedger
from rollout_recovery.checkpoint import IncrementalSidecar, SidecarFormat, _native
from rollout_recovery.errors import RolloutRecoveryError
from rollout_recovery.rewards import CaptureRewardSettings


class _Cut:
    def require_live(self) -> None:
        return None


CUT = _Cut()
SIZES = [0, 1, 15, 16, 255, 256, 65535, 65536, 70000]


@pytest.mark.parametrize("size", SIZES)
def test_the_headers_are_msgspecs(size: int) -> None:
    encoder = msgspec.msgpack.Encoder()
    assert encoder.encode(b"\x00" * size).startswith(_native._bin_header(size))
    assert encoder.encode([None] * size) == _native._array_header(size) + b"\xc0" * size


@pytest.mark.parametrize("size", SIZES)
def test_the_envelope_is_msgspecs(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + b"\x07" * (size % 256)
    envelope = _native.NativeEnvelope(
        format=_native.FORMAT_NAME,
        format_version=_native.FORMAT_VERSION,
        writer_version=_native.__version__,
        checksum="sha256:" + hashlib.sha256(payload).hexdigest(),
        payload=payload,
    )
    assert _native._wrap(payload) == _native.MAGIC + msgspec.msgpack.encode(envelope)


FIELDS: dict[str, Any] = {
    "batch_shortfall": {2: 1},
    "sampler_stamps_target_steps": True,
    "reward_settings": CaptureRewardSettings(),
}


def _joined(file: Any) -> Any:
    return bytes(file) if isinstance(file, _native.NativeFileParts) else file


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "bytes", call()
    except RolloutRecoveryError as error:
        return type(error).__name__, str(error)


class IncrementalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = RolloutRecoveryLedger()
        self.sidecar = IncrementalSidecar(self.ledger)
        self.canonical: set[str] = set()
        self.taken = 0
        self.encodes = 0
        # What earlier encodes handed out (staging keys, file), with what it was then.
        self.handed_out: list[tuple[Any, frozenset[str]]] = []
        self.files_out: list[tuple[Any, bytes]] = []

    def _ids(self) -> list[str]:
        return [group.group_id for group in self.ledger.groups()]

    def _tell(self, group_id: str, call: Any) -> None:
        with contextlib.suppress(RolloutRecoveryError):
            call()  # a refused call changes nothing; telling is harmless
        self.sidecar.changed([group_id])

    @rule(
        admission=st.sampled_from(["A", "B", "C"]),
        size=st.integers(1, 3),
        admitted=st.booleans(),
    )
    def reserve(self, admission: str, size: int, admitted: bool) -> None:
        """Into one of three batches whose groups agree (reserved, admitted for step 0,
        for step 1), or (called by hand) a batch ``mixed`` whose groups need not."""
        group_id = f"g{self.taken:03d}"
        index = self.taken
        self.taken += 1
        if admission != "mixed":
            admitted, step = {"A": (False, None), "B": (True, 0), "C": (True, 1)}[admission]
        else:
            step = 2 if admitted else None
        self.ledger.reserve_group(
            CUT,
            prompt_id=str(index),
            prompt_payload={"idx": index, "task_name": None},
            expected_generations=size,
            target_step=step,
            start_weight_version=0,
            admitted=admitted,
            group_id=group_id,
            admission_id=admission,
        )
        self.sidecar.reserved(group_id)

    @rule(admission=st.just("A"))
    def admit(self, admission: str) -> None:
        """Every reserved group of a batch, as a ``batch_admitted`` does."""
        for group in self.ledger.groups():
            if group.admission_id == admission:
                group_id = group.group_id
                self._tell(
                    group_id,
                    lambda group_id=group_id: self.ledger.mark_group_admitted(
                        CUT, group_id, target_step=3, start_weight_version=1
                    ),
                )

    @precondition(lambda self: len(self.ledger) > 0)
    @rule(data=st.data())
    def dispatch(self, data: st.DataObject) -> None:
        group_id = data.draw(st.sampled_from(self._ids()))
        self._tell(group_id, lambda: self.ledger.mark_group_dispatched(CUT, group_id))

    def _dispatched(self) -> list[tuple[str, int]]:
        return [
            (group.group_id, sibling.generation_index)
            for group in self.ledger.groups()
            for sibling in group.siblings
            if sibling.current_attempt.status.value == "dispatched"
        ]

    @precondition(lambda self: len(self._dispatched()) > 0)
    @rule(data=st.data(), reward=st.sampled_from([0.0, 1.0, -0.5]))
    def seal(self, data: st.DataObject, reward: float) -> None:
        group_id, index = data.draw(st.sampled_from(self._dispatched()))
        gate = self.ledger.get_group(group_id).gate_rollout_id(index)
        self._tell(
            group_id,
            lambda: self.ledger.mark_sibling_sealed(
                CUT,
                group_id,
                generation_index=index,
                gate_rollout_id=gate,
                receipt={"rollout_id": gate, "manifest": [{"staging_key": f"{gate}/c0"}]},
                reward=reward,
                mask_sample=False,
            ),
        )

    @precondition(lambda self: len(self.ledger) > 0)
    @rule(data=st.data())
    def abandon_and_retry(self, data: st.DataObject) -> None:
        group_id = data.draw(st.sampled_from(self._ids()))
        self._tell(group_id, lambda: self.ledger.abandon_unsealed(CUT, group_id))
        self._tell(group_id, lambda: self.ledger.prepare_incomplete_retry(CUT, group_id))

    @precondition(lambda self: len(self.ledger) > 0)
    @rule(data=st.data(), discard=st.booleans())
    def publish(self, data: st.DataObject, discard: bool) -> None:
        """Into the canonical set; the ledger lets go of it now or later (in between the
        sidecar leaves it out)."""
        group_id = data.draw(st.sampled_from(self._ids()))
        self.canonical.add(group_id)
        if discard:
            self.ledger.discard_group(CUT, group_id)
        self.sidecar.changed([group_id])

    @precondition(lambda self: len(self.canonical) > 0)
    @rule(data=st.data())
    def unpublish(self, data: st.DataObject) -> None:
        """Out of the canonical set (trained, or never discarded from the ledger: then it
        is back in the sidecar at its old place, which the encoder cannot know)."""
        group_id = data.draw(st.sampled_from(sorted(self.canonical)))
        self.canonical.discard(group_id)
        self.sidecar.changed([group_id])

    @precondition(lambda self: len(self.ledger) > 0)
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        group_id = data.draw(st.sampled_from(self._ids()))
        self._tell(group_id, lambda: self.ledger.discard_group(CUT, group_id))

    @precondition(lambda self: len(self.ledger) > 0)
    @rule(data=st.data())
    def start_finalizing(self, data: st.DataObject) -> None:
        """A state no checkpoint may hold, until the group is dropped."""
        group_id = data.draw(st.sampled_from(self._ids()))
        self._tell(group_id, lambda: self.ledger.mark_finalization_started(CUT, group_id))

    @rule(format=st.sampled_from(["native", "native", "native", "pt"]))
    def encode(self, format: str) -> None:
        sidecar_format = SidecarFormat(format)
        fields = {**FIELDS, "canonical_group_ids": set(self.canonical)}
        whole = outcome(lambda: sidecar_format.encode_checkpoint(self.ledger, **fields))
        incremental = outcome(lambda: self.sidecar.encode_parts(sidecar_format, **fields))
        assert (incremental[0], _joined(incremental[1])) == whole
        if whole[0] == "bytes":
            staging = frozenset(self.ledger.expected_staging_keys())
            assert self.sidecar.expected_staging_keys() == staging
            assert frozenset(self.sidecar.staging_keys()) == staging
            # The keys handed out at an encode stay what they were through later ones.
            for kept, then in self.handed_out:
                assert frozenset(kept) == then
            self.handed_out = [*self.handed_out[-3:], (self.sidecar.staging_keys(), staging)]
            # So does the file: its parts are the encoder's groups, which it goes on changing.
            for file, then_bytes in self.files_out:
                assert bytes(file) == then_bytes
            self.files_out = [*self.files_out[-3:], (incremental[1], whole[1])]
        self.encodes += 1

    @invariant()
    def full_encodes_only_when_needed(self) -> None:
        assert self.sidecar.full_encodes <= self.encodes


IncrementalMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_incremental_machine = IncrementalMachine.TestCase


def test_an_unchanged_ledger_is_not_encoded_again() -> None:
    machine = IncrementalMachine()
    for admission in ("A", "A", "B"):
        machine.reserve(admission=admission, size=2, admitted=True)
    machine.encode("native")
    machine.encode("native")
    assert machine.sidecar.full_encodes == 1
    machine.encode("pt")  # cannot be incremental: a full encode, and the next native too
    machine.encode("native")
    assert machine.sidecar.full_encodes == 3


def test_a_group_back_from_the_canonical_set_takes_its_old_place() -> None:
    """Published but still in the ledger, then out of the canonical set again: the encoder
    cannot know where it goes (it never saw the ledger's order) and encodes in full."""
    machine = IncrementalMachine()
    for _ in range(3):
        machine.reserve(admission="B", size=2, admitted=True)
    machine.encode("native")
    machine.canonical.add("g000")
    machine.sidecar.changed(["g000"])
    machine.encode("native")  # left out
    machine.canonical.discard("g000")
    machine.sidecar.changed(["g000"])
    machine.encode("native")  # first again, as in a full encode
    assert machine.sidecar.full_encodes == 2


def test_a_batch_that_disagrees_is_refused_as_a_full_encode_refuses_it() -> None:
    machine = IncrementalMachine()
    machine.reserve(admission="mixed", size=2, admitted=False)
    machine.reserve(admission="B", size=2, admitted=True)
    machine.encode("native")
    machine.reserve(admission="mixed", size=2, admitted=True)  # admitted, its peer is not
    machine.encode("native")  # the same refusal (asserted inside)
    machine.admit("mixed")  # both admitted for the same step: agreed again
    machine.encode("native")
    assert machine.sidecar.full_encodes == 3


class _CountingSha256:
    """``hashlib`` for ``_native``, counting the bytes its SHA-256 objects are fed."""

    def __init__(self) -> None:
        self.hashed = 0

    def sha256(self, data: bytes = b"") -> Any:
        counter, real = self, hashlib.sha256(data)
        counter.hashed += len(data)

        class Counted:
            def update(self, more: bytes) -> None:
                counter.hashed += len(more)
                real.update(more)

            def hexdigest(self) -> str:
                return real.hexdigest()

        return Counted()


def test_the_parts_are_the_cached_groups_checksummed_only_when_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An incremental encode hands out the file as its parts: the cached groups themselves
    (not joined into a copy) and no SHA-256 yet. The writer's walk over the parts computes
    the checksum, over the payload once, and yields exactly the full encode's bytes."""
    machine = IncrementalMachine()
    for admission in ("A", "B", "B", "C"):
        machine.reserve(admission=admission, size=2, admitted=True)
    fields = {**FIELDS, "canonical_group_ids": set()}
    machine.sidecar.encode(SidecarFormat.NATIVE, **fields)  # fills the cache
    machine.sidecar.changed(["g001"])
    counting = _CountingSha256()
    monkeypatch.setattr(_native, "hashlib", counting)
    file = machine.sidecar.encode_parts(SidecarFormat.NATIVE, **fields)
    assert isinstance(file, _native.NativeFileParts)
    assert counting.hashed == 0  # nothing proportional to the file before it is written
    cached = [value for _, value in machine.sidecar._fragments.items()]
    parts = list(file.parts())
    groups = parts[2:-1]  # after the file's head, and the frame's start with the array header
    assert len(groups) == len(cached) and all(map(operator.is_, groups, cached))
    payload = sum(map(len, parts[1:]))
    assert counting.hashed == payload
    monkeypatch.undo()
    assert b"".join(parts) == SidecarFormat.NATIVE.encode_checkpoint(machine.ledger, **fields)
    assert bytes(file) == b"".join(file.parts())  # the parts can be walked again


class _Drawn:
    """``st.data()`` for a rule called by hand: draws ``value``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def draw(self, strategy: Any, label: Any = None) -> Any:
        return self.value


def test_staging_keys_handed_out_stay_as_they_were() -> None:
    """A snapshot keeps the groups' staging-key lists, not a set: seals after it (the same
    group's siblings) must not reach into the keys it holds."""
    machine = IncrementalMachine()
    machine.reserve(admission="B", size=3, admitted=True)
    machine.dispatch(_Drawn("g000"))
    for index in range(3):
        machine.seal(_Drawn(("g000", index)), 1.0)
        machine.encode("native")  # asserts every earlier handed-out set is unchanged
    assert [len(then) for _, then in machine.handed_out] == [1, 2, 3]
    assert machine.sidecar.full_encodes == 1
