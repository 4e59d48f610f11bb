"""The controller's own checkpoint file, beside the NeMo-RL-compatible sidecar.

The sidecar's schema is closed (NeMo-RL reads it), so what only the controller needs —
training step, dataloader cursor, retry budgets, audit-trail lengths, counters, the job's
configuration — goes in ``controller_state.msgpack``: a versioned msgspec Struct, decoded
strictly, so a damaged or foreign file is refused with the field path at fault.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..errors import InvalidStateError, split_validation_path

__all__ = [
    "CONTROLLER_STATE_FILE",
    "CONTROLLER_STATE_VERSION",
    "ControllerState",
    "decode_controller_state",
    "encode_controller_state",
]

CONTROLLER_STATE_FILE = "controller_state.msgpack"
CONTROLLER_STATE_VERSION = 1


class ControllerState(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Everything the controller needs to continue a run from a checkpoint."""

    format: Literal["rollout-recovery-controller-state"] = "rollout-recovery-controller-state"
    version: int = CONTROLLER_STATE_VERSION
    #: The next step to train; equals the trainer's weight version.
    step: int
    #: Prompts taken from the dataloader so far (its cursor; moves with the ledger).
    prompts_taken: int
    #: Generation rounds each unfinished group has used (its retry budget).
    rounds_used: dict[str, int]
    #: The audit files' lengths inside the checkpoint cut.
    audit_offsets: dict[str, int]
    #: Run counters (attempts, retries, drops, ...), so a resumed run reports totals.
    counters: dict[str, int]
    #: The job's configuration, as builtins, and its fingerprint.
    config: dict[str, Any]
    config_fingerprint: str


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
