"""Round-trip property: every ledger the ledger state machine reaches survives both formats.

The ledger tests' ``LedgerMachine`` drives random operation sequences (valid and refused)
against a reference model. This subclass adds one invariant: whenever the ledger is
checkpoint-safe, its sidecar written in the native format and in ``.pt`` reads back to an
equal state, and the ledger restored from each file has an identical ``state_dict``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant
from sidecar_fixtures import CUT
from test_ledger_state_machine import LedgerMachine

from rollout_recovery import build_rollout_recovery_state
from rollout_recovery.checkpoint._sidecar_io import (
    decode_sidecar,
    encode_sidecar,
    validate_sidecar_state,
)


class SidecarRoundTripMachine(LedgerMachine):
    @invariant()
    def sidecar_round_trips_in_both_formats(self) -> None:
        if not self.checkpoint_safe():
            return
        try:
            expected = self.ledger.state_dict()
        except RuntimeError:
            return  # a restored group whose prompt is not rebound yet: not checkpointable
        state = build_rollout_recovery_state(
            self.ledger,
            batch_shortfall={len(self.model): 1},
            sampler_stamps_target_steps=bool(self.counter % 2),
        )
        for fmt in ("native", "pt"):
            detected, decoded = decode_sidecar(encode_sidecar(state, format=fmt))  # type: ignore[arg-type]
            assert detected == fmt
            assert decoded == state
            _, restored = validate_sidecar_state(decoded)
            for record in self.ledger.groups():
                restored.bind_runtime_prompt(CUT, record.group_id, record.runtime_prompt_payload)
            assert restored.state_dict() == expected
            assert restored.expected_staging_keys() == self.ledger.expected_staging_keys()


SidecarRoundTripMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestSidecarRoundTrip = pytest.mark.slow(SidecarRoundTripMachine.TestCase)
